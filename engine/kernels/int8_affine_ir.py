"""The LLVM IR of `int8_affine`'s per-channel scale and shift of int8/uint8 values into
int8/uint8, 16 values to a vector, where data and output share a layout.

``int8_affine_{in}_{out}_{layout}`` (``in``/``out`` ``i8`` or ``u8``; ``layout`` ``last``,
both channels-last, or ``planar``, both NCHW) are `spin_pool` tasks ``(context, part,
parts)`` over the image rows of every image (N · H). ``context`` holds int64s (`FIELDS`): the
data's address, the output's, the scales' and shifts' ((C,) float32), N · H, H, W, C, the
data's element strides per image, channel and row, the output's, and the clamp's bounds as
float64 bits.

Channels-last, a row is W pixels of C channels: each pixel's channels 16 at a time, the
scales and shifts loaded beside them (they stay in L1). Planar, a row holds each channel's W
values in turn: 16 positions at a time, that channel's scale and shift in every lane. A run's
tail goes through lane masks.

Each value is converted to float32, multiplied by its scale and its shift added (two
roundings, no fused multiply-add: NumPy's ``x · scale + shift``), rounded half to even
(``llvm.rint`` in the default rounding mode), clamped to the output type's bounds and stored
as its low byte: `int8_affine`'s numba form to the bit. numba ran it at about a third of
this speed (ResNet-50 v2's BatchNorm + relu at 56², one thread).

Two variants, chosen when the module is built (`module`): with AVX-512 BW, a block of 64
values rounds in ``vcvtps2dq`` and packs with the 512-bit saturating packs, as above. Without
it, every step is 16 values (two ymm of float32: on Zen 3, a twentieth faster than one) in
generic LLVM operations (``llvm.rint``, a clamp by selects, ``fptosi`` and ``trunc``): whole
vectors with plain loads and stores, then one masked vector for a run's tail (an AVX2 host has
no masked byte moves, and LLVM expands those lane by lane, so only the tail pays for them).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.task_ir import (
    F32,
    I32,
    I64,
    as_float,
    fields,
    loop,
    masked_load,
    masked_store,
    splat,
    task,
    when,
)

I8 = ir.IntType(8)
LANES = 16
BLOCK = 64  # values a whole step takes: one 64-byte load and store
GENERIC_LANES = 16  # a vector's values without AVX-512: two ymm of float32
ROUND_NEAREST = 8  # cvtps2dq's embedded rounding: to nearest even, exceptions suppressed
FIELDS = ("source", "target", "scale", "shift", "rows", "height", "width", "channels",
          "in_n", "in_c", "in_y", "out_n", "out_c", "out_y", "low", "high")
LAYOUTS = ("last", "planar")


def task_name(in_signed: bool, out_signed: bool, channels_last: bool) -> str:
    """The task for data and output of these signednesses, both channels-last or both
    NCHW."""
    sign = {True: "i8", False: "u8"}
    return (f"int8_affine_{sign[in_signed]}_{sign[out_signed]}_"
            f"{LAYOUTS[0] if channels_last else LAYOUTS[1]}")


def module(avx512: bool | None = None) -> ir.Module:
    """A module holding every task `task_name` names: the AVX-512 variant where ``avx512``
    (by default, where the host has AVX-512 BW), else the generic one."""
    if avx512 is None:
        from engine.cpu import host_features

        avx512 = host_features.has("avx512bw")
    built = ir.Module(name="hybridserve_int8_affine")
    kernel = _AffineKernel(built, avx512)
    for in_signed in (True, False):
        for out_signed in (True, False):
            for channels_last in (True, False):
                kernel.define(in_signed, out_signed, channels_last)
    return built


class _AffineKernel:
    def __init__(self, built: ir.Module, avx512: bool) -> None:
        self.module = built
        self.avx512 = avx512
        self.lanes = LANES if avx512 else GENERIC_LANES
        self.bytes = ir.VectorType(I8, self.lanes)
        self.floats = ir.VectorType(F32, self.lanes)
        self.words = ir.VectorType(I32, self.lanes)
        self.load_bytes = masked_load(built, self.bytes, "i8")
        self.store_bytes = masked_store(built, self.bytes, "i8")
        self.load_floats = masked_load(built, self.floats, "f32")
        if avx512:
            self._declare_conversions()
        self.rint = ir.Function(built, ir.FunctionType(self.floats, [self.floats]),
                                name=f"llvm.rint.v{self.lanes}f32")

    def _declare_conversions(self) -> None:
        """AVX-512's rounding conversion and its saturating pack of words."""
        built = self.module
        self.round_to_words = ir.Function(built, ir.FunctionType(self.words, [
            self.floats, self.words, ir.IntType(16), I32]),
            name="llvm.x86.avx512.mask.cvtps2dq.512")
        self.pack_words = ir.Function(built, ir.FunctionType(
            ir.VectorType(ir.IntType(16), 32), [self.words, self.words]),
            name="llvm.x86.avx512.packssdw.512")

    def _pack_bytes(self, out_signed: bool) -> ir.Function:
        name = "packsswb" if out_signed else "packuswb"
        halves = ir.VectorType(ir.IntType(16), 32)
        return self.module.globals.get(f"llvm.x86.avx512.{name}.512") or ir.Function(
            self.module, ir.FunctionType(ir.VectorType(I8, BLOCK), [halves, halves]),
            name=f"llvm.x86.avx512.{name}.512")

    def define(self, in_signed: bool, out_signed: bool, channels_last: bool) -> None:
        function, builder, context, part, parts = task(
            self.module, task_name(in_signed, out_signed, channels_last))
        field = fields(builder, context, FIELDS)
        self.in_signed = in_signed
        if self.avx512:
            self.pack_bytes = self._pack_bytes(out_signed)
        self.source = builder.inttoptr(field["source"], I8.as_pointer())
        self.target = builder.inttoptr(field["target"], I8.as_pointer())
        self.scales = builder.inttoptr(field["scale"], F32.as_pointer())
        self.shifts = builder.inttoptr(field["shift"], F32.as_pointer())
        self.low = splat(builder, as_float(builder, field["low"]), self.floats)
        self.high = splat(builder, as_float(builder, field["high"]), self.floats)
        first = builder.sdiv(builder.mul(part, field["rows"]), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["rows"]), parts)
        with loop(builder, function, first, last, "row") as row:
            image = builder.sdiv(row, field["height"])
            y = builder.sub(row, builder.mul(image, field["height"]))
            source = builder.add(builder.mul(image, field["in_n"]),
                                 builder.mul(y, field["in_y"]))
            target = builder.add(builder.mul(image, field["out_n"]),
                                 builder.mul(y, field["out_y"]))
            if not self.avx512:
                self._generic_row(builder, function, field, source, target, channels_last)
            elif channels_last:
                self._pixels(builder, function, field, source, target)
            else:
                self._planes(builder, function, field, source, target)
        builder.ret_void()

    def _pixels(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
                source: Any, target: Any) -> None:
        """A channels-last row: each pixel's channels in blocks of 64, then vectors of 16,
        the scales and shifts read beside them."""
        depth = field["channels"]
        blocks = builder.mul(builder.sdiv(depth, I64(BLOCK)), I64(BLOCK))
        with loop(builder, function, I64(0), field["width"], "pixel") as pixel:
            at = builder.mul(pixel, depth)
            pixel_in, pixel_out = builder.add(source, at), builder.add(target, at)
            with loop(builder, function, I64(0), blocks, "block", BLOCK) as channel:
                self._block(builder, builder.add(pixel_in, channel),
                            builder.add(pixel_out, channel), [
                                self._floats(builder, self.scales, builder.add(channel, I64(
                                    quarter * LANES))) for quarter in range(BLOCK // LANES)], [
                                self._floats(builder, self.shifts, builder.add(channel, I64(
                                    quarter * LANES))) for quarter in range(BLOCK // LANES)])
            with loop(builder, function, blocks, depth, "channel", LANES) as channel:
                mask = self._mask(builder, builder.sub(depth, channel))
                scale = self._floats(builder, self.scales, channel, mask)
                shift = self._floats(builder, self.shifts, channel, mask)
                self._step(builder, builder.add(pixel_in, channel),
                           builder.add(pixel_out, channel), scale, shift, mask)

    def _planes(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
                source: Any, target: Any) -> None:
        """An NCHW row: each channel's positions in blocks of 64, then vectors of 16, its
        scale and shift in every lane."""
        width = field["width"]
        blocks = builder.mul(builder.sdiv(width, I64(BLOCK)), I64(BLOCK))
        with loop(builder, function, I64(0), field["channels"], "plane") as channel:
            plane_in = builder.add(source, builder.mul(channel, field["in_c"]))
            plane_out = builder.add(target, builder.mul(channel, field["out_c"]))
            scale = splat(builder, builder.load(builder.gep(self.scales, [channel])),
                          self.floats)
            shift = splat(builder, builder.load(builder.gep(self.shifts, [channel])),
                          self.floats)
            with loop(builder, function, I64(0), blocks, "block", BLOCK) as position:
                self._block(builder, builder.add(plane_in, position),
                            builder.add(plane_out, position), [scale] * (BLOCK // LANES),
                            [shift] * (BLOCK // LANES))
            with loop(builder, function, blocks, width, "position", LANES) as position:
                mask = self._mask(builder, builder.sub(width, position))
                self._step(builder, builder.add(plane_in, position),
                           builder.add(plane_out, position), scale, shift, mask)

    def _generic_row(self, builder: ir.IRBuilder, function: ir.Function,
                     field: dict[str, Any], source: Any, target: Any,
                     channels_last: bool) -> None:
        """A row in the generic variant: channels-last, each pixel's channels as one run
        (its scales and shifts read beside them); NCHW, each channel's positions as one run
        (its scale and shift in every lane)."""
        if channels_last:
            depth = field["channels"]
            with loop(builder, function, I64(0), field["width"], "pixel") as pixel:
                at = builder.mul(pixel, depth)

                def channel_terms(channel: Any, mask: Any) -> tuple[Any, Any]:
                    return (self._floats(builder, self.scales, channel, mask),
                            self._floats(builder, self.shifts, channel, mask))

                self._run(builder, function, builder.add(source, at), builder.add(target, at),
                          depth, channel_terms)
            return
        with loop(builder, function, I64(0), field["channels"], "plane") as channel:
            scale = splat(builder, builder.load(builder.gep(self.scales, [channel])),
                          self.floats)
            shift = splat(builder, builder.load(builder.gep(self.shifts, [channel])),
                          self.floats)
            self._run(builder, function,
                      builder.add(source, builder.mul(channel, field["in_c"])),
                      builder.add(target, builder.mul(channel, field["out_c"])),
                      field["width"], lambda position, mask: (scale, shift))

    def _run(self, builder: ir.IRBuilder, function: ir.Function, source: Any, target: Any,
             length: Any, terms: Any) -> None:
        """``length`` values from element ``source`` into element ``target``: whole
        vectors unmasked, then the rest under a mask. ``terms(offset, mask)`` gives the
        scale and shift vectors of the values ``offset`` on."""
        lanes = self.lanes
        whole = builder.mul(builder.sdiv(length, I64(lanes)), I64(lanes))
        with loop(builder, function, I64(0), whole, "vector", lanes) as offset:
            scale, shift = terms(offset, None)
            self._step(builder, builder.add(source, offset), builder.add(target, offset),
                       scale, shift, None)
        with when(builder, function, builder.icmp_signed("<", whole, length), "tail"):
            mask = self._mask(builder, builder.sub(length, whole))
            scale, shift = terms(whole, mask)
            self._step(builder, builder.add(source, whole), builder.add(target, whole),
                       scale, shift, mask)

    def _block(self, builder: ir.IRBuilder, source: Any, target: Any, scales: list[Any],
               shifts: list[Any]) -> None:
        """64 values at element ``source`` into element ``target``, whole vectors: each 16
        scaled and shifted, clamped above (no float past int32), rounded half to even into
        int32 as it converts; the four packed into bytes with signed saturation to words,
        then to the output type's bytes (the clamp below and above), and put back in
        order (a pack works within each 128-bit lane)."""
        address = builder.bitcast(builder.gep(self.source, [source]),
                                  ir.VectorType(I8, BLOCK).as_pointer())
        values = builder.load(address, align=1)
        convert = builder.sitofp if self.in_signed else builder.uitofp
        words = []
        for quarter, (scale, shift) in enumerate(zip(scales, shifts, strict=True)):
            part = builder.shuffle_vector(values, ir.Constant(values.type, ir.Undefined),
                                          ir.Constant(self.words, list(range(
                                              quarter * LANES, (quarter + 1) * LANES))))
            value = builder.fadd(builder.fmul(convert(part, self.floats), scale), shift)
            value = builder.select(builder.fcmp_ordered(">", value, self.high), self.high,
                                   value)
            words.append(builder.call(self.round_to_words, [
                value, ir.Constant(self.words, [0] * LANES), ir.Constant(ir.IntType(16), -1),
                I32(ROUND_NEAREST)]))
        halves = [builder.call(self.pack_words, words[pair:pair + 2]) for pair in (0, 2)]
        packed = builder.call(self.pack_bytes, halves)
        order = [lane * 4 + dword for dword in range(4) for lane in range(4)]
        packed = builder.bitcast(packed, self.words)
        packed = builder.shuffle_vector(packed, ir.Constant(self.words, ir.Undefined),
                                        ir.Constant(self.words, order))
        address = builder.bitcast(builder.gep(self.target, [target]), self.words.as_pointer())
        builder.store(packed, address, align=1)

    def _mask(self, builder: ir.IRBuilder, left: Any) -> Any:
        """Lanes below ``left`` (the values that remain in the run)."""
        indices = ir.VectorType(I64, self.lanes)
        return builder.icmp_signed("<", ir.Constant(indices, list(range(self.lanes))),
                                   splat(builder, left, indices))

    def _floats(self, builder: ir.IRBuilder, base: Any, at: Any, mask: Any = None) -> Any:
        address = builder.bitcast(builder.gep(base, [at]), self.floats.as_pointer())
        if mask is None:
            return builder.load(address, align=4)
        return builder.call(self.load_floats, [address, I32(4), mask,
                                               ir.Constant(self.floats,
                                                           [0.0] * self.lanes)])

    def _step(self, builder: ir.IRBuilder, source: Any, target: Any, scale: Any, shift: Any,
              mask: Any) -> None:
        """A vector of values at element ``source`` scaled, shifted, rounded, clamped and
        stored at element ``target`` under ``mask`` (every lane where None)."""
        address = builder.bitcast(builder.gep(self.source, [source]), self.bytes.as_pointer())
        if mask is None:
            values = builder.load(address, align=1)
        else:
            values = builder.call(self.load_bytes, [address, I32(1), mask, ir.Constant(
                self.bytes, [0] * self.lanes)])
        convert = builder.sitofp if self.in_signed else builder.uitofp
        value = builder.fadd(builder.fmul(convert(values, self.floats), scale), shift)
        value = builder.call(self.rint, [value])
        value = builder.select(builder.fcmp_ordered("<", value, self.low), self.low, value)
        value = builder.select(builder.fcmp_ordered(">", value, self.high), self.high, value)
        stored = builder.trunc(builder.fptosi(value, self.words), self.bytes)
        address = builder.bitcast(builder.gep(self.target, [target]), self.bytes.as_pointer())
        if mask is None:
            builder.store(stored, address, align=1)
        else:
            builder.call(self.store_bytes, [stored, address, I32(1), mask])
