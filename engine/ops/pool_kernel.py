"""Compiled (numba) 2-D windowed max, sum and average pooling on channels-first planes.

`pool`'s NumPy binding pads a copy of the input and reduces strided views of it, one ufunc pass
per kernel offset and axis: ResNet's first pooling (64 × 112², 3×3, stride 2, pad 1) makes seven
passes over 3 MB. Here each plane is read once, in place, an output row at a time:

- down: the input rows under the row's windows are combined column by column (contiguous);
- across: each output combines ``kernel_x`` cells of that padded row, ``stride_x`` apart.

With stride 2 across, the padded row is kept split by parity, input columns 0, 2, 4… in
``evens`` and 1, 3, 5… in ``odds`` (each behind its share of the padding), so that every window
offset reads one contiguous run of one of them: padded cell ``p`` is cell ``p // 2`` of phase
``p % 2``. A loop reading ``row[2 * x]`` with a run-time trip count became gathers, 3× slower.
The commonest window (3 rows, stride 2) is combined and split in one pass.

What LLVM vectorises, measured at ResNet's size: the row buffers are allocated in the kernel,
each on its own (views of one buffer, or buffers passed in, cost 10-30% in run-time alias
checks on every row), and views are made once per call, not per row (their reference counts
cost 20%). Cells no input column reaches hold the padding value (-inf for max, 0 for sums),
written once per call, so no pass tests bounds per element; rows outside the input are left out.

Max propagates NaN as ``np.maximum`` does (a window holding a NaN gives NaN): each combine is
a select on ``b > a or b != b``, never min/max or fastmath. Sums add the window's rows, then its
columns, in the order the NumPy binding does.

numba is imported on first use (`depthwise_kernel.available`); compiled code is cached on disk.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.depthwise_kernel import compile_kernel

_kernels: dict[str, Any] = {}


def max_pool(data: Any, out: Any, kernel_y: int, kernel_x: int, stride_y: int, stride_x: int,
             pad_y: int, pad_x: int) -> None:
    """``out[p, oy, ox]`` = the largest of ``data[p]`` (planes, H, W) over the window at
    (oy·stride_y - pad_y, ox·stride_x - pad_x) of kernel_y × kernel_x cells, cells outside
    ``data`` left out (-inf where none is inside); NaN wins, as in ``np.maximum``."""
    _compiled()["max"](data, out, kernel_y, kernel_x, stride_y, stride_x, pad_y, pad_x)


def sum_pool(data: Any, out: Any, divisor: Any, kernel_y: int, kernel_x: int, stride_y: int,
             stride_x: int, pad_y: int, pad_x: int) -> None:
    """`max_pool`'s windows summed (0 where none is inside), each divided by
    ``divisor[oy, ox]`` when ``divisor`` is (OH, OW), left as sums when it is empty."""
    _compiled()["sum"](data, out, divisor, kernel_y, kernel_x, stride_y, stride_x, pad_y, pad_x)


def _compiled() -> dict[str, Any]:
    """The kernels, compiled on first use. Their helpers are compiled first, into this
    module's namespace, where numba resolves the kernels' calls to them. The hot loops are
    written in the kernels themselves: LLVM vectorised them worse beside helpers inlined in
    numba's IR (and does not vectorise a loop around a call, see depthwise_kernel), so the
    rows the common path does not take are handed to called helpers."""
    if not _kernels:
        for helper in (_row_buffers, _taps):
            globals()[helper.__name__] = compile_kernel(helper, inline="always")
        for helper in (_spread, _max_down, _max_across, _sum_down, _sum_across):
            globals()[helper.__name__] = compile_kernel(helper)
        _kernels["max"] = compile_kernel(_max_pool)
        _kernels["sum"] = compile_kernel(_sum_pool)
    return _kernels


def _row_buffers(width: int, out_width: int, kernel_x: int, stride_x: int, pad_x: int,
                 fill: Any, dtype: Any) -> tuple[Any, Any, Any]:  # pragma: no cover - compiled
    """(evens, odds, column): stride 2's two phases of the padded row and a column buffer;
    other strides, the padded row, an unused cell, and the row's inside as the column."""
    if stride_x == 2:
        cells = max(out_width + (kernel_x - 1) // 2, (width - 1 + pad_x) // 2 + 1)
        return np.full(cells, fill, dtype), np.full(cells, fill, dtype), np.empty(width, dtype)
    padded = np.full(max(pad_x + width, (out_width - 1) * stride_x + kernel_x), fill, dtype)
    return padded, np.full(1, fill, dtype), padded[pad_x:pad_x + width]


def _taps(evens: Any, odds: Any, stride_x: int,
          pad_x: int) -> tuple[Any, Any, Any]:  # pragma: no cover - runs compiled
    """The runs window offsets 0, 1 and 2 read from, at cell ``ox`` for output ``ox`` (strides
    1 and 2; other strides read the padded row ``evens`` at ``ox · stride_x + offset``)."""
    if stride_x != 2:
        return evens, evens[1:], evens[2:]
    if pad_x % 2:  # padded cell 0 is padding before an odd input column
        return odds, evens, odds[1:]
    return evens, odds, evens[1:]


def _spread(column: Any, evens: Any, odds: Any) -> None:  # pragma: no cover - runs compiled
    """``column`` (W) split by parity into ``evens`` and ``odds`` (their input cells)."""
    width = column.shape[0]
    for k in range(width // 2):
        evens[k] = column[2 * k]
        odds[k] = column[2 * k + 1]
    if width % 2:
        evens[width // 2] = column[width - 1]


def _max_pool(data: Any, out: Any, kernel_y: int, kernel_x: int, stride_y: int, stride_x: int,
              pad_y: int, pad_x: int) -> None:  # pragma: no cover - runs compiled
    planes, height, width = data.shape
    evens, odds, column = _row_buffers(width, out.shape[2], kernel_x, stride_x, pad_x, -np.inf,
                                       data.dtype)
    l0, l1, l2 = _taps(evens, odds, stride_x, pad_x)
    even_cells, odd_cells = evens[pad_x // 2:], odds[(pad_x + 1) // 2:]  # input cells, stride 2
    for plane in range(planes):
        source, target = data[plane], out[plane]
        for oy in range(out.shape[1]):
            top = oy * stride_y - pad_y
            first, stop = max(top, 0), min(top + kernel_y, height)
            if stop - first == 3 and stride_x == 2 and width % 2 == 0:
                # ResNet's: down and split in one pass.
                for k in range(width // 2):
                    a, b, c = source[first, 2 * k], source[first + 1, 2 * k], \
                        source[first + 2, 2 * k]
                    a = b if (b > a) | (b != b) else a
                    even_cells[k] = c if (c > a) | (c != c) else a
                    a, b, c = source[first, 2 * k + 1], source[first + 1, 2 * k + 1], \
                        source[first + 2, 2 * k + 1]
                    a = b if (b > a) | (b != b) else a
                    odd_cells[k] = c if (c > a) | (c != c) else a
            else:
                _max_down(source, first, stop, column, even_cells, odd_cells, stride_x)
            if kernel_x == 3 and stride_x <= 2:
                for ox in range(out.shape[2]):
                    a, b, c = l0[ox], l1[ox], l2[ox]
                    a = b if (b > a) | (b != b) else a
                    target[oy, ox] = c if (c > a) | (c != c) else a
            else:
                _max_across(l0, l1, evens, target[oy], kernel_x, stride_x)


def _max_down(source: Any, first: int, stop: int, column: Any, even_cells: Any, odd_cells: Any,
              stride_x: int) -> None:  # pragma: no cover - runs compiled
    """The largest of rows [first, stop) of ``source``, column by column, into ``column``
    (-inf where there are none: the window lies in the padding); split by parity for stride 2.
    """
    if stop - first == 3:
        for x in range(column.shape[0]):
            a, b, c = source[first, x], source[first + 1, x], source[first + 2, x]
            a = b if (b > a) | (b != b) else a
            column[x] = c if (c > a) | (c != c) else a
    else:
        column[:] = -np.inf
        for y in range(first, stop):
            for x in range(column.shape[0]):
                a, b = column[x], source[y, x]
                column[x] = b if (b > a) | (b != b) else a
    if stride_x == 2:
        _spread(column, even_cells, odd_cells)


def _max_across(l0: Any, l1: Any, padded: Any, target: Any, kernel_x: int,
                stride_x: int) -> None:  # pragma: no cover - runs compiled
    """``target[ox]`` = the largest of the padded row's cells ``ox·stride_x + [0, kernel_x)``:
    for strides 1 and 2, offset ``k`` reads run ``l0`` or ``l1`` (`_taps`, by ``k % stride_x``)
    from cell ``k // stride_x``; other strides read ``padded`` itself."""
    target[:] = -np.inf
    for offset in range(kernel_x):
        if stride_x <= 2:  # a contiguous run, as a slice: its index stays non-negative
            run = (l0 if offset % stride_x == 0 else l1)[offset // stride_x:]
            for ox in range(target.shape[0]):
                a, b = target[ox], run[ox]
                target[ox] = b if (b > a) | (b != b) else a
        else:
            run = padded[offset:]
            for ox in range(target.shape[0]):
                a, b = target[ox], run[ox * stride_x]
                target[ox] = b if (b > a) | (b != b) else a


def _sum_pool(data: Any, out: Any, divisor: Any, kernel_y: int, kernel_x: int, stride_y: int,
              stride_x: int, pad_y: int, pad_x: int) -> None:  # pragma: no cover - compiled
    # `_max_pool` with sums, then each window divided by its count.
    planes, height, width = data.shape
    evens, odds, column = _row_buffers(width, out.shape[2], kernel_x, stride_x, pad_x, 0,
                                       data.dtype)
    l0, l1, l2 = _taps(evens, odds, stride_x, pad_x)
    even_cells, odd_cells = evens[pad_x // 2:], odds[(pad_x + 1) // 2:]
    for plane in range(planes):
        source, target = data[plane], out[plane]
        for oy in range(out.shape[1]):
            top = oy * stride_y - pad_y
            first, stop = max(top, 0), min(top + kernel_y, height)
            if stop - first == 3 and stride_x == 2 and width % 2 == 0:
                for k in range(width // 2):
                    even_cells[k] = (source[first, 2 * k] + source[first + 1, 2 * k]
                                     + source[first + 2, 2 * k])
                    odd_cells[k] = (source[first, 2 * k + 1] + source[first + 1, 2 * k + 1]
                                    + source[first + 2, 2 * k + 1])
            else:
                _sum_down(source, first, stop, column, even_cells, odd_cells, stride_x)
            if kernel_x == 3 and stride_x <= 2:
                for ox in range(out.shape[2]):
                    target[oy, ox] = l0[ox] + l1[ox] + l2[ox]
            else:
                _sum_across(l0, l1, evens, target[oy], kernel_x, stride_x)
            if divisor.size:
                for ox in range(out.shape[2]):
                    target[oy, ox] /= divisor[oy, ox]


def _sum_down(source: Any, first: int, stop: int, column: Any, even_cells: Any, odd_cells: Any,
              stride_x: int) -> None:  # pragma: no cover - runs compiled
    """Rows [first, stop) of ``source`` summed into ``column`` (0 where there are none); split
    by parity for stride 2."""
    if stop - first == 3:
        for x in range(column.shape[0]):
            column[x] = source[first, x] + source[first + 1, x] + source[first + 2, x]
    else:
        column[:] = 0
        for y in range(first, stop):
            for x in range(column.shape[0]):
                column[x] += source[y, x]
    if stride_x == 2:
        _spread(column, even_cells, odd_cells)


def _sum_across(l0: Any, l1: Any, padded: Any, target: Any, kernel_x: int,
                stride_x: int) -> None:  # pragma: no cover - runs compiled
    """``target[ox]`` = the sum of the padded row's cells ``ox·stride_x + [0, kernel_x)``
    (read as `_max_across` reads them)."""
    target[:] = 0
    for offset in range(kernel_x):
        if stride_x <= 2:
            run = (l0 if offset % stride_x == 0 else l1)[offset // stride_x:]
            for ox in range(target.shape[0]):
                target[ox] += run[ox]
        else:
            run = padded[offset:]
            for ox in range(target.shape[0]):
                target[ox] += run[ox * stride_x]
