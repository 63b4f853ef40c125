"""The LLVM IR of `int8_convert`'s quantize of an image of a few channels into channels-last
bytes: 16 pixels a step, each channel's 16 floats quantized in a vector, the channels'
bytes interleaved pixel by pixel by one byte shuffle and stored together.

``int8_quantize_last_c{C}`` (C from 1 to `MOST_CHANNELS`) is a `spin_pool` task ``(context,
part, parts)`` over the image rows of every image (N · H). ``context`` holds int64s
(`FIELDS`): the values' address (float32, (N, C, H, W)), the output's (int8 or uint8, laid
(N, H, W, C)), the scale's (float32, one value, read at each run), N · H, H, W, and the
clamp's bounds as float64 bits.

Each value is multiplied by the scale (one float32 product), rounded half to even
(``llvm.rint`` in the default rounding mode), NaN taken as zero, clamped to the bounds and
stored as its low byte: `int8_convert`'s numba pass to the bit. A row's last step of under
16 pixels reads and writes through lane masks.

Two variants, chosen when the module is built (`module`): with AVX-512 BW, every step as
above, its 64 bytes stored through a mask. Without it, a step is 16 pixels too (two ymm of
float32 a channel: on Zen 3 as fast as one), read with plain loads and its 16 · C
bytes stored with a plain store where the step is whole, and only a row's last step through
masks (an AVX2 host has no masked byte store: LLVM writes it lane by lane).
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

I8, I1 = ir.IntType(8), ir.IntType(1)
PIXELS = 16  # a step's pixels: a vector of float32 a channel
MOST_CHANNELS = 4  # a step's bytes, 16 pixels of each channel, fill at most 64
GENERIC_PIXELS = 16  # a step's pixels without AVX-512: two ymm of float32 a channel
FIELDS = ("source", "target", "scale", "rows", "height", "width", "low", "high")


def task_name(channels: int) -> str:
    """The task quantizing ``channels`` planes into channels-last bytes."""
    return f"int8_quantize_last_c{channels}"


def module(avx512: bool | None = None) -> ir.Module:
    """A module holding the task of every channel count up to `MOST_CHANNELS`: the AVX-512
    variant where ``avx512`` (by default, where the host has AVX-512 BW), else the generic
    one."""
    if avx512 is None:
        from engine.cpu import host_features

        avx512 = host_features.has("avx512bw")
    built = ir.Module(name="hybridserve_int8_convert")
    pixels = PIXELS if avx512 else GENERIC_PIXELS
    floats = ir.VectorType(F32, pixels)
    out = ir.VectorType(I8, 4 * pixels)
    load, store = masked_load(built, floats, "f32"), masked_store(built, out, "i8")
    rint = ir.Function(built, ir.FunctionType(floats, [floats]),
                       name=f"llvm.rint.v{pixels}f32")
    for channels in range(1, MOST_CHANNELS + 1):
        if avx512:
            _define(built, load, store, rint, channels)
        else:
            _define_generic(built, load, store, rint, channels)
    return built


def _define(built: ir.Module, load: ir.Function, store: ir.Function, rint: ir.Function,
            channels: int) -> None:
    function, builder, context, part, parts = task(built, task_name(channels))
    field = fields(builder, context, FIELDS)
    floats = ir.VectorType(F32, PIXELS)
    source = builder.inttoptr(field["source"], F32.as_pointer())
    target = builder.inttoptr(field["target"], I8.as_pointer())
    factor = splat(builder, builder.load(builder.inttoptr(field["scale"], F32.as_pointer())),
                   floats)
    low = splat(builder, as_float(builder, field["low"]), floats)
    high = splat(builder, as_float(builder, field["high"]), floats)
    zero = ir.Constant(floats, [0.0] * PIXELS)
    height, width = field["height"], field["width"]
    plane = builder.mul(height, width)
    first = builder.sdiv(builder.mul(part, field["rows"]), parts)
    last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["rows"]), parts)
    with loop(builder, function, first, last, "row") as row:
        image = builder.sdiv(row, height)
        y = builder.sub(row, builder.mul(image, height))
        # channel 0's run of this row, and the row's first pixel in the output
        start = builder.add(builder.mul(builder.mul(image, I64(channels)), plane),
                            builder.mul(y, width))
        row_out = builder.mul(builder.mul(row, width), I64(channels))
        with loop(builder, function, I64(0), width, "pixel", PIXELS) as x:
            count = builder.sub(width, x)
            count = builder.select(builder.icmp_signed("<", count, I64(PIXELS)), count,
                                   I64(PIXELS))
            read = builder.bitcast(builder.trunc(_below(builder, count), ir.IntType(PIXELS)),
                                   ir.VectorType(I1, PIXELS))
            planes = []
            for channel in range(channels):
                at = builder.add(builder.add(start, builder.mul(plane, I64(channel))), x)
                address = builder.bitcast(builder.gep(source, [at]), floats.as_pointer())
                value = builder.call(load, [address, I32(4), read, zero])
                value = builder.call(rint, [builder.fmul(value, factor)])
                value = builder.select(builder.fcmp_ordered("==", value, value), value, zero)
                value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
                value = builder.select(builder.fcmp_ordered(">", value, high), high, value)
                planes.append(builder.trunc(builder.fptosi(value, ir.VectorType(
                    I32, PIXELS)), ir.VectorType(I8, PIXELS)))
            pixels = _interleave(builder, planes)
            written = builder.bitcast(_below(builder, builder.mul(count, I64(channels))),
                                      ir.VectorType(I1, 4 * PIXELS))
            address = builder.gep(target, [builder.add(row_out, builder.mul(x, I64(channels)))])
            builder.call(store, [pixels, builder.bitcast(address, ir.VectorType(
                I8, 4 * PIXELS).as_pointer()), I32(1), written])
    builder.ret_void()


def _define_generic(built: ir.Module, load: ir.Function, store: ir.Function,
                    rint: ir.Function, channels: int) -> None:
    """The task of the generic variant: `GENERIC_PIXELS` pixels a step, whole steps with
    plain loads and one plain store of their bytes, a row's last step under masks."""
    function, builder, context, part, parts = task(built, task_name(channels))
    field = fields(builder, context, FIELDS)
    pixels = GENERIC_PIXELS
    floats = ir.VectorType(F32, pixels)
    source = builder.inttoptr(field["source"], F32.as_pointer())
    target = builder.inttoptr(field["target"], I8.as_pointer())
    factor = splat(builder, builder.load(builder.inttoptr(field["scale"], F32.as_pointer())),
                   floats)
    bounds = [splat(builder, as_float(builder, field[name]), floats) for name in ("low", "high")]
    height, width = field["height"], field["width"]
    plane = builder.mul(height, width)
    whole = builder.mul(builder.sdiv(width, I64(pixels)), I64(pixels))
    first = builder.sdiv(builder.mul(part, field["rows"]), parts)
    last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["rows"]), parts)

    def step(start: Any, row_out: Any, x: Any, count: Any | None) -> None:
        """Pixels x on of the row (``count`` of them under masks; all where None)."""
        read = None if count is None else _lanes_below(builder, count, pixels)
        planes = []
        for channel in range(channels):
            at = builder.add(builder.add(start, builder.mul(plane, I64(channel))), x)
            address = builder.bitcast(builder.gep(source, [at]), floats.as_pointer())
            if read is None:
                value = builder.load(address, align=4)
            else:
                value = builder.call(load, [address, I32(4), read,
                                            ir.Constant(floats, [0.0] * pixels)])
            planes.append(_quantized(builder, rint, value, factor, *bounds))
        interleaved = _interleave(builder, planes, pixels)
        address = builder.gep(target, [builder.add(row_out, builder.mul(x, I64(channels)))])
        if count is None:
            stored = builder.shuffle_vector(interleaved, ir.Constant(
                interleaved.type, ir.Undefined), ir.Constant(ir.VectorType(
                    I32, channels * pixels), list(range(channels * pixels))))
            builder.store(stored, builder.bitcast(address, stored.type.as_pointer()), align=1)
        else:
            written = _lanes_below(builder, builder.mul(count, I64(channels)), 4 * pixels)
            builder.call(store, [interleaved, builder.bitcast(
                address, interleaved.type.as_pointer()), I32(1), written])

    with loop(builder, function, first, last, "row") as row:
        image = builder.sdiv(row, height)
        y = builder.sub(row, builder.mul(image, height))
        start = builder.add(builder.mul(builder.mul(image, I64(channels)), plane),
                            builder.mul(y, width))
        row_out = builder.mul(builder.mul(row, width), I64(channels))
        with loop(builder, function, I64(0), whole, "pixel", pixels) as x:
            step(start, row_out, x, None)
        with when(builder, function, builder.icmp_signed("<", whole, width), "tail"):
            step(start, row_out, whole, builder.sub(width, whole))
    builder.ret_void()


