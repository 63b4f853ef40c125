"""Compiled (numba) 2-D windowed max, sum and average pooling on channels-first planes.

`pool`'s NumPy binding pads a copy of the input and reduces strided views of it, one ufunc pass
per kernel offset and axis: ResNet's first pooling (64 × 112², 3×3, stride 2, pad 1) makes seven
passes over 3 MB. Here each plane is read once, in place, an output row at a time:

- down: the input rows under the row's windows are combined into ``column`` (W), contiguous;
- spread: ``column`` is dealt into ``lines`` (stride_x, Q), the padded row split by phase:
  padded column ``p`` is cell ``p // stride_x`` of line ``p % stride_x``;
- across: window offset ``kx`` of every output then reads one contiguous run, cells
  ``[kx // stride_x, …)`` of line ``kx % stride_x``.

Contiguous runs are what LLVM vectorises: a loop reading ``row[2 * x]`` with a run-time trip
count became gathers, 3× slower than this. The cells of ``lines`` no input column reaches hold
the padding value (-inf for max, 0 for sums), written once per call, so no pass tests bounds per
element; rows outside the input are left out of the down pass.

Max propagates NaN as ``np.maximum`` does (a window holding a NaN gives NaN): each combine is
a select on ``b > a or b != b``, never min/max or fastmath. Sums add the window's rows, then its
columns, in the order the NumPy binding does.

Measured on ResNet-18's pooling0 (batch 1, one thread): see docs/benchmarks.md.
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
    lines = np.full(_phase_shape(data.shape[2], out.shape[2], kernel_x, stride_x, pad_x), -np.inf,
                    data.dtype)
    _compiled()["max"](data, out, lines, kernel_y, kernel_x, stride_y, pad_y, pad_x)


def sum_pool(data: Any, out: Any, divisor: Any, kernel_y: int, kernel_x: int, stride_y: int,
             stride_x: int, pad_y: int, pad_x: int) -> None:
    """`max_pool`'s windows summed (0 where none is inside), each divided by
    ``divisor[oy, ox]`` when ``divisor`` is (OH, OW), left as sums when it is empty."""
    lines = np.zeros(_phase_shape(data.shape[2], out.shape[2], kernel_x, stride_x, pad_x),
                     data.dtype)
    _compiled()["sum"](data, out, divisor, lines, kernel_y, kernel_x, stride_y, pad_y, pad_x)


def _compiled() -> dict[str, Any]:
    """The kernels, compiled on first use. Their helpers are compiled first, into this
    module's namespace, where numba resolves the kernels' calls to them: inlined in numba's
    IR, so that LLVM sees each kernel as one function (around a call it may not vectorise a
    loop, see depthwise_kernel)."""
    if not _kernels:
        for helper in (_spread, _first_taps, _max_rows, _sum_rows, _max_across, _sum_across):
            globals()[helper.__name__] = compile_kernel(helper, inline="always")
        _kernels["max"] = compile_kernel(_max_pool)
        _kernels["sum"] = compile_kernel(_sum_pool)
    return _kernels


def _phase_shape(width: int, out_width: int, kernel_x: int, stride_x: int,
                 pad_x: int) -> tuple[int, int]:
    """(lines, cells) of the phase layout: room for every input column and every window."""
    cells = max(out_width + (kernel_x - 1) // stride_x, (width - 1 + pad_x) // stride_x + 1)
    return stride_x, cells


def _spread(column: Any, lines: Any, pad_x: int) -> None:  # pragma: no cover - runs compiled
    """``column`` (the combined rows, W) into the phase lines; stride 1's column is the line."""
    stride_x, width = lines.shape[0], column.shape[0]
    if stride_x == 2:  # both phases in one loop: each load pair one contiguous run
        low = lines[pad_x % 2, pad_x // 2:]  # input columns 0, 2, 4…
        high = lines[(pad_x + 1) % 2, (pad_x + 1) // 2:]
        for k in range(width // 2):
            low[k] = column[2 * k]
            high[k] = column[2 * k + 1]
        if width % 2:
            low[width // 2] = column[width - 1]
    elif stride_x > 2:
        for phase in range(stride_x):
            first = (phase - pad_x) % stride_x  # the first input column in this phase
            run = lines[phase, (first + pad_x) // stride_x:]
            for k in range((width - first + stride_x - 1) // stride_x):
                run[k] = column[first + k * stride_x]


def _max_pool(data: Any, out: Any, lines: Any, kernel_y: int, kernel_x: int, stride_y: int,
              pad_y: int, pad_x: int) -> None:  # pragma: no cover - runs compiled
    planes, height, width = data.shape
    stride_x = lines.shape[0]
    column = lines[0, pad_x:pad_x + width] if stride_x == 1 else np.empty(width, data.dtype)
    # Views made once: made per row, their reference counting costs 20% at ResNet's size.
    low, high = lines[pad_x % 2, pad_x // 2:], lines[(pad_x + 1) % 2, (pad_x + 1) // 2:]
    taps = _first_taps(lines)
    for plane in range(planes):
        source, target = data[plane], out[plane]
        for oy in range(out.shape[1]):
            top = oy * stride_y - pad_y
            first, stop = max(top, 0), min(top + kernel_y, height)
            if stop - first == 3 and stride_x == 2:
                # The commonest window (ResNet's): down and spread in one pass, each pair of
                # columns one contiguous load per row.
                for k in range(width // 2):
                    a, b, c = (source[first, 2 * k], source[first + 1, 2 * k],
                               source[first + 2, 2 * k])
                    a = b if (b > a) | (b != b) else a
                    low[k] = c if (c > a) | (c != c) else a
                    a, b, c = (source[first, 2 * k + 1], source[first + 1, 2 * k + 1],
                               source[first + 2, 2 * k + 1])
                    a = b if (b > a) | (b != b) else a
                    high[k] = c if (c > a) | (c != c) else a
                if width % 2:
                    _max_rows(source[:, width - 1:], first, stop, column[width - 1:])
                    low[width // 2] = column[width - 1]
            else:
                _max_rows(source, first, stop, column)
                _spread(column, lines, pad_x)
            _max_across(lines, taps, target, oy, kernel_x)


def _first_taps(lines: Any) -> tuple[Any, Any, Any]:  # pragma: no cover - runs compiled
    """The runs offsets 0, 1 and 2 of a window read (see `_max_across`)."""
    stride_x = lines.shape[0]
    return lines[0], lines[1 % stride_x, 1 // stride_x:], lines[2 % stride_x, 2 // stride_x:]


def _max_rows(source: Any, first: int, stop: int,
              column: Any) -> None:  # pragma: no cover - runs compiled
    """The largest of rows [first, stop) of ``source``, cell by cell, into ``column``; -inf
    where there are none (the window lies in the padding)."""
    if stop - first == 3:
        for x in range(column.shape[0]):
            a, b, c = source[first, x], source[first + 1, x], source[first + 2, x]
            a = b if (b > a) | (b != b) else a
            column[x] = c if (c > a) | (c != c) else a
        return
    column[:] = -np.inf
    for y in range(first, stop):
        for x in range(column.shape[0]):
            a, b = column[x], source[y, x]
            column[x] = b if (b > a) | (b != b) else a


def _max_across(lines: Any, taps: Any, target: Any, oy: int,
                kernel_x: int) -> None:  # pragma: no cover - runs compiled
    """``target[oy, ox]`` = the largest of the padded row's cells ``ox·stride_x + [0, kernel_x)``:
    offset ``k`` is cell ``ox + k // stride_x`` of line ``k % stride_x``."""
    stride_x = lines.shape[0]
    if kernel_x == 3:
        l0, l1, l2 = taps
        for ox in range(target.shape[1]):
            a, b, c = l0[ox], l1[ox], l2[ox]
            a = b if (b > a) | (b != b) else a
            target[oy, ox] = c if (c > a) | (c != c) else a
        return
    target[oy] = lines[0, :target.shape[1]]
    for offset in range(1, kernel_x):
        run = lines[offset % stride_x, offset // stride_x:]  # a slice: its index never negative
        for ox in range(target.shape[1]):
            a, b = target[oy, ox], run[ox]
            target[oy, ox] = b if (b > a) | (b != b) else a


def _sum_pool(data: Any, out: Any, divisor: Any, lines: Any, kernel_y: int, kernel_x: int,
              stride_y: int, pad_y: int, pad_x: int) -> None:  # pragma: no cover - compiled
    # `_max_pool` with sums, then each window divided by its count.
    planes, height, width = data.shape
    stride_x = lines.shape[0]
    column = lines[0, pad_x:pad_x + width] if stride_x == 1 else np.empty(width, data.dtype)
    low, high = lines[pad_x % 2, pad_x // 2:], lines[(pad_x + 1) % 2, (pad_x + 1) // 2:]
    taps = _first_taps(lines)
    for plane in range(planes):
        source, target = data[plane], out[plane]
        for oy in range(out.shape[1]):
            top = oy * stride_y - pad_y
            first, stop = max(top, 0), min(top + kernel_y, height)
            if stop - first == 3 and stride_x == 2:
                for k in range(width // 2):
                    low[k] = (source[first, 2 * k] + source[first + 1, 2 * k]
                              + source[first + 2, 2 * k])
                    high[k] = (source[first, 2 * k + 1] + source[first + 1, 2 * k + 1]
                               + source[first + 2, 2 * k + 1])
                if width % 2:
                    _sum_rows(source[:, width - 1:], first, stop, column[width - 1:])
                    low[width // 2] = column[width - 1]
            else:
                _sum_rows(source, first, stop, column)
                _spread(column, lines, pad_x)
            _sum_across(lines, taps, target, oy, kernel_x)
            if divisor.size:
                for ox in range(out.shape[2]):
                    target[oy, ox] /= divisor[oy, ox]


def _sum_rows(source: Any, first: int, stop: int,
              column: Any) -> None:  # pragma: no cover - runs compiled
    """Rows [first, stop) of ``source`` summed into ``column`` (0 where there are none)."""
    if stop - first == 3:
        for x in range(column.shape[0]):
            column[x] = source[first, x] + source[first + 1, x] + source[first + 2, x]
        return
    column[:] = 0
    for y in range(first, stop):
        for x in range(column.shape[0]):
            column[x] += source[y, x]


def _sum_across(lines: Any, taps: Any, target: Any, oy: int,
                kernel_x: int) -> None:  # pragma: no cover - runs compiled
    """``target[oy, ox]`` = the sum of the padded row's cells ``ox·stride_x + [0, kernel_x)``
    (laid out as `_max_across` reads them)."""
    stride_x = lines.shape[0]
    if kernel_x == 3:
        l0, l1, l2 = taps
        for ox in range(target.shape[1]):
            target[oy, ox] = l0[ox] + l1[ox] + l2[ox]
        return
    target[oy] = lines[0, :target.shape[1]]
    for offset in range(1, kernel_x):
        run = lines[offset % stride_x, offset // stride_x:]
        for ox in range(target.shape[1]):
            target[oy, ox] += run[ox]
