"""The requantize of a block of a product's int32 sums into channels-last bytes, as an LLVM IR
function a kernel's module holds (`BlockRequantize`): run on each block of sums as soon as the
product has made them, while they lie in L1, so that no sums reach memory and no pass of its
own reads them again. AMX's direct convolution (`gemm_int8_direct_ir`) and VNNI's tiles
(`gemm_int8_ir`, fused) call it. Its arithmetic is `int8_conv._requantize`'s step for step in
float32, so the bytes are the NumPy path's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import llvmlite.ir as ir

from engine.kernels.gemm_int8_ir import I8, I32, I64, LANES, for_each_run
from engine.kernels.task_ir import carrying_loop, masked_load, masked_store, splat, when

F32 = ir.FloatType()

ROUND_NEAREST = 8  # vcvtps2dq's embedded rounding: to nearest even, exceptions suppressed
# How the requantize meets the rounded value's bounds (`saturation`): two clamps in float32,
# or one (the top) and the signed conversion to bytes for a low bound of -128, or one (the
# bottom) and the unsigned conversion for a top bound of 255.
SATURATE_NONE, SATURATE_SIGNED, SATURATE_UNSIGNED = 0, 1, 2
SATURATIONS = (SATURATE_NONE, SATURATE_SIGNED, SATURATE_UNSIGNED)
# The requantize terms' field the task reads for its split (`int8_conv.rows_first`).
ROWS_FIRST_FIELD = 13
# The terms' fields of the grid the sum rows run over: its width and the output's, its
# height and the output's. Where a stride-1 layer's tiles run on along the padded image's
# rows ("wide rows", `int8_conv.FusedConv`), a sum row is the window at every pixel of the
# padded image, and those past the output's columns or rows are computed and dropped;
# otherwise the grid is one row as wide as the sums (each sum row its output position).
WIDE_FIELDS = (14, 15, 16, 17)


def saturation(low: float, top: float) -> int:
    """The `SATURATIONS` entry for a rounded value clamped to the integers ``[low, top]``
    and stored as its low byte: a saturating conversion to bytes stores the same bytes
    without one of the clamps where that bound is the conversion's own (-128 with a top
    of 127 or less, signed; 255 with a bottom of 0 or more, unsigned)."""
    if low == -128 and top <= 127:
        return SATURATE_SIGNED
    if top == 255 and low >= 0:
        return SATURATE_UNSIGNED
    return SATURATE_NONE



def for_each_share(builder: ir.IRBuilder, function: ir.Function, terms: ir.Value,
                   row_blocks: ir.Value, panels: ir.Value, part: ir.Value, parts: ir.Value,
                   call: Callable[..., None]) -> None:
    """Emit part ``part``'s calls over a requantizing product's (panel, row block) tiles as
    its ``terms`` ask (`ROWS_FIRST_FIELD`, the caller's choice: `int8_conv.rows_first`): a
    run of the row blocks, every panel of each (``call(0, first block, blocks, panels)``;
    a part may get none where there are fewer blocks than parts), else a run of the tiles
    cut panel by panel as `gemm_int8_ir.for_each_run` cuts them."""
    by_rows = builder.icmp_unsigned("!=", builder.load(
        builder.gep(terms, [I64(ROWS_FIRST_FIELD)])), I64(0))
    with builder.if_else(by_rows) as (rows_first, panels_first):
        with rows_first:
            start = builder.sdiv(builder.mul(row_blocks, part), parts)
            end = builder.sdiv(builder.mul(row_blocks, builder.add(part, I64(1))), parts)
            with builder.if_then(builder.icmp_signed("<", start, end)):
                call(I64(0), start, builder.sub(end, start), panels)
        with panels_first:
            for_each_run(builder, function, row_blocks, panels, part, parts, call)

class BlockRequantize:
    """``requantize`` defined in ``module`` (`function`), with the intrinsics it calls."""

    def __init__(self, module: ir.Module) -> None:
        self.module = module
        self.vector = ir.VectorType(I32, LANES)
        self.floats = ir.VectorType(F32, LANES)
        self.bytes = ir.VectorType(I8, LANES)
        self.masked_load = masked_load(self.module, self.bytes, "i8")
        self.masked_store = masked_store(self.module, self.bytes, "i8")
        self.round_to_words = ir.Function(self.module, ir.FunctionType(self.vector, [
            self.floats, self.vector, ir.IntType(16), I32]),
            name="llvm.x86.avx512.mask.cvtps2dq.512")
        # vpmovusdb: int32 words to bytes with unsigned saturation (a word past 255, or
        # vcvtps2dq's 0x80000000 for a value past int32, read as unsigned, becomes 255)
        self.saturate_unsigned = ir.Function(self.module, ir.FunctionType(self.bytes, [
            self.vector, self.bytes, ir.IntType(16)]), name="llvm.x86.avx512.mask.pmovus.db.512")
        # vpmovsdb: int32 words to bytes with signed saturation (below -128 to -128)
        self.saturate_signed = ir.Function(self.module, ir.FunctionType(self.bytes, [
            self.vector, self.bytes, ir.IntType(16)]), name="llvm.x86.avx512.mask.pmovs.db.512")
        self.prefetch = _declared(module, "llvm.prefetch.p0", ir.FunctionType(
            ir.VoidType(), [I8.as_pointer(), I32, I32, I32]))
        self.function = self._define_requantize()

    def _define_requantize(self) -> ir.Function:
        """``requantize(corner, ldc, column, first_row, count, terms, factors, offsets,
        offsets_high)``: rows [first_row, first_row + count) of a chunk (their sums from
        ``corner``, ``ldc`` int32 apart; columns ``column`` to ``column + 32``, the two vectors
        of column offsets not yet added) requantized as `int8_conv._requantize` does, step
        for step in float32, into channels-last bytes; rows from ``terms``' valid count on
        are left alone. ``terms`` (int64): the output and residual addresses, the bias
        (int32) and scales (float32, both padded to whole panels), the filters, the valid
        rows, whether the residual is signed, its row stride (0: no residual), and whether
        every sum plus its bias stays inside int32 (nonzero: they are added in int32, else in
        int64), then a second output's address (0: none; uint8) and its per-channel scales
        and shifts (float32, padded to whole panels; read whether or not there is one), then
        how the rounded value meets its bounds (`saturation`), then whether the task shares
        out the row blocks rather than the panels (nonzero: rows; the caller's choice,
        `int8_conv.rows_first`); ``factors`` (float32): the
        activation's bounds, the residual's scale, and the bounds of the rounded value
        without a residual and with one (`int8_conv.folded_bounds`: the clamps after the last
        sum folded into one).

        The second output is what `int8_affine`'s pass would make of the first (ResNet v2's
        next BatchNorm and relu of a residual sum, `int8_conv.Rescaled`): each byte just
        written, as its integer, times its channel's scale plus its shift in float32 (one
        product, one sum), rounded half to even and saturated, channels-last; the pass then
        reads none of the first output's bytes again."""
        word, wide, real = I32.as_pointer(), I64.as_pointer(), F32.as_pointer()
        kind = ir.FunctionType(ir.VoidType(), [word, I64, I64, I64, I64, wide, real,
                                               self.vector, self.vector])
        function = ir.Function(self.module, kind, name="requantize")
        function.linkage = "internal"
        corner, ldc, column, first_row, count, terms, factors, *offsets = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        byte = I8.as_pointer()
        (out, residual, bias, scales, filters, valid, signed, residual_stride,
         narrow_flag, rescaled, rescale_factors, rescale_shifts,
         saturation) = (builder.load(builder.gep(terms, [I64(index)])) for index in range(13))
        out, residual = builder.inttoptr(out, byte), builder.inttoptr(residual, byte)
        bias, scales = builder.inttoptr(bias, word), builder.inttoptr(scales, real)
        has_rescaled = builder.icmp_unsigned("!=", rescaled, I64(0))
        rescaled = builder.inttoptr(rescaled, byte)
        rescale_factors = builder.inttoptr(rescale_factors, real)
        rescale_shifts = builder.inttoptr(rescale_shifts, real)
        bounds = [splat(builder, builder.load(builder.gep(factors, [I64(index)])), self.floats)
                  for index in range(7)]
        act_low, act_top, residual_scale, alone_low, alone_top, summed_low, summed_top = bounds
        zero = ir.Constant(self.floats, [0.0] * LANES)
        # The rounded value's bounds are integers (`int8_conv.folded_bounds`): clamping before
        # rounding to them gives the bytes of rounding first, so one conversion that rounds
        # (``vcvtps2dq``) takes the place of ``vrndscaleps`` (two µops) and ``vcvttps2dq``.
        indices = ir.VectorType(I64, LANES)
        lanes = ir.Constant(indices, list(range(LANES)))
        halves = []
        for half in range(2):
            at = builder.add(column, I64(half * LANES))
            mask = builder.icmp_signed("<", builder.add(splat(builder, at, indices), lanes),
                                       splat(builder, filters, indices))
            shift = builder.add(builder.sext(builder.load(builder.bitcast(
                builder.gep(bias, [at]), self.vector.as_pointer()), align=4), indices),
                builder.sext(offsets[half], indices))
            factor = builder.load(builder.bitcast(builder.gep(scales, [at]),
                                                  self.floats.as_pointer()), align=4)
            # the second output's per-channel scale and shift (padded to whole panels too;
            # read only where there is a second output)
            rescale = [builder.load(builder.bitcast(builder.gep(array, [at]),
                                                    self.floats.as_pointer()), align=4)
                       for array in (rescale_factors, rescale_shifts)]
            halves.append((at, mask, shift, factor, rescale))
        is_signed = builder.icmp_unsigned("!=", signed, I64(0))
        last = builder.add(first_row, count)
        last = builder.select(builder.icmp_signed("<", valid, last), valid, last)
        # One row loop for each of (residual or none, sums in int32 or int64, and with a
        # residual: an activation before the sum or none, the residual signed or not),
        # chosen once: a layer without a residual adds nothing (its zero row's 0.0 changes
        # no byte), where every sum plus its bias stays inside int32 the add and the
        # conversion to float32 take one vector each, not two (the same integer, the same
        # rounding), and a clamp to the two infinities changes nothing. Where the sums stay
        # in int32 and there is no second output, also one for each `saturation`: the
        # epilogue is bound by its vector operations (on one thread it takes about as long
        # as the layer's AMX products, and the two do not overlap), and a bound met by the
        # conversion to bytes is one operation fewer for every 16 values.
        residual_bytes = builder.icmp_unsigned("!=", residual_stride, I64(0))
        narrow = builder.icmp_unsigned("!=", narrow_flag, I64(0))
        act_clamps = builder.or_(
            builder.fcmp_ordered("!=", builder.extract_element(act_low, I32(0)),
                                 ir.Constant(F32, float("-inf"))),
            builder.fcmp_ordered("!=", builder.extract_element(act_top, I32(0)),
                                 ir.Constant(F32, float("inf"))))
        choice = builder.zext(narrow, I64)
        for flag, weight in ((residual_bytes, 2), (builder.and_(residual_bytes, act_clamps), 4),
                             (builder.and_(residual_bytes, is_signed), 8), (has_rescaled, 16)):
            choice = builder.add(choice, builder.mul(builder.zext(flag, I64), I64(weight)))
        # a saturating conversion only for sums in int32 without a second output (the
        # loops there are the common ones; the others clamp both bounds)
        saturating = builder.select(builder.and_(narrow, builder.not_(has_rescaled)),
                                    saturation, I64(SATURATE_NONE))
        choice = builder.add(choice, builder.mul(saturating, I64(32)))
        # wide rows (the grid wider than the output): loops of their own, so that the
        # others map no row (on one thread 3-13% of an epilogue-bound layer's time)
        wide = [builder.load(builder.gep(terms, [I64(index)])) for index in WIDE_FIELDS]
        on_wide_rows = builder.icmp_signed("!=", wide[0], wide[1])
        choice = builder.add(choice, builder.mul(builder.zext(on_wide_rows, I64), I64(128)))
        second_half = builder.icmp_signed("<", builder.add(column, I64(LANES)), filters)
        done = function.append_basic_block("rows_done")
        variants = {}
        for with_residual in (True, False):
            for in_int32 in (True, False):
                for clamped in (True, False) if with_residual else (False,):
                    for signed_summand in (True, False) if with_residual else (False,):
                        for second in (True, False):
                            for mode in SATURATIONS if in_int32 and not second else \
                                    (SATURATE_NONE,):
                                for gridded in (False, True):
                                    variants[with_residual, in_int32, clamped, signed_summand,
                                             second, mode, gridded] = \
                                        function.append_basic_block("rows")
        switch = builder.switch(choice, done)
        for key, block in variants.items():
            switch.add_case(I64(key[1] + 2 * key[0] + 4 * key[2] + 8 * key[3] + 16 * key[4]
                                + 32 * key[5] + 128 * key[6]), block)
        for (with_residual, in_int32, clamped, signed_summand, second, mode, gridded), block \
                in variants.items():
            builder.position_at_end(block)
            start = self._first_place(builder, first_row, wide) if gridded else []
            with carrying_loop(builder, function, first_row, last, "row",
                               carried=start) as rows:
                sum_row = row = rows.index
                kept_row = nullcontext()
                if gridded:
                    row, kept, following = self._output_row(builder, rows.carried, wide)
                    rows.carry(following)
                    kept_row = when(builder, function, kept, "kept_row")
                kept_row.__enter__()
                line = builder.gep(corner, [builder.mul(builder.sub(sum_row, first_row), ldc)])
                self._prefetch_ahead(builder, row, count, column, out, filters,
                                     residual if with_residual else None, residual_stride)
                if second:
                    self._prefetch_ahead(builder, row, count, column, rescaled, filters,
                                         None, residual_stride)
                for half, (at, mask, shift, factor, rescale) in enumerate(halves):
                    # the panel's second half only where a filter lies there (a layer of
                    # 16 filters: none; the branch is the same for the whole loop)
                    with (builder.if_then(second_half) if half else nullcontext()):
                        sums = builder.load(builder.bitcast(builder.gep(line, [I64(half * LANES)]),
                                                            self.vector.as_pointer()), align=4)
                        if in_int32:
                            exact = builder.add(sums, builder.trunc(shift, self.vector))
                        else:
                            exact = builder.add(builder.sext(sums, indices), shift)
                        value = builder.fmul(builder.sitofp(exact, self.floats), factor)
                        if with_residual:
                            if clamped:
                                value = self._clamp(builder, value, act_low, act_top)
                            summand = builder.call(self.masked_load, [
                                builder.bitcast(builder.gep(residual, [builder.add(
                                    builder.mul(row, residual_stride), at)]),
                                    self.bytes.as_pointer()),
                                I32(1), mask, ir.Constant(self.bytes, [0] * LANES)])
                            convert = builder.sitofp if signed_summand else builder.uitofp
                            value = builder.fadd(value, builder.fmul(residual_scale, convert(
                                summand, self.floats)))
                        low, top = (summed_low, summed_top) if with_residual else (alone_low,
                                                                                    alone_top)
                        place = builder.add(builder.mul(row, filters), at)
                        target = builder.bitcast(builder.gep(out, [place]),
                                                 self.bytes.as_pointer())
                        if mode != SATURATE_NONE:
                            self._store_saturated(builder, value, low, top, mode, target, mask)
                            continue
                        words = self._round(builder, self._clamp(builder, value, low, top))
                        builder.call(self.masked_store, [
                            builder.trunc(words, self.bytes), target, I32(1), mask])
                        if second:
                            # the byte just written, read back as the next pass would read
                            # it (the output's integer: its dtype is the rounded value's),
                            # then that pass's x · scale[c] + shift[c], rounded, saturated
                            again = builder.fadd(builder.fmul(
                                builder.sitofp(words, self.floats), rescale[0]), rescale[1])
                            # uint8: from 0 in float32, to 255 by the saturating conversion
                            again = builder.select(builder.fcmp_ordered(">", again, zero),
                                                   again, zero)
                            builder.call(self.masked_store, [
                                builder.call(self.saturate_unsigned, [
                                    self._round(builder, again),
                                    ir.Constant(self.bytes, [0] * LANES),
                                    ir.Constant(ir.IntType(16), -1)]),
                                builder.bitcast(builder.gep(rescaled, [place]),
                                                self.bytes.as_pointer()), I32(1), mask])
                kept_row.__exit__(None, None, None)
            builder.branch(done)
        builder.position_at_end(done)
        builder.ret_void()
        return function

    @staticmethod
    def _first_place(builder: ir.IRBuilder, first_row: ir.Value, wide: list[ir.Value]
                     ) -> list[ir.Value]:
        """Where sum row ``first_row`` lies in the grid of wide rows (`WIDE_FIELDS`): its
        column, row and image there (divisions made once a call, not once a row)."""
        grid_width, _, grid_height, _ = wide
        image = builder.sdiv(first_row, builder.mul(grid_width, grid_height))
        within = builder.sub(first_row, builder.mul(image, builder.mul(grid_width,
                                                                          grid_height)))
        y = builder.sdiv(within, grid_width)
        return [builder.sub(within, builder.mul(y, grid_width)), y, image]

    @staticmethod
    def _output_row(builder: ir.IRBuilder, place: list[ir.Value], wide: list[ir.Value]
                    ) -> tuple[ir.Value, ir.Value, list[ir.Value]]:
        """For a sum row at ``place`` (column, row, image in the grid of wide rows): its
        output position, whether it is one (not a column or row past the output's), and the
        next sum row's place."""
        grid_width, width, grid_height, height = wide
        x, y, image = place
        kept = builder.and_(builder.icmp_signed("<", x, width),
                            builder.icmp_signed("<", y, height))
        row = builder.add(builder.mul(builder.add(builder.mul(image, height), y), width), x)
        x = builder.add(x, I64(1))
        wraps = builder.icmp_signed("==", x, grid_width)
        x = builder.select(wraps, I64(0), x)
        y = builder.select(wraps, builder.add(y, I64(1)), y)
        turns = builder.icmp_signed("==", y, grid_height)
        return row, kept, [x, builder.select(turns, I64(0), y),
                           builder.select(turns, builder.add(image, I64(1)), image)]

    def _store_saturated(self, builder: ir.IRBuilder, value: ir.Value, low: ir.Value,
                         top: ir.Value, mode: int, target: ir.Value, mask: ir.Value) -> None:
        """``value`` clamped to ``[low, top]``, rounded, its bytes stored at ``target`` where
        ``mask`` holds, with one of the clamps done by the conversion to bytes that saturates
        (`saturation` says which): -128 by the signed one, 255 by the unsigned one. A value
        past int32 converts to 0x80000000, which either conversion saturates the right way
        here (the signed one to -128, and past the other clamp, the unsigned one to 255)."""
        if mode == SATURATE_SIGNED:
            value = builder.select(builder.fcmp_ordered("<", value, top), value, top)
            narrowing = self.saturate_signed
        else:
            value = builder.select(builder.fcmp_ordered(">", value, low), value, low)
            narrowing = self.saturate_unsigned
        narrowed = builder.call(narrowing, [self._round(builder, value), ir.Constant(
            self.bytes, [0] * LANES), ir.Constant(ir.IntType(16), -1)])
        builder.call(self.masked_store, [narrowed, target, I32(1), mask])

    def _prefetch_ahead(self, builder: ir.IRBuilder, row: ir.Value, count: ir.Value,
                        column: ir.Value, out: ir.Value, filters: ir.Value,
                        residual: ir.Value | None, residual_stride: ir.Value) -> None:
        """The line of row ``row + count`` (the next row block's) under this panel's columns
        asked for: the output's for writing (``prefetchw``), the residual's for reading.
        Each row of a block touches a line 1-4 lines past the last row's, a pattern the
        hardware prefetchers follow poorly; the lines of the block after arrive while this
        one is requantized (one thread, from out of L2, in turn with the kernel before:
        ResNet-50 v2's 64 → 256 1×1 with its residual at 56² 0.30-0.33 → 0.28 ms, 128 → 512
        at 28² 0.19-0.21 → 0.17; more where other cores load the memory)."""
        ahead = builder.add(row, count)
        # a write (1) or read (0), kept in every level of cache (3), of data (1); a line
        # past the array's end is never read (a prefetch never faults)
        builder.call(self.prefetch, [builder.gep(out, [builder.add(
            builder.mul(ahead, filters), column)]), I32(1), I32(3), I32(1)])
        if residual is not None:
            builder.call(self.prefetch, [builder.gep(residual, [builder.add(
                builder.mul(ahead, residual_stride), column)]), I32(0), I32(3), I32(1)])

    def _round(self, builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
        """``value`` rounded half to even to int32 words by one conversion (its bounds were
        clamped to integers before, so no lane overflows)."""
        return builder.call(self.round_to_words, [
            value, ir.Constant(self.vector, [0] * LANES), ir.Constant(ir.IntType(16), -1),
            I32(ROUND_NEAREST)])

    @staticmethod
    def _clamp(builder: ir.IRBuilder, value: ir.Value, low: ir.Value,
               high: ir.Value) -> ir.Value:
        """``min(max(value, low), high)`` as `int8_conv._requantize` takes it."""
        value = builder.select(builder.fcmp_ordered(">", value, low), value, low)
        return builder.select(builder.fcmp_ordered("<", value, high), value, high)


def _declared(module: ir.Module, name: str, kind: ir.FunctionType) -> ir.Function:
    """``name`` in ``module``: the declaration already there (a kernel's own), else a new one."""
    existing = module.globals.get(name)
    return existing if existing is not None else ir.Function(module, kind, name=name)
