"""`border_taps`: which kernel taps of a window lie inside the image, and the taps product's
rows laid in tiles that walk only those (the AVX2 host's narrow-weight kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import border_taps, gemm_int8
from engine.kernels.int8_conv import Geometry

needs_narrow = pytest.mark.skipif(not gemm_int8.narrow_weights_pay(),
                                  reason="the host runs the VNNI kernels or no AVX2")


def brute_inside(position: int, size: int, kernel: int, stride: int, dilate: int,
                 pad: int) -> list[int]:
    return [t for t in range(kernel) if 0 <= position * stride - pad + t * dilate < size]


@pytest.mark.parametrize(("size", "kernel", "stride", "dilate", "pad"), [
    (7, 3, 1, 1, 1), (14, 3, 2, 1, 1), (224, 7, 2, 1, 3), (9, 3, 1, 2, 2), (3, 3, 1, 1, 4),
    (5, 1, 1, 1, 0), (10, 5, 3, 2, 5)])
def test_the_taps_inside_are_those_reading_the_image(size: int, kernel: int, stride: int,
                                                    dilate: int, pad: int) -> None:
    """Each output position's range equals the taps whose input lies in the image, counted
    one by one; a window wholly in the padding gets an empty range."""
    out = (size + 2 * pad - (kernel - 1) * dilate - 1) // stride + 1
    first, stop = border_taps.inside(np.arange(out), size, kernel, stride, dilate, pad)
    for position in range(out):
        taps = brute_inside(position, size, kernel, stride, dilate, pad)
        assert list(range(first[position], stop[position])) == taps, position


def tap_rows(batch: int, channels: int, size: int, filters: int = 32,
             pad: int = 1) -> tuple[border_taps.TapRows, np.ndarray, int]:
    geometry = Geometry((3, 3), (1, 1), (1, 1), (pad, pad))
    out_h, out_w = geometry.out_size(size, size)
    packed = gemm_int8.PackedWeights(np.ones((9 * channels, filters), np.int8))
    padded = size + 2 * pad
    position = np.arange(batch * out_h * out_w)
    image, within = np.divmod(position, out_h * out_w)
    y, x = np.divmod(within, out_w)
    addresses = ((image * padded + y) * padded + x) * channels
    k = np.arange(0, 9 * channels, 4)
    tap_y, tap_x = np.divmod(k // channels, 3)
    offsets = (tap_y * padded + tap_x) * channels + k % channels
    rows = border_taps.TapRows(addresses, offsets, packed, geometry, (size, size),
                               (out_h, out_w))
    return rows, offsets, out_h * out_w


@needs_narrow
@pytest.mark.parametrize(("batch", "size", "first", "count"), [
    (1, 7, 0, 49), (2, 7, 0, 98), (1, 14, 0, 196), (1, 14, 30, 57), (1, 5, 0, 3),
    (3, 28, 100, 1000)])
def test_every_position_is_listed_once_each_row_with_the_taps_it_needs(
        batch: int, size: int, first: int, count: int) -> None:
    """Each position of the share appears once, its sums to its own row counted from the
    share's first; every whole block's steps cover each of its rows' taps inside the image
    and walk K in order; a short last block's rows each walk exactly their own."""
    rows, offsets, positions = tap_rows(batch, 8, size)
    entries, lists = rows.entries(first, count)
    tile = gemm_int8.NARROW_ROWS
    assert len(entries) == -(-count // tile) * tile
    assert sorted(entries[:count, 1]) == list(range(count))
    by_address = {int(steps.ctypes.data): steps for steps in lists}
    short = count % tile
    for row in range(count):
        position = first + int(entries[row, 1])
        assert entries[row, 0] == rows.addresses[position]
        steps = by_address[int(entries[row, 2])][:entries[row, 3]]
        head = entries[row - row % tile]
        if not (short and row >= count - short):  # a whole block: its first row's steps
            assert tuple(entries[row, 2:]) == tuple(head[2:])
        y, x = divmod(position % positions, rows.out_w)
        (row_first, row_stop), (column_first, column_stop) = rows.rows_range[y], \
            rows.columns_range[x]
        needed = [g for g in range(len(offsets)) if row_first <= rows.tap_y[g] < row_stop
                  and column_first <= rows.tap_x[g] < column_stop]
        walked = list(steps[:, 1] // gemm_int8.weight_offset(rows.packed, 1))
        assert walked == sorted(walked)
        np.testing.assert_array_equal(steps[:, 0], offsets[walked])
        if short and row >= count - short:
            assert walked == needed
        else:
            assert set(needed) <= set(walked)


@needs_narrow
@pytest.mark.parametrize(("batch", "size", "most"), [(1, 7, 0.90), (8, 7, 0.84),
                                                     (1, 14, 0.93), (1, 56, 0.98)])
def test_the_tiles_walk_few_taps_past_those_inside(batch: int, size: int,
                                                   most: float) -> None:
    """The steps the tiles walk, a row counted for each row of its block, against every
    tap of every row: ResNet's 3×3 layers at 7² need 19² of 21² taps (0.82), whole tiles
    of one border class and the mixed few left over come within ``most``."""
    rows, offsets, positions = tap_rows(batch, 8, size)
    count = batch * positions
    entries, _ = rows.entries(0, count)
    walked = int(entries[:count, 3].sum())
    assert walked <= most * count * len(offsets)


@needs_narrow
def test_a_window_wholly_in_the_padding_walks_no_step() -> None:
    """Padding of 4 around a 3² image: 56 of the 81 windows read nothing of it; they make
    one class of whole tiles listing no step (the kernel then writes the offsets alone),
    and no tile of the others walks a tap for them."""
    rows, offsets, positions = tap_rows(1, 4, 3, pad=4)
    entries, _ = rows.entries(0, positions)
    assert positions == 81
    assert (entries[:, 3] == 0).sum() == 56
    assert entries[:positions, 3].sum() < 25 * len(offsets)