def _quantized(builder: ir.IRBuilder, rint: ir.Function, value: Any, factor: Any, low: Any,
               high: Any) -> Any:
    """``value`` times ``factor``, rounded half to even, NaN as zero, clamped to [low, high]
    and cut to its low bytes."""
    zero = ir.Constant(value.type, [0.0] * value.type.count)
    value = builder.call(rint, [builder.fmul(value, factor)])
    value = builder.select(builder.fcmp_ordered("==", value, value), value, zero)
    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
    value = builder.select(builder.fcmp_ordered(">", value, high), high, value)
    count = value.type.count
    return builder.trunc(builder.fptosi(value, ir.VectorType(I32, count)),
                         ir.VectorType(I8, count))


def _lanes_below(builder: ir.IRBuilder, count: Any, lanes: int) -> Any:
    """The mask of ``lanes`` lanes whose index is below ``count``."""
    indices = ir.VectorType(I64, lanes)
    return builder.icmp_signed("<", ir.Constant(indices, list(range(lanes))),
                               splat(builder, count, indices))


def _interleave(builder: ir.IRBuilder, planes: list[Any], pixels: int = PIXELS) -> Any:
    """The channels' ``pixels`` bytes each laid pixel by pixel in one vector of 4 ·
    ``pixels`` lanes (lanes past ``pixels`` · C undefined): the planes joined in pairs, then
    one shuffle of the two halves."""
    undefined16 = ir.Constant(ir.VectorType(I8, pixels), ir.Undefined)
    padded = planes + [undefined16] * (MOST_CHANNELS - len(planes))
    join = ir.Constant(ir.VectorType(I32, 2 * pixels), list(range(2 * pixels)))
    halves = [builder.shuffle_vector(padded[pair], padded[pair + 1], join)
              for pair in (0, 2)]
    channels = len(planes)
    order = []
    for lane in range(4 * pixels):
        x, channel = divmod(lane, channels)
        order.append(channel * pixels + x if x < pixels else 0)
    return builder.shuffle_vector(halves[0], halves[1],
                                  ir.Constant(ir.VectorType(I32, 4 * pixels), order))


def _below(builder: ir.IRBuilder, count: Any) -> Any:
    """The bits of the lanes below ``count`` (0 to 64), as one word."""
    full = builder.icmp_signed(">=", count, I64(64))
    bits = builder.sub(builder.shl(I64(1), builder.select(full, I64(0), count)), I64(1))
    return builder.select(full, I64(-1), bits)
