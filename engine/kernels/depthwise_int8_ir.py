"""The LLVM IR of the quantized 3×3 depthwise window over a channels-last uint8 image,
requantized into int8/uint8 as it stores: `int8_depthwise`'s one-pass form, 16 channels to a
vector.

``int8_depthwise_3x3_s1`` and ``int8_depthwise_3x3_s2`` (stride 1 and 2 on both axes, no
dilation), and their ``_folded`` forms (the bias already in the shift), are `spin_pool` tasks
``(context, part, parts)`` over the output rows of every image (N · OH). ``context`` holds
int64s (`FIELDS`): the image's address ((N, H, W, C) uint8), the output's ((N · OH · OW, C)
bytes), the taps' ((9, C) float32, a tap's weights for every channel in a row), the shift's
((C,) float32: the signed data's compensation, and folded, the bias with it), the bias's
((C,) int32; a folded task reads none), the scales' ((C,) float32), a zero row's (W · C
bytes), then N, C, H, W, the pad (0 or 1 on both axes), OH, OW, the output positions whose
window lies inside the row, and the clamp's bounds as float64 bits.

The image is the data itself (pad 1) or the padded copy `int8_conv` lays (pad 0, its border
already there). With pad 1 the padding is never read: a window row above or below the image
reads the zero row, the left padding column is zeros made in registers, and the one window
at most that reaches into the right padding is taken after the row's others with its third
column zeros.

A row is walked one block of 16 channels at a time, the block's taps, shift, bias and scale
held in registers along it. Each padded column a window reads is loaded (16 bytes), widened
and converted to float32 once per output row and kept in registers for the next output
position(s) that read it: two of a window's three columns carry on at stride 1, one at stride
2, so an output vector converts three or six columns, not nine. The channels past the last
whole block go through masked loads and stores.

The arithmetic is `int8_depthwise._window_3x3`'s (and so the NumPy path's) to the bit: the
products and sums in float32 are exact integers (below 2²⁴), fused multiply-adds included;
the sum made an int32 and the bias added as one (the bind keeps the bias where that cannot
overflow), converted to float32 once (rounded as float32(float64 sum) rounds), times the
scale, clamped (the activation's and the saturation's bounds in one), rounded half to even
by the conversion to int32 (its rounding named in the instruction), and stored as its low
byte. A folded task starts each sum from the shift and bias together, which the bind allows
only where every partial sum stays below 2²⁴ in magnitude: the float32 sum is then the same
exact integer, and the int32 round trip is left out.

Two variants, chosen when the module is built (`module`): with AVX-512 BW, 16 channels to a
vector and the rounding named in ``vcvtps2dq``, as above. Without it, 16 channels to a
vector too (two ymm of float32: on Zen 3 up to a third less time than one from 28² down,
whatever the spills of registers), and the rounding by ``llvm.rint`` in the default rounding
mode (half to even, as the numba window's own rounding), then ``fptosi``: generic LLVM
operations, the same bytes. Its nine products go into independent sums added at the end
(`GENERIC_CHAINS`), not one chain of nine multiply-adds: each sum and partial sum is an exact
integer below 2²⁴ whatever the order, so the total is the same float32 (on Zen 3, MobileNet
v2's layers at batch 1 take 0.92-0.96 of one chain's time, summed). A block of the channels'
tail reads its bytes through masks, which LLVM expands lane by lane where the host has no
masked byte load; the whole blocks read plainly.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.task_ir import (
    F32,
    I1,
    I32,
    I64,
    as_float,
    carrying_loop,
    fields,
    loop,
    masked_load,
    masked_store,
    splat,
    task,
    when,
)

LANES = 16
GENERIC_LANES = 16  # channels a vector without AVX-512: two ymm of float32
TAPS = 9
FIELDS = ("source", "target", "taps", "shift", "bias", "scales", "zeros", "images",
          "channels", "height", "width", "pad", "out_h", "out_w", "inside", "low", "high")
STRIDES = (1, 2)
# The generic variant's sums by stride: each a list of the window's (row, column) products it
# adds, the first from the shift on, the others from their first product. Stride 1 splits the
# nine products in reading order into five and four; stride 2, whose three columns are all
# converted anew at each position, sums each column apart (the fastest of the splits tried on
# Zen 3: rows, columns, 4 + 5, 5 + 4, 6 + 3 by column).
GENERIC_CHAINS = {
    1: (((0, 0), (0, 1), (0, 2), (1, 0), (1, 1)), ((1, 2), (2, 0), (2, 1), (2, 2))),
    2: tuple(tuple((row, column) for row in range(3)) for column in range(3)),
}
I8 = ir.IntType(8)
NEAREST = 8  # an AVX-512 conversion's rounding: to nearest, ties to even, no exceptions


def task_name(stride: int, folded: bool = False) -> str:
    """The task's function name for ``stride``; ``folded``: the bias comes in the shift."""
    return f"int8_depthwise_3x3_s{stride}" + ("_folded" if folded else "")


