"""Which of a convolution's kernel taps fall inside the image at each output position, and
the rows of the AVX2 host's taps product (`gemm_int8.taps_job`) laid so that its tiles
walk those taps alone.

A window at the image's border reaches into the padding, whose zeros add nothing to an
unsigned product: ResNet's 3×3 layers at 7² have 19² of their 21² taps inside the image a
side, so a product over every tap multiplies 18% zeros (9% at 14², 5% at 28²). OpenVINO's
convolutions skip them; `table_job`'s tiles, which share one list of K steps, cannot. Tiles
of runs of output pixels (`run_taps_ir`: VNNI's requantizing tiles, the bf16 pixel tiles)
read each tap's output rows and columns inside the image from `tap_bounds`.

The positions inside the image on the same kernel rows and columns form a class (at 7², the
25 middle ones, four edges of 5 and four corners). A tile of `gemm_int8.NARROW_ROWS` rows
shares its first row's steps, so `TapRows.entries` lists a share of positions class by
class, the classes with the most taps first, in whole tiles of one class; the few positions
left over from each class go last, sorted so that neighbours share kernel rows, each tile of
them walking the taps any of its rows needs. The sums still go to each position's own row,
so the requantize pass reads them in order. A short last block runs a row at a time
(`gemm_int8_ir.define_task`'s edge), each row on its own taps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.kernels import gemm_int8
from engine.kernels.gemm_int8_avx2_ir import TAP_ENTRY


def inside(positions: np.ndarray, size: int, kernel: int, stride: int, dilate: int,
           pad: int) -> tuple[np.ndarray, np.ndarray]:
    """For output coordinates ``positions`` along one axis, the range ``[first, stop)`` of
    kernel taps whose input lies inside ``[0, size)``: input ``p · stride - pad + t ·
    dilate`` for tap t."""
    start = positions * stride - pad
    first = np.clip(np.where(start < 0, -(start // dilate), 0), 0, kernel)
    stop = np.clip((size - 1 - start) // dilate + 1, 0, kernel)
    return first, np.maximum(stop, first)


def tap_bounds(size: tuple[int, int], out: tuple[int, int], kernel: tuple[int, int],
               stride: tuple[int, int], dilate: tuple[int, int],
               pad: tuple[int, int]) -> np.ndarray:
    """Per tap (kernel row, then column), the first and last output row, then column, whose
    input it reads inside the image of ``size`` (height, width), not in the padding: (taps,
    4) int64s, a first past the last where none does (`run_taps_ir`'s table)."""
    along = []
    for axis in range(2):
        taps = np.arange(kernel[axis])[:, None]
        read = np.arange(out[axis])[None, :] * stride[axis] + taps * dilate[axis] - pad[axis]
        inside = (read >= 0) & (read < size[axis])
        first = np.where(inside.any(1), inside.argmax(1), out[axis])
        last = np.where(inside.any(1), out[axis] - 1 - inside[:, ::-1].argmax(1), -1)
        along.append(np.stack([first, last], 1))
    rows, columns = along
    return np.concatenate([np.repeat(rows, kernel[1], axis=0),
                           np.tile(columns, (kernel[0], 1))], 1).astype(np.int64)


class TapRows:
    """The taps product's row entries for a convolution reading its windows where they lie
    in a padded channels-last copy: ``addresses`` (each output position's window, as
    `int8_conv.FusedConv._window_table` makes them) and ``group_offsets`` (each K group's
    byte offset in a window, K ordered kernel row, kernel column, channel) of ``packed``.
    ``image`` (height, width) and ``out`` (height, width) are the data's and output's sizes,
    ``geometry`` the convolution's (`int8_conv.Geometry`)."""

    def __init__(self, addresses: np.ndarray, group_offsets: np.ndarray,
                 packed: gemm_int8.PackedWeights, geometry: Any, image: tuple[int, int],
                 out: tuple[int, int]) -> None:
        self.addresses, self.packed = addresses, packed
        kernel_h, kernel_w = geometry.kernel
        channels = packed.groups * 4 // (kernel_h * kernel_w)
        tap = np.arange(packed.groups) * 4 // channels
        self.tap_y, self.tap_x = np.divmod(tap, kernel_w)
        self.group_offsets = group_offsets
        out_h, out_w = out
        rows_first, rows_stop = inside(np.arange(out_h), image[0], kernel_h, geometry.stride[0],
                                       geometry.dilate[0], geometry.pad[0])
        columns_first, columns_stop = inside(np.arange(out_w), image[1], kernel_w,
                                             geometry.stride[1], geometry.dilate[1],
                                             geometry.pad[1])
        self.out_h, self.out_w = out_h, out_w
        self.rows_range = np.stack([rows_first, rows_stop], 1)
        self.columns_range = np.stack([columns_first, columns_stop], 1)
        self._steps: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
        self._entries: dict[tuple[int, int], tuple[np.ndarray, list[np.ndarray]]] = {}

    def classes(self, positions: np.ndarray) -> np.ndarray:
        """Each position's class: its taps' (first row, row stop, first column, column
        stop), int64 (len, 4); all zero for a window wholly in the padding."""
        y, x = np.divmod(positions % (self.out_h * self.out_w), self.out_w)
        classes = np.concatenate([self.rows_range[y], self.columns_range[x]], 1)
        classes[(classes[:, 0] == classes[:, 1]) | (classes[:, 2] == classes[:, 3])] = 0
        return classes

    def steps(self, box: tuple[int, ...]) -> tuple[np.ndarray, int]:
        """The K steps of the taps in ``box`` (rows ``[box[0], box[1])``, columns
        ``[box[2], box[3])``), in K's order: each group's offset in the window and its
        weights' offset in a panel, and how many (an array of one row where there are
        none, so that it has an address); made once a box."""
        if box not in self._steps:
            row_first, row_stop, column_first, column_stop = box
            groups = np.flatnonzero((self.tap_y >= row_first) & (self.tap_y < row_stop)
                                    & (self.tap_x >= column_first) & (self.tap_x < column_stop))
            steps = np.zeros((max(len(groups), 1), 2), np.int64)
            steps[:len(groups), 0] = self.group_offsets[groups]
            steps[:len(groups), 1] = gemm_int8.weight_offset(self.packed, groups)
            self._steps[box] = steps, len(groups)
        return self._steps[box]

    def entries(self, first: int, count: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """The entries for output positions ``[first, first + count)`` (sums rows counted
        from ``first``), whole blocks, and the step arrays they point into; made once a
        share (a chained layer binds each share's product over every core's region)."""
        if (first, count) not in self._entries:
            self._entries[first, count] = self._laid(first, count)
        return self._entries[first, count]

    def _laid(self, first: int, count: int) -> tuple[np.ndarray, list[np.ndarray]]:
        rows = self.packed.rows
        positions = np.arange(first, first + count)
        classes = self.classes(positions)
        keys, inverse, sizes = np.unique(classes, axis=0, return_inverse=True,
                                         return_counts=True)
        taps = (keys[:, 1] - keys[:, 0]) * (keys[:, 3] - keys[:, 2])
        tiled, left = [], []
        for key in np.lexsort((-sizes, -taps)):  # most taps first, then the most positions
            members = positions[inverse.reshape(-1) == key]
            cut = len(members) // rows * rows
            tiled.append(members[:cut])
            left.append(members[cut:])
        leftover = np.concatenate(left)
        order = np.lexsort(classes[leftover - first].T[::-1])  # kernel rows, then columns
        ordered = np.concatenate([*tiled, leftover[order]])
        blocks = -(-count // rows)
        entries = np.zeros((blocks * rows, TAP_ENTRY), np.int64)
        entries[:count, 0] = self.addresses[ordered]
        entries[:count, 1] = ordered - first
        # each row's box of taps: its block's (the taps any of its rows needs, a window
        # wholly in the padding needing none), or on a short last block (run a row at a
        # time on the edge tile) its own
        listed = classes[ordered - first]
        whole = count // rows * rows
        tiles = listed[:whole].reshape(-1, rows, 4)
        empty = (tiles[:, :, 1] == tiles[:, :, 0])[:, :, None]
        lows = np.where(empty, np.iinfo(np.int64).max, tiles).min(axis=1)
        highs = np.where(empty, -1, tiles).max(axis=1)
        per_block = np.stack([lows[:, 0], highs[:, 1], lows[:, 2], highs[:, 3]], 1)
        per_block[per_block[:, 1] < 0] = 0
        boxes = np.concatenate([np.repeat(per_block, rows, axis=0), listed[whole:]])
        unique, which = np.unique(boxes, axis=0, return_inverse=True)
        held = [self.steps(tuple(int(v) for v in box)) for box in unique]
        table = np.array([(steps.ctypes.data, taken) for steps, taken in held], np.int64)
        entries[:count, 2:] = table[which.reshape(-1)]
        # rows past the last, up to a whole block: never computed (a short last block runs
        # a row at a time), but read as addresses all the same
        entries[count:] = entries[count - 1] if count else 0
        return entries, [steps for steps, _ in held]
