"""The LLVM IR of `conv_amx`'s direct convolution over a channels-last grid: each A row one
aligned cache line.

`conv_amx_ir`'s product reads its activation as AMX's B: pairs of channels by pixels, so a
tap's tile of 16 word rows starts at the pixel the tap's offset reaches, rarely on a cache
line, and each of its 64-byte rows straddles two lines. Here the activation is A instead: a
zero-bordered grid of pixels, each pixel's channels in bf16 one after another (``words``
pairs a pixel, a multiple of 16), so that a tile of 16 pixels × 32 channels is 16 whole,
aligned lines ``words`` words apart, whatever pixel a tap starts at. The weights are B: per
tap and 32 channels, two tiles of 16 channel pairs × 16 filters
(`conv_amx_lines.weight_tiles`). The sums come out pixels × filters: each 16 × 16 accumulator is
transposed as it leaves the tiles (`LinesConvKernel._store_sums`), so that the buffer holds
filters × grid columns as `conv_amx_ir`'s does and its epilogue (bias, residual, clamp, the
kept lanes, the reader's grid) runs unchanged.

``lines_grid(context, part, parts)`` makes the grid from a float32 NCHW input: 16 pixels at a
time, channel pairs rounded to bf16 (``fptrunc``: to nearest even, as the pairing pass
rounds) and interleaved into words, then the 16 × 16 words transposed so that each pixel's 32
channels are one vector, stored at its grid pixel (a table gives each input pixel's).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.conv_amx_ir import PREFETCH_WORDS, DirectConvKernel, define_parts
from engine.kernels.gemm_amx_ir import ROWS, TILE_COLUMNS, WORDS
from engine.kernels.gemm_bf16_ir import BFloatType
from engine.kernels.gemm_ir import F32, I32, I64
from engine.kernels.gemm_kernel import AMX_TILE
from engine.kernels.task_ir import fields, loop, masked_load, splat, task, when

I8 = ir.IntType(8)
LINE_WORDS = 16
# Where tiles 0-3 (pixels 0-15 by filters 0-15, by 16-31; pixels 16-31 by each) are stored
# in the 32 × 32 buffer of sums (floats, rows of 32): their transposes' places.
CORNERS = (0, ROWS * TILE_COLUMNS, WORDS, ROWS * TILE_COLUMNS + WORDS)
# The grid pass's context, int64s: the input (float32 NCHW), its channels, pixels a plane
# (H·W) and images; the grid (pairs viewed as int32 words), its words a pixel and pixels an
# image; the table of each input pixel's grid pixel (int64, H·W of them).
GRID_FIELDS = ("data", "channels", "pixels", "images", "grid", "words", "image", "table")


def transposed(builder: ir.IRBuilder, rows: list[Any]) -> list[Any]:
    """16 vectors of 16 lanes transposed: out[j][i] = rows[i][j]. At each of four levels,
    each 2d × 2d block's upper-right and lower-left d × d blocks swap (one two-source
    shuffle a row)."""
    rows = list(rows)
    count = len(rows)
    distance = count // 2
    while distance:
        upper = [lane if not lane & distance else count + lane - distance
                 for lane in range(count)]
        lower = [lane + distance if not lane & distance else count + lane
                 for lane in range(count)]
        kinds = ir.VectorType(I32, count)
        for row in range(count):
            if row & distance:
                continue
            first, second = rows[row], rows[row + distance]
            rows[row] = builder.shuffle_vector(first, second, ir.Constant(kinds, upper))
            rows[row + distance] = builder.shuffle_vector(first, second,
                                                          ir.Constant(kinds, lower))
        distance //= 2
    return rows


class LinesConvKernel(DirectConvKernel):
    """`DirectConvKernel` with the activation as A (16 pixels × 32 channels a tile, its rows
    ``ldb`` words apart: the grid's words a pixel) and the packed weights as B."""

    def _grid_column_bytes(self, builder: ir.IRBuilder, column: Any, field: dict[str, Any]) -> Any:
        """A grid column's bytes from the image's first: a pixel of ``ldb`` words."""
        return builder.mul(builder.mul(column, field["ldb"]), I64(4))

    def _k_loop(self, function: ir.Function, builder: ir.IRBuilder, prefetching: bool,
                finish_rows: Any) -> None:
        """The sums over the taps and, within each, 32 channels a step: pixels 0-15 and
        16-31 (tiles 4, 5) by filters 0-15 and 16-31 (tiles 6, 7) into tiles 0-3 (pixels
        0-15 by filters 0-15, by 16-31; pixels 16-31 by each)."""
        words, weights, lda, acs, grid, ldb = function.args[:6]
        taps, offsets = function.args[6:8]
        pixel_bytes = builder.mul(ldb, I64(4))
        steps_per_tap = builder.sdiv(words, I64(WORDS))
        with loop(builder, function, I64(0), taps, "tap") as tap:
            offset = builder.load(builder.gep(offsets, [tap]), align=8)
            grid_tap = builder.gep(grid, [builder.mul(offset, ldb)])
            grid_lower = builder.gep(grid_tap, [builder.mul(ldb, I64(ROWS))])
            weights_tap = builder.mul(builder.mul(tap, words), acs)
            with loop(builder, function, I64(0), words, "pairs", WORDS) as k:
                at = builder.add(weights_tap, builder.mul(k, acs))
                if prefetching:
                    ahead = builder.gep(weights, [builder.add(at, I64(PREFETCH_WORDS))])
                    for line in range(0, 2 * ROWS * WORDS, LINE_WORDS):
                        self._prefetch(builder, builder.gep(ahead, [I64(line)]))
                self._load_tile(builder, 4, builder.gep(grid_tap, [k]), pixel_bytes)
                self._load_tile(builder, 5, builder.gep(grid_lower, [k]), pixel_bytes)
                filters = builder.gep(weights, [at])
                self._load_tile(builder, 6, filters, builder.mul(lda, I64(4)))
                self._load_tile(builder, 7, builder.gep(filters, [builder.mul(lda, I64(ROWS))]),
                                builder.mul(lda, I64(4)))
                for accumulator, (left, right) in enumerate(((4, 6), (4, 7), (5, 6), (5, 7))):
                    builder.call(self.dot, [I8(accumulator), I8(left), I8(right)])
                if finish_rows is not None:
                    finish_rows(builder.add(builder.mul(tap, steps_per_tap),
                                            builder.sdiv(k, I64(WORDS))))

    def _store_sums(self, builder: ir.IRBuilder, floats: Any) -> None:
        """Tiles 0-3 (pixels × filters) into the 32 × 32 floats at ``floats`` as filters ×
        pixels: the two off the diagonal stored in each other's place, then each 16 × 16
        block transposed where it lies."""
        row_bytes = I64(4 * TILE_COLUMNS)
        for accumulator, offset in enumerate(CORNERS):
            target = builder.bitcast(builder.gep(floats, [I64(offset)]), I8.as_pointer())
            builder.call(self.store_tile, [I8(accumulator), target, row_bytes])
        # Transposed at once, AMX idle: transposing each pair of blocks in the first
        # epilogue call to read it, between the next tile's steps, took 1.05-1.10× as long
        # (ResNet-18's 64 filters at 56² and 128 at 28²; the same at 256 and 512).
        for offset in CORNERS:
            self._transpose_block(builder, floats, offset)

    def _transpose_block(self, builder: ir.IRBuilder, floats: Any, offset: int) -> None:
        """The 16 × 16 block of the sums at ``offset`` (rows 32 floats apart) transposed."""
        vector_pointer = self.vector.as_pointer()
        at = [builder.bitcast(builder.gep(floats, [I64(offset + row * TILE_COLUMNS)]),
                              vector_pointer) for row in range(ROWS)]
        rows = transposed(builder, [builder.load(pointer, align=64) for pointer in at])
        for value, pointer in zip(rows, at, strict=True):
            builder.store(value, pointer, align=64)


def define_grid_pass(module: ir.Module, name: str) -> None:
    """``name(context, part, parts)``: the channels-last grid from a float32 NCHW input
    (`GRID_FIELDS`), over blocks of 16 pixels of every image."""
    function, builder, context, part, parts = task(module, name)
    field = fields(builder, context, GRID_FIELDS)
    floats = ir.VectorType(F32, WORDS)
    halves = ir.VectorType(BFloatType(), WORDS)
    words_type = ir.VectorType(I32, WORDS)
    name_of_load = "llvm.masked.load.v16f32.p0"  # the kernel's epilogue may declare it
    load = (module.globals[name_of_load] if name_of_load in module.globals
            else masked_load(module, floats, "f32"))
    lanes = ir.Constant(ir.VectorType(I64, WORDS), list(range(WORDS)))
    zero = ir.Constant(floats, [0.0] * WORDS)
    interleave = ir.Constant(ir.VectorType(I32, 2 * WORDS),
                             [lane for index in range(WORDS) for lane in (index, index + WORDS)])
    channels, pixels = field["channels"], field["pixels"]
    blocks = builder.sdiv(builder.add(pixels, I64(WORDS - 1)), I64(WORDS))
    total = builder.mul(field["images"], blocks)
    first = builder.sdiv(builder.mul(part, total), parts)
    last = builder.sdiv(builder.mul(builder.add(part, I64(1)), total), parts)
    data = builder.inttoptr(field["data"], F32.as_pointer())
    grid = builder.inttoptr(field["grid"], I32.as_pointer())
    table = builder.inttoptr(field["table"], I64.as_pointer())
    words = field["words"]
    with loop(builder, function, first, last, "block") as number:
        image = builder.sdiv(number, blocks)
        start = builder.mul(builder.srem(number, blocks), I64(WORDS))
        count = builder.sub(pixels, start)
        count = builder.select(builder.icmp_signed("<", count, I64(WORDS)), count, I64(WORDS))
        present = builder.icmp_signed("<", lanes, splat(builder, count, lanes.type))
        plane_base = builder.mul(builder.mul(image, channels), pixels)
        image_base = builder.mul(image, field["image"])
        targets = []
        for lane in range(WORDS):
            index = builder.load(builder.gep(table, [builder.add(start, I64(lane))]), align=8)
            targets.append(builder.mul(builder.add(image_base, index), words))
        with loop(builder, function, I64(0), words, "channels", WORDS) as step:
            rows = []
            for pair in range(WORDS):
                values = []
                for half in range(2):
                    channel = builder.add(builder.mul(step, I64(2)), I64(2 * pair + half))
                    inside = builder.icmp_signed("<", channel, channels)
                    read = builder.select(inside, channel, I64(0))
                    at = builder.gep(data, [builder.add(plane_base, builder.add(
                        builder.mul(read, pixels), start))])
                    value = builder.call(load, [builder.bitcast(at, floats.as_pointer()), I32(4),
                                                present, zero])
                    value = builder.select(inside, value, zero)
                    values.append(builder.fptrunc(value, halves))
                rows.append(builder.bitcast(builder.shuffle_vector(values[0], values[1],
                                                                   interleave), words_type))
            columns = transposed(builder, rows)
            for lane in range(WORDS):
                target = builder.bitcast(builder.gep(grid, [builder.add(targets[lane], step)]),
                                         words_type.as_pointer())
                if lane == 0:
                    builder.store(columns[lane], target, align=64)
                    continue
                # a block's last pixels only where the plane has them
                with when(builder, function, builder.icmp_signed("<", I64(lane), count),
                          f"pixel{lane}"):
                    builder.store(columns[lane], target, align=64)
    builder.ret_void()


def module(positions: dict[str, int]) -> ir.Module:
    """A module holding ``part`` and ``grid_part`` (`conv_amx_ir.module`'s, over the
    channels-last grid) and ``lines_grid``, the pass making that grid."""
    kernel = LinesConvKernel(AMX_TILE)
    define_parts(kernel, positions)
    define_grid_pass(kernel.module, "lines_grid")
    return kernel.module
