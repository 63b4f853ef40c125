"""The LLVM IR of `int8_conv`'s stacked copy: an image of a few channels, laid channels-last,
padded and laid again with ``stack`` of its padded rows a pixel, so that the direct product
takes ``stack`` kernel rows of taps in one 64-byte step of K (`int8_conv.stacked_rows`: a
stem's 7 × 3 channels, 3 rows of 21 bytes in 63, 3 steps in place of 7).

``int8_stack_c{C}_r{R}`` (C channels, R rows a pixel) is a `spin_pool` task ``(context,
part, parts)`` over the target's rows (N · padded H). ``context`` holds int64s (`FIELDS`):
the source's address (uint8 or int8, (N, H, W, C)), the target's (uint8, (N, padded H, padded
W, R, C)), the rows, the padded height and width, the image's height and width, the padding
above and to the left, the kernel's dilation down, and the byte every value is xored with
(128 moves int8 onto uint8).

Target row y's pixel x holds the padded image's rows y, y + d, ... (R of them), each its C
bytes of column x, the padding (and rows past the padded image's, which meet zero weights)
the xor's byte: a zero. A step takes ``64 // (R · C)`` pixels: R loads of their bytes, one a
source row, masked to the image's columns (lanes outside read nothing and hold 0), R - 1
two-source byte shuffles (``vpermt2b``) putting each row's bytes in its slot of each pixel,
one xor, then one masked store.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.task_ir import (
    I32,
    I64,
    fields,
    loop,
    masked_load,
    masked_store,
    splat,
    task,
)

I8, I1 = ir.IntType(8), ir.IntType(1)
LANES = 64  # a step's vector: AMX's 64 bytes of K
FIELDS = ("source", "target", "rows", "padded_h", "padded_w", "height", "width", "pad_h",
          "pad_w", "dilate_h", "shift")


def task_name(channels: int, stack: int) -> str:
    """The task stacking ``stack`` rows of ``channels`` bytes a pixel."""
    return f"int8_stack_c{channels}_r{stack}"


def pixels_a_step(channels: int, stack: int) -> int:
    """The pixels one vector of the target holds whole."""
    return LANES // (channels * stack)


def module(shapes: tuple[tuple[int, int], ...]) -> ir.Module:
    """A module holding the task of each (channels, stack) in ``shapes``."""
    built = ir.Module(name="hybridserve_int8_stack")
    vector = ir.VectorType(I8, LANES)
    load, store = masked_load(built, vector, "i8"), masked_store(built, vector, "i8")
    for channels, stack in shapes:
        if not (stack > 1 and 0 < channels * stack <= LANES):
            raise ValueError(f"int8 stacked copy: {stack} rows of {channels} channels do not "
                             f"fit {LANES} bytes")
        _define(built, load, store, channels, stack)
    return built


def _define(built: ir.Module, load: ir.Function, store: ir.Function, channels: int,
            stack: int) -> None:
    function, builder, context, part, parts = task(built, task_name(channels, stack))
    field = fields(builder, context, FIELDS)
    vector = ir.VectorType(I8, LANES)
    masks = ir.VectorType(I1, LANES)
    source = builder.inttoptr(field["source"], I8.as_pointer())
    target = builder.inttoptr(field["target"], I8.as_pointer())
    pixel = channels * stack
    step = pixels_a_step(channels, stack)
    padded_h, padded_w, width = field["padded_h"], field["padded_w"], field["width"]
    row_in, row_out = builder.mul(width, I64(channels)), builder.mul(padded_w, I64(pixel))
    zero = ir.Constant(vector, [0] * LANES)
    fill = splat(builder, builder.trunc(field["shift"], I8), vector)
    first = builder.sdiv(builder.mul(part, field["rows"]), parts)
    last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["rows"]), parts)
    with loop(builder, function, first, last, "row") as row:
        image = builder.sdiv(row, padded_h)
        top = builder.sub(row, builder.mul(image, padded_h))
        # each slot's source row, and every lane's bit where it lies in the image, else
        # none (its lanes then hold the zero point, as the padding's)
        starts, keeps = [], []
        for slot in range(stack):
            at = builder.add(top, builder.mul(field["dilate_h"], I64(slot)))
            y = builder.sub(at, field["pad_h"])
            inside = builder.and_(
                builder.icmp_signed("<", at, padded_h),
                builder.and_(builder.icmp_signed(">=", y, I64(0)),
                             builder.icmp_signed("<", y, field["height"])))
            y = builder.select(inside, y, I64(0))
            starts.append(builder.mul(builder.add(builder.mul(image, field["height"]), y),
                                      row_in))
            keeps.append(builder.select(inside, I64(-1), I64(0)))
        row_target = builder.mul(row, row_out)
        # a step whose pixels all lie in the image's columns reads every lane of its
        # pixels' bytes from each row inside the image and writes every lane of its own
        whole_read = I64((1 << (step * channels)) - 1)
        row_masks = [builder.and_(keep, whole_read) for keep in keeps]
        whole_written = _below(builder, I64(step * pixel), I64(LANES))

        def emit(x: Any, reads: list[Any], written: Any) -> None:
            offset = builder.mul(builder.sub(x, field["pad_w"]), I64(channels))
            rows = []
            for start, mask in zip(starts, reads, strict=True):
                address = builder.gep(source, [builder.add(start, offset)])
                rows.append(builder.call(load, [builder.bitcast(address, vector.as_pointer()),
                                                I32(1), builder.bitcast(mask, masks), zero]))
            stacked = builder.shuffle_vector(rows[0], rows[1], ir.Constant(
                ir.VectorType(I32, LANES), _order(channels, stack, 1)))
            for slot in range(2, stack):
                stacked = builder.shuffle_vector(stacked, rows[slot], ir.Constant(
                    ir.VectorType(I32, LANES), _order(channels, stack, slot)))
            stacked = builder.xor(stacked, fill)
            address = builder.gep(target, [builder.add(row_target, builder.mul(x, I64(pixel)))])
            builder.call(store, [stacked, builder.bitcast(address, vector.as_pointer()),
                                 I32(1), builder.bitcast(written, masks)])

        with loop(builder, function, I64(0), padded_w, "pixel", step) as x:
            column = builder.sub(x, field["pad_w"])
            whole = builder.and_(builder.icmp_signed(">=", column, I64(0)), builder.icmp_signed(
                "<=", builder.add(column, I64(step)), width))
            with builder.if_else(whole) as (inside, edge):
                with inside:
                    emit(x, row_masks, whole_written)
                with edge:
                    count = builder.sub(padded_w, x)
                    count = builder.select(builder.icmp_signed("<", count, I64(step)), count,
                                           I64(step))
                    # the lanes of the step's pixels that lie in the image's columns
                    left = builder.mul(builder.sub(field["pad_w"], x), I64(channels))
                    right = builder.mul(builder.sub(builder.add(field["pad_w"], width), x),
                                        I64(channels))
                    within = builder.and_(
                        _below(builder, right, builder.mul(count, I64(channels))),
                        builder.not_(_below(builder, left, I64(LANES))))
                    emit(x, [builder.and_(within, keep) for keep in keeps],
                         _below(builder, builder.mul(count, I64(pixel)), I64(LANES)))
    builder.ret_void()


def _below(builder: ir.IRBuilder, count: Any, most: Any) -> Any:
    """The bits of the lanes below ``count`` clamped to [0, ``most``] (``most`` at most 64),
    as one word."""
    count = builder.select(builder.icmp_signed("<", count, I64(0)), I64(0), count)
    count = builder.select(builder.icmp_signed(">", count, most), most, count)
    full = builder.icmp_signed(">=", count, I64(LANES))
    bits = builder.sub(builder.shl(I64(1), builder.select(full, I64(0), count)), I64(1))
    return builder.select(full, I64(-1), bits)


def _order(channels: int, stack: int, slot: int) -> list[int]:
    """The shuffle bringing row ``slot``'s bytes (the second operand) into their places in
    each pixel, the first operand's kept where they are; for slot 1 the first operand is
    row 0's bytes as loaded, put in place too. Lanes past the step's pixels take lane 0."""
    pixel = channels * stack
    indices = []
    for lane in range(LANES):
        x, within = divmod(lane, pixel)
        row, channel = divmod(within, channels)
        if x >= pixels_a_step(channels, stack):
            indices.append(0)
        elif row == slot:
            indices.append(LANES + x * channels + channel)
        elif row < slot:
            indices.append(x * channels + channel if slot == 1 else lane)
        else:
            indices.append(0)
    return indices