def module(avx512: bool | None = None) -> ir.Module:
    """A module holding the task of every stride in `STRIDES`, with the bias added as an
    int32 and folded into the shift: the AVX-512 variant where ``avx512`` (by default, where
    the host has AVX-512 BW), else the generic one."""
    if avx512 is None:
        from engine.cpu import host_features

        avx512 = host_features.has("avx512bw")
    built = ir.Module(name="hybridserve_int8_depthwise")
    kernel = _Kernel(built, avx512)
    for stride in STRIDES:
        for folded in (False, True):
            kernel.define(stride, folded)
    return built


class _Kernel:
    def __init__(self, built: ir.Module, avx512: bool) -> None:
        self.module = built
        self.lanes = lanes = LANES if avx512 else GENERIC_LANES
        self.floats = ir.VectorType(F32, lanes)
        self.words = ir.VectorType(I32, lanes)
        self.bytes = ir.VectorType(I8, lanes)
        self.indices = ir.VectorType(I64, lanes)
        self.fmuladd = ir.Function(built, ir.FunctionType(self.floats, [self.floats] * 3),
                                   name=f"llvm.fmuladd.v{lanes}f32")
        self.load_bytes = masked_load(built, self.bytes, "i8")
        self.store_bytes = masked_store(built, self.bytes, "i8")
        self.load_floats = masked_load(built, self.floats, "f32")
        self.load_words = masked_load(built, self.words, "i32")
        self.everyone = ir.Constant(ir.VectorType(I1, lanes), [1] * lanes)
        if avx512:
            self.to_nearest = ir.Function(built, ir.FunctionType(
                self.words, [self.floats, self.words, ir.IntType(16), I32]),
                name="llvm.x86.avx512.mask.cvtps2dq.512")
            self.rint = None
        else:
            self.to_nearest = None
            self.rint = ir.Function(built, ir.FunctionType(self.floats, [self.floats]),
                                    name=f"llvm.rint.v{lanes}f32")

    def define(self, stride: int, folded: bool = False) -> None:
        function, builder, context, part, parts = task(self.module, task_name(stride, folded))
        field = fields(builder, context, FIELDS)
        field["folded"] = folded
        field["stride"] = stride
        field["bounds"] = [splat(builder, as_float(builder, field[name]), self.floats)
                           for name in ("low", "high")]
        field["target"] = builder.inttoptr(field["target"], I8.as_pointer())
        for name in ("taps", "shift", "scales"):
            field[name] = builder.inttoptr(field[name], F32.as_pointer())
        field["bias"] = builder.inttoptr(field["bias"], I32.as_pointer())
        lines = builder.mul(field["out_h"], field["images"])
        first = builder.sdiv(builder.mul(part, lines), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), lines), parts)
        with loop(builder, function, first, last, "line") as line:
            self._line(builder, function, field, line, stride)
        builder.ret_void()

    def _line(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
              line: Any, stride: int) -> None:
        channels, width, pad = field["channels"], field["width"], field["pad"]
        image = builder.sdiv(line, field["out_h"])
        y = builder.sub(line, builder.mul(image, field["out_h"]))
        top = builder.sub(builder.mul(y, I64(stride)), pad)
        # Each window row's address less ``pad`` columns, so that column j (of the padded
        # row) lies j · C on; a row above or below the image reads the zero row instead.
        behind = builder.mul(pad, channels)
        starts = []
        for r in range(3):
            row = builder.add(top, I64(r))
            inside = builder.and_(builder.icmp_signed(">=", row, I64(0)),
                                  builder.icmp_signed("<", row, field["height"]))
            at = builder.add(field["source"], builder.mul(builder.add(
                builder.mul(image, field["height"]), row), builder.mul(width, channels)))
            start = builder.select(inside, at, field["zeros"])
            starts.append(builder.inttoptr(builder.sub(start, behind), I8.as_pointer()))
        written = builder.gep(field["target"], [
            builder.mul(builder.mul(line, field["out_w"]), channels)])
        line_field = dict(field, starts=starts, written=written)
        block_lanes = I64(self.lanes)
        whole = builder.sdiv(channels, block_lanes)
        with loop(builder, function, I64(0), whole, "block") as block:
            self._block(builder, function, line_field, builder.mul(block, block_lanes), None,
                        stride)
        tail = builder.sub(channels, builder.mul(whole, block_lanes))
        with when(builder, function, builder.icmp_signed(">", tail, I64(0)), "tail"):
            in_tail = builder.icmp_signed("<", ir.Constant(self.indices,
                                                           list(range(self.lanes))),
                                          splat(builder, tail, self.indices))
            self._block(builder, function, line_field, builder.mul(whole, block_lanes),
                        in_tail, stride)

    def _block(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
               first: Any, mask: Any, stride: int) -> None:
        """Channels [first, first + lanes) of the line (those in ``mask`` where given)."""
        channels = field["channels"]
        taps = [self._vector(builder, field["taps"], builder.add(builder.mul(I64(tap), channels),
                                                                 first), mask, "floats")
                for tap in range(TAPS)]
        terms = dict(field, taps=taps, first=first, mask=mask,
                     shift=self._vector(builder, field["shift"], first, mask, "floats"),
                     bias=self._vector(builder, field["bias"], first, mask, "words"),
                     scale=self._vector(builder, field["scales"], first, mask, "floats"))

        def column(j: Any, lanes: Any = mask) -> list[Any]:
            """Padded column ``j`` of the three rows, as floats."""
            offset = builder.add(builder.mul(j, channels), first)
            return [builder.sitofp(builder.zext(self._vector(builder, start, offset, lanes,
                                                             "bytes"), self.words), self.floats)
                    for start in field["starts"]]

        def some(inside: Any) -> Any:
            """``mask`` (every lane where none) where ``inside``, else no lane."""
            return builder.and_(self.everyone if mask is None else mask,
                                splat(builder, inside, ir.VectorType(I1, self.lanes)))

        # Column 0 is the left padding where there is one: zeros, read from nowhere.
        unpadded = builder.icmp_signed("==", field["pad"], I64(0))
        carried = column(I64(0), some(unpadded)) + (column(I64(1)) if stride == 1 else [])
        # Stride 1 carries the window's columns x + 1 and x + 2 into position x + 1 (its x'
        # and x' + 1); stride 2 carries column 2x + 2 (position x + 1's 2x').
        with carrying_loop(builder, function, I64(0), field["inside"], "position",
                           carried=carried) as positions:
            x, held = positions.index, positions.carried
            j = builder.mul(x, I64(stride))
            if stride == 1:
                columns = [held[:3], held[3:], column(builder.add(j, I64(2)))]
            else:
                columns = [held, column(builder.add(j, I64(1))), column(builder.add(j, I64(2)))]
            self._position(builder, terms, x, columns)
            positions.carry([*columns[1], *columns[2]] if stride == 1 else columns[2])
        # The last window reaching into the right padding (one at most): its third column
        # zeros, the other two read again.
        with when(builder, function, builder.icmp_signed("<", field["inside"],
                                                               field["out_w"]), "last"):
            x = field["inside"]
            j = builder.mul(x, I64(stride))
            left = column(j, some(builder.or_(unpadded, builder.icmp_signed(">", j, I64(0)))))
            zero = ir.Constant(self.floats, [0.0] * self.lanes)
            self._position(builder, terms, x, [left, column(builder.add(j, I64(1)),
                                                            some(I1(1))), [zero] * 3])

    def _position(self, builder: ir.IRBuilder, field: dict[str, Any], x: Any,
                  columns: list[list[Any]]) -> None:
        """Output position ``x``'s channels of the block from its window's three ``columns``
        (each the three rows' floats): summed, requantized and stored."""
        taps, total = field["taps"], field["shift"]
        if self.to_nearest is not None:  # AVX-512: one chain
            for r in range(3):
                for k in range(3):
                    total = builder.call(self.fmuladd, [taps[3 * r + k], columns[k][r], total])
        else:
            total = self._chained_sum(builder, field, columns)
        if not field["folded"]:
            total = builder.sitofp(builder.add(builder.fptosi(total, self.words),
                                               field["bias"]), self.floats)
        value = builder.fmul(total, field["scale"])
        low, high = field["bounds"]
        value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
        value = builder.select(builder.fcmp_ordered(">", value, high), high, value)
        if self.to_nearest is not None:
            # Half to even by the conversion's own rounding, named in the instruction (not
            # the thread's MXCSR): one instruction where adding and taking off 1.5 · 2²³ and
            # truncating took three, on the ports the multiply-adds use.
            rounded = builder.call(self.to_nearest, [value, ir.Constant(self.words, None),
                                                     ir.IntType(16)(-1), I32(NEAREST)])
        else:  # the clamped value lies inside int32: rounded in place, then converted
            rounded = builder.fptosi(builder.call(self.rint, [value]), self.words)
        stored = builder.trunc(rounded, self.bytes)
        at = builder.add(builder.mul(x, field["channels"]), field["first"])
        address = builder.bitcast(builder.gep(field["written"], [at]), self.bytes.as_pointer())
        if field["mask"] is None:
            builder.store(stored, address, align=1)
        else:
            builder.call(self.store_bytes, [stored, address, I32(1), field["mask"]])

    def _chained_sum(self, builder: ir.IRBuilder, field: dict[str, Any],
                     columns: list[list[Any]]) -> Any:
        """The shift plus the window's nine products, summed in `GENERIC_CHAINS`' sums for
        the task's stride, then those added in order: the float32 sum one chain makes, every
        partial sum being an exact integer (the bind's condition)."""
        taps = field["taps"]
        sums = []
        for index, chain in enumerate(GENERIC_CHAINS[field["stride"]]):
            products = [(taps[3 * r + k], columns[k][r]) for r, k in chain]
            if index == 0:
                total = field["shift"]
            else:
                total = builder.fmul(*products[0])
                products = products[1:]
            for tap, value in products:
                total = builder.call(self.fmuladd, [tap, value, total])
            sums.append(total)
        total = sums[0]
        for other in sums[1:]:
            total = builder.fadd(total, other)
        return total

    def _vector(self, builder: ir.IRBuilder, base: Any, at: Any, mask: Any, kind: str) -> Any:
        """A vector of ``base`` from ``at`` on: a plain load, or a masked one (lanes out of
        ``mask`` read as zero, never touched)."""
        vector = {"floats": self.floats, "words": self.words, "bytes": self.bytes}[kind]
        address = builder.bitcast(builder.gep(base, [at]), vector.as_pointer())
        if mask is None:
            return builder.load(address, align=1)
        masked = {"floats": self.load_floats, "words": self.load_words,
                  "bytes": self.load_bytes}[kind]
        return builder.call(masked, [address, I32(1), mask,
                                     ir.Constant(vector, [0] * self.lanes)])
