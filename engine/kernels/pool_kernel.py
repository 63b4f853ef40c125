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

Max propagates NaN as ``np.maximum`` does (a window holding a NaN gives NaN), never by
fastmath: each combine of two or three cells is a plain ordered maximum (a vector max
instruction) beside one unordered test of all its cells, and where that test holds the cells'
sum, which is NaN, is taken instead (`_max3`). A select on ``b > a or b != b`` per pair costs a
compare, an unordered compare, an or and a blend a pair; this is a max and an unordered compare
a pair and one blend per combine: 64 × 112², 3×3 stride 2, one thread, 0.22 → 0.18 ms. Sums add
the window's rows, then its columns, in the order the NumPy binding does.

numba is imported on first use (`engine.cpu.compiled`); compiled code is cached on disk.
`max_pool` and `MaxPoolCall` hand float32 3×3 stride-2 pad-1 windows (ResNet's) to
`max_pool_vector`'s AVX-512 task where the host runs it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs
from engine.cpu.compiled import compile_kernel, compiled_once
from engine.cpu.parts import PartedCall
from engine.kernels import max_pool_vector

_kernels: dict[str, Any] = {}


# Where these kernels beat the NumPy binding, measured one thread, best of 60 interleaved:
# windows at least COMPILED_MIN_KERNEL wide over output rows of COMPILED_MIN_OUT_WIDTH or more
# (3×3 stride 2: 64 × 112² 0.14 ms against 0.56, 512 × 14² 0.077 against 0.17; 3×3 stride 1:
# 192 × 28² 0.16 against 0.24, 832 × 7² a tie), narrower windows only from
# COMPILED_NARROW_CELLS input cells per plane, where NumPy's passes stream out of cache (2×2
# stride 2: 128 × 112² 0.51 against 0.66; at 56² 0.21 against 0.16, at 14² 0.12 against 0.06:
# short rows cost more than NumPy's few passes with no padded copy). A 7×7 window over 7² (one
# output per row) loses too: 0.10 against 0.055.
COMPILED_MIN_KERNEL = 3
COMPILED_MIN_OUT_WIDTH = 7
COMPILED_NARROW_CELLS = 112 * 112


def applies(data: Any, out: Any, window: tuple[int, ...]) -> bool:
    """Whether these kernels run a bound channels-first pooling of ``data`` into ``out``
    over ``window`` (its kernel's size): 2-D, float32/64, contiguous, not empty, numba
    installed, and a size where they win (`COMPILED_MIN_KERNEL`)."""
    if not (data.ndim == 4 and data.size > 0 and out.size > 0
            and data.dtype in compiled.COMPILED_DTYPES and out.dtype == data.dtype
            and data.flags.c_contiguous and out.flags.c_contiguous and compiled.available()):
        return False
    wide = window[1] >= COMPILED_MIN_KERNEL and out.shape[3] >= COMPILED_MIN_OUT_WIDTH
    return wide or data.shape[2] * data.shape[3] >= COMPILED_NARROW_CELLS


def max_pool(data: Any, out: Any, kernel_y: int, kernel_x: int, stride_y: int, stride_x: int,
             pad_y: int, pad_x: int) -> None:
    """``out[p, oy, ox]`` = the largest of ``data[p]`` (planes, H, W) over the window at
    (oy·stride_y - pad_y, ox·stride_x - pad_x) of kernel_y × kernel_x cells, cells outside
    ``data`` left out (-inf where none is inside); NaN wins, as in ``np.maximum``. ResNet's
    float32 3×3 stride-2 pad-1 pooling runs `max_pool_vector`'s task where it applies."""
    window = (kernel_y, kernel_x, stride_y, stride_x, pad_y, pad_x)
    if max_pool_vector.applies(data, out, window):
        max_pool_vector.max_pool(data, out)
        return
    kernel = "max pairs" if _pairs(data, kernel_x, stride_x) else "max"
    _compiled()[kernel](data, out, *window)


class MaxPoolCall(PartedCall):
    """A bound `max_pool` (``MaxPoolCall(max_pool, data, out, *window)``), run as a job of
    parts over the planes where the spin pool runs it: ResNet's pooling after the stem (64 ×
    112²) is a pass no step before or after it shares out."""

    leaves_blas_alone = True

    def as_job(self, workspace: Any) -> Any:
        data, out, *window = self.args
        if max_pool_vector.applies(data, out, tuple(window)):
            return max_pool_vector.job(data, out)
        _, kernel_x, _, stride_x, *_ = window
        planes = data.shape[0]
        return kernel_jobs.bind((__name__, "max planes"),
                                (data, out, *window, int(_pairs(data, kernel_x, stride_x))),
                                planes, kernel_jobs.parts_for(planes, data.size + out.size))


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`kernel_jobs` runs "max planes" as a job), compiled on first
    use."""
    return _compiled()


def sum_pool(data: Any, out: Any, divisor: Any, kernel_y: int, kernel_x: int, stride_y: int,
             stride_x: int, pad_y: int, pad_x: int) -> None:
    """`max_pool`'s windows summed (0 where none is inside), each divided by
    ``divisor[oy, ox]`` when ``divisor`` is (OH, OW), left as sums when it is empty."""
    kernel = "sum pairs" if _pairs(data, kernel_x, stride_x) else "sum"
    _compiled()[kernel](data, out, divisor, kernel_y, kernel_x, stride_y, stride_x, pad_y,
                        pad_x)


def _pairs(data: Any, kernel_x: int, stride_x: int) -> bool:
    """Whether the kernel for 3-wide windows, stride 2 across, over even rows runs this."""
    return kernel_x == 3 and stride_x == 2 and data.shape[2] % 2 == 0


def _compiled() -> dict[str, Any]:
    """The kernels, compiled on first use. Their helpers are compiled first, into this
    module's namespace, where numba resolves the kernels' calls to them; most are inlined in
    numba's IR. The pairs kernels keep their hot loops in themselves and call `_max_down`
    and `_sum_down` (not inlined) for the rows those loops do not take: beside inlined
    helpers LLVM vectorised them 20% worse."""
    return compiled_once(_kernels, _compile)


def _compile() -> dict[str, Any]:
    for helper in (_max2, _max3, _row_buffers, _taps, _spread, _max_rows, _max_across,
                   _sum_rows, _sum_across):
        globals()[helper.__name__] = compile_kernel(helper, inline="always")
    for helper in (_max_down, _sum_down, _max_pool, _max_pool_pairs):
        globals()[helper.__name__] = compile_kernel(helper)
    return {"max": globals()["_max_pool"], "max pairs": globals()["_max_pool_pairs"],
            "max planes": compile_kernel(_max_pool_planes),
            **{name: compile_kernel(kernel)
               for name, kernel in (("sum", _sum_pool), ("sum pairs", _sum_pool_pairs))}}


def _max2(a: Any, b: Any) -> Any:  # pragma: no cover - runs compiled
    """The larger of ``a`` and ``b`` (``a`` where equal), NaN where either is (their sum)."""
    larger = b if b > a else a
    return a + b if (a != a) | (b != b) else larger


def _max3(a: Any, b: Any, c: Any) -> Any:  # pragma: no cover - runs compiled
    """`_max2` of three: the ordered maximum, NaN where any of them is (their sum, NaN
    whatever the others hold: a sum is only taken where one is NaN)."""
    larger = b if b > a else a
    larger = c if c > larger else larger
    return a + b + c if (a != a) | (b != b) | (c != c) else larger


def _row_buffers(width: int, out_width: int, kernel_x: int, stride_x: int, pad_x: int,
                 fill: Any, dtype: Any) -> tuple[Any, Any, Any]:  # pragma: no cover - compiled
    """(evens, odds, column). Stride 2: the input's even and odd columns, each behind its
    share of the padding (between them the padded row's two phases, see `_taps`), and a
    column buffer. Other strides: the padded row, an unused cell, and the row's inside."""
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
    l0, l1, l2 = _taps(evens, odds, stride_x, pad_x)  # unpacked once: per row, 5% slower
    even_cells, odd_cells = evens[pad_x // 2:], odds[(pad_x + 1) // 2:]  # input cells, stride 2
    for plane in range(planes):
        source, target = data[plane], out[plane]
        for oy in range(out.shape[1]):
            top = oy * stride_y - pad_y
            _max_rows(source, max(top, 0), min(top + kernel_y, height), column)
            if stride_x == 2:
                _spread(column, even_cells, odd_cells)
            _max_across(l0, l1, l2, evens, target, oy, kernel_x, stride_x)


def _max_pool_planes(data: Any, out: Any, kernel_y: int, kernel_x: int, stride_y: int,
                     stride_x: int, pad_y: int, pad_x: int, pairs: int, first: int,
                     last: int) -> None:  # pragma: no cover - runs compiled
    """`max_pool` over planes [first, last): a job's part (`MaxPoolCall`)."""
    if pairs:
        _max_pool_pairs(data[first:last], out[first:last], kernel_y, kernel_x, stride_y,
                        stride_x, pad_y, pad_x)
    else:
        _max_pool(data[first:last], out[first:last], kernel_y, kernel_x, stride_y, stride_x,
                  pad_y, pad_x)


def _max_pool_pairs(data: Any, out: Any, kernel_y: int, kernel_x: int, stride_y: int,
                    stride_x: int, pad_y: int, pad_x: int) -> None:  # pragma: no cover
    # `_max_pool` for 3-wide windows, stride 2 across, even rows: ResNet's. The rows of a
    # 3-row window are combined and split in one pass.
    planes, height, width = data.shape
    evens, odds, column = _row_buffers(width, out.shape[2], 3, 2, pad_x, -np.inf, data.dtype)
    l0, l1, l2 = _taps(evens, odds, 2, pad_x)
    even_cells, odd_cells = evens[pad_x // 2:], odds[(pad_x + 1) // 2:]
    for plane in range(planes):
        source, target = data[plane], out[plane]
        for oy in range(out.shape[1]):
            top = oy * stride_y - pad_y
            first, stop = max(top, 0), min(top + kernel_y, height)
            if stop - first == 3:
                for k in range(width // 2):
                    a, b, c = source[first, 2 * k], source[first + 1, 2 * k], \
                        source[first + 2, 2 * k]
                    even_cells[k] = _max3(a, b, c)
                    a, b, c = source[first, 2 * k + 1], source[first + 1, 2 * k + 1], \
                        source[first + 2, 2 * k + 1]
                    odd_cells[k] = _max3(a, b, c)
            else:
                _max_down(source, first, stop, column, even_cells, odd_cells)
            for ox in range(out.shape[2]):
                a, b, c = l0[ox], l1[ox], l2[ox]
                target[oy, ox] = _max3(a, b, c)


def _max_down(source: Any, first: int, stop: int, column: Any, even_cells: Any,
              odd_cells: Any) -> None:  # pragma: no cover - runs compiled
    """`_max_rows`, then split by parity (`_spread`)."""
    _max_rows(source, first, stop, column)
    _spread(column, even_cells, odd_cells)


def _max_rows(source: Any, first: int, stop: int,
              column: Any) -> None:  # pragma: no cover - runs compiled
    """The largest of rows [first, stop) of ``source``, column by column, into ``column``;
    -inf where there are none (the window lies in the padding)."""
    if stop - first == 3:
        for x in range(column.shape[0]):
            a, b, c = source[first, x], source[first + 1, x], source[first + 2, x]
            column[x] = _max3(a, b, c)
        return
    if stop - first == 2:
        for x in range(column.shape[0]):
            a, b = source[first, x], source[first + 1, x]
            column[x] = _max2(a, b)
        return
    column[:] = -np.inf
    for y in range(first, stop):
        for x in range(column.shape[0]):
            a, b = column[x], source[y, x]
            column[x] = _max2(a, b)


def _max_across(l0: Any, l1: Any, l2: Any, padded: Any, target: Any, oy: int, kernel_x: int,
                stride_x: int) -> None:  # pragma: no cover - runs compiled
    """``target[oy, ox]`` = the largest of the padded row's cells ``ox·stride_x + [0, kernel_x)``:
    for strides 1 and 2, offset ``k`` reads run ``l0`` or ``l1`` (`_taps`, by ``k % stride_x``)
    from cell ``k // stride_x``; other strides read ``padded`` itself."""
    if kernel_x == 3 and stride_x <= 2:
        for ox in range(target.shape[1]):
            a, b, c = l0[ox], l1[ox], l2[ox]
            target[oy, ox] = _max3(a, b, c)
        return
    if kernel_x == 2 and stride_x <= 2:  # VGG's, DenseNet's: one pass too
        for ox in range(target.shape[1]):
            a, b = l0[ox], l1[ox]
            target[oy, ox] = _max2(a, b)
        return
    target[oy] = -np.inf
    for offset in range(kernel_x):
        if stride_x <= 2:  # a contiguous run, as a slice: its index stays non-negative
            run = (l0 if offset % stride_x == 0 else l1)[offset // stride_x:]
            for ox in range(target.shape[1]):
                a, b = target[oy, ox], run[ox]
                target[oy, ox] = _max2(a, b)
        else:
            run = padded[offset:]
            for ox in range(target.shape[1]):
                a, b = target[oy, ox], run[ox * stride_x]
                target[oy, ox] = _max2(a, b)


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
            _sum_rows(source, max(top, 0), min(top + kernel_y, height), column)
            if stride_x == 2:
                _spread(column, even_cells, odd_cells)
            _sum_across(l0, l1, l2, evens, target, oy, kernel_x, stride_x)
            if divisor.size:
                for ox in range(out.shape[2]):
                    target[oy, ox] /= divisor[oy, ox]


def _sum_pool_pairs(data: Any, out: Any, divisor: Any, kernel_y: int, kernel_x: int,
                    stride_y: int, stride_x: int, pad_y: int,
                    pad_x: int) -> None:  # pragma: no cover - runs compiled
    # `_max_pool_pairs` with sums, then each window divided by its count.
    planes, height, width = data.shape
    evens, odds, column = _row_buffers(width, out.shape[2], 3, 2, pad_x, 0, data.dtype)
    l0, l1, l2 = _taps(evens, odds, 2, pad_x)
    even_cells, odd_cells = evens[pad_x // 2:], odds[(pad_x + 1) // 2:]
    for plane in range(planes):
        source, target = data[plane], out[plane]
        for oy in range(out.shape[1]):
            top = oy * stride_y - pad_y
            first, stop = max(top, 0), min(top + kernel_y, height)
            if stop - first == 3:
                for k in range(width // 2):
                    even_cells[k] = (source[first, 2 * k] + source[first + 1, 2 * k]
                                     + source[first + 2, 2 * k])
                    odd_cells[k] = (source[first, 2 * k + 1] + source[first + 1, 2 * k + 1]
                                    + source[first + 2, 2 * k + 1])
            else:
                _sum_down(source, first, stop, column, even_cells, odd_cells)
            for ox in range(out.shape[2]):
                target[oy, ox] = l0[ox] + l1[ox] + l2[ox]
            if divisor.size:
                for ox in range(out.shape[2]):
                    target[oy, ox] /= divisor[oy, ox]


def _sum_down(source: Any, first: int, stop: int, column: Any, even_cells: Any,
              odd_cells: Any) -> None:  # pragma: no cover - runs compiled
    """`_sum_rows`, then split by parity (`_spread`)."""
    _sum_rows(source, first, stop, column)
    _spread(column, even_cells, odd_cells)


def _sum_rows(source: Any, first: int, stop: int,
              column: Any) -> None:  # pragma: no cover - runs compiled
    """Rows [first, stop) of ``source`` summed into ``column`` (0 where there are none)."""
    if stop - first == 3:
        for x in range(column.shape[0]):
            column[x] = source[first, x] + source[first + 1, x] + source[first + 2, x]
        return
    if stop - first == 2:
        for x in range(column.shape[0]):
            column[x] = source[first, x] + source[first + 1, x]
        return
    column[:] = 0
    for y in range(first, stop):
        for x in range(column.shape[0]):
            column[x] += source[y, x]


def _sum_across(l0: Any, l1: Any, l2: Any, padded: Any, target: Any, oy: int, kernel_x: int,
                stride_x: int) -> None:  # pragma: no cover - runs compiled
    """``target[oy, ox]`` = the sum of the padded row's cells ``ox·stride_x + [0, kernel_x)``
    (read as `_max_across` reads them)."""
    if kernel_x == 3 and stride_x <= 2:
        for ox in range(target.shape[1]):
            target[oy, ox] = l0[ox] + l1[ox] + l2[ox]
        return
    if kernel_x == 2 and stride_x <= 2:
        for ox in range(target.shape[1]):
            target[oy, ox] = l0[ox] + l1[ox]
        return
    target[oy] = 0
    for offset in range(kernel_x):
        if stride_x <= 2:
            run = (l0 if offset % stride_x == 0 else l1)[offset // stride_x:]
            for ox in range(target.shape[1]):
                target[oy, ox] += run[ox]
        else:
            run = padded[offset:]
            for ox in range(target.shape[1]):
                target[oy, ox] += run[ox * stride_x]
