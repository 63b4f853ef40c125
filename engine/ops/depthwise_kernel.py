"""A compiled (numba) kernel for 2-D depthwise convolution over flat rows of a padded grid.

`depthwise_bind` lays each channel's padded input out so that tap ``k`` of every output reads
the contiguous run ``flat[offset_k : offset_k + L]`` (the phase layout). NumPy has to copy those
runs into a patch array and reduce it with a stacked matmul; compiled, the sum is a loop over
taps of a vectorised multiply-add into one row that stays in L1, and the valid outputs are
written straight from it. Measured on MobileNet v2's depthwise layers at batch 1, one thread,
interleaved with the NumPy binding (input copy and copy-out included in both):

    channels × size   NumPy bind   this kernel
    144 × 56²         1.11 ms      0.62 ms
    32 × 112²         0.79 ms      0.45 ms
    576 × 14²         0.37 ms      0.19 ms
    960 × 7²          0.22 ms      0.13 ms

numba is imported on first use; `available()` is False where it is not installed, and the
NumPy binding runs instead. Compiled code is cached on disk beside this module when writable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # numba has no float16
_kernels: dict[str, Any] = {}  # the compiled functions, once made


def available() -> bool:
    """Whether numba can be imported (the kernels are compiled on their first call)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def depthwise_rows(flat: Any, offsets: Any, weights: Any, bias: Any, out: Any,
                   grid_width: int, low: Any, high: Any) -> None:
    """``out[p, y, x] = bias[c] + Σₖ weights[c, k] · flat[p, offsets[k] + y·grid_width + x]``
    for every plane ``p`` (sample-major, ``c = p % channels``), clamped to [low, high] as
    ``clip`` does (NaN stays NaN); ±inf bounds leave it as it is.

    ``flat`` (planes, cells) holds each plane's input on the phase grid; ``weights``
    (channels, taps), ``bias`` (channels,) and the bounds have the data's dtype; ``out`` is
    (planes, H, W).
    """
    _compiled()["rows"](flat, offsets, weights, bias, out, grid_width, low, high)


def depthwise_planes(data: Any, grid: Any, offsets: Any, weights: Any, bias: Any, out: Any,
                     pad_y: int, pad_x: int, low: Any, high: Any) -> None:
    """`depthwise_rows`, reading the input ``data`` (planes, H, W) itself: each plane is first
    copied into ``grid`` (sy, sx, QH, QW), one plane's phase grid, zero outside the cells the
    input fills (the caller zeroes it once; only those cells are written), while it is in cache.
    """
    _compiled()["planes"](data, grid, offsets, weights, bias, out, pad_y, pad_x, low, high)


def depthwise_same_3x3(data: Any, offsets: Any, weights: Any, bias: Any, out: Any, low: Any,
                       high: Any) -> None:
    """`depthwise_rows` for a 3×3, stride-1, pad-1 convolution, reading ``data`` (planes, H, W)
    itself: no phase grid at all. ``offsets`` are ``ky·W + kx`` for the nine taps."""
    _compiled()["same_3x3"](data, offsets, weights, bias, out, low, high)


def _compiled() -> dict[str, Any]:
    """The kernels, compiled on first use. The helpers are compiled first and put in this
    module's namespace, where numba resolves the kernels' calls to them (and inlines them)."""
    if not _kernels:
        for helper in (_fill_phases, _sum_taps, _write_clamped, _bounded_sum, _clamped,
                       _edges):
            globals()[helper.__name__] = compile_kernel(helper, fastmath={"contract"},
                                                        inline="always")
        _kernels["rows"] = compile_kernel(_rows, fastmath={"contract"})
        _kernels["planes"] = compile_kernel(_planes, fastmath={"contract"})
        _kernels["same_3x3"] = compile_kernel(_same_3x3, fastmath={"contract"})
    return _kernels


def compile_kernel(function: Any, **options: Any) -> Any:
    """``function`` compiled by numba without the GIL, cached on disk where numba finds a
    writable place (beside the module, else the user's cache); else compiled per process."""
    from numba import njit

    try:
        return njit(cache=True, nogil=True, **options)(function)
    except RuntimeError:  # "cannot cache ... no locator available": a read-only install
        return njit(nogil=True, **options)(function)


def _rows(flat: Any, offsets: Any, weights: Any, bias: Any, out: Any, grid_width: int,
          low: Any, high: Any) -> None:  # pragma: no cover - runs compiled
    planes, height, width = out.shape
    channels = weights.shape[0]
    length = (height - 1) * grid_width + width
    row = np.empty(length, dtype=flat.dtype)
    for plane in range(planes):
        channel = plane % channels
        _sum_taps(flat[plane], offsets, weights[channel], bias[channel], row)
        _write_clamped(row, out[plane], grid_width, low, high)


def _planes(data: Any, grid: Any, offsets: Any, weights: Any, bias: Any, out: Any,
            pad_y: int, pad_x: int, low: Any, high: Any) -> None:  # pragma: no cover
    planes = data.shape[0]
    channels = weights.shape[0]
    grid_width = grid.shape[3]
    length = (out.shape[1] - 1) * grid_width + out.shape[2]
    row = np.empty(length, dtype=data.dtype)
    flat = grid.reshape(-1)
    for plane in range(planes):
        channel = plane % channels
        _fill_phases(data[plane], grid, pad_y, pad_x)
        _sum_taps(flat, offsets, weights[channel], bias[channel], row)
        _write_clamped(row, out[plane], grid_width, low, high)


def _fill_phases(source: Any, grid: Any, pad_y: int, pad_x: int) -> None:  # pragma: no cover
    """Input rows ``source`` (H, W) into the interior of the phase grid (sy, sx, QH, QW). Each
    stride across gets a loop LLVM vectorises: a plain copy, or both phases of 2 at once (an
    interleaved access); other strides take the general one, phase by phase."""
    stride_y, stride_x = grid.shape[0], grid.shape[1]
    width = source.shape[1]
    for y in range(source.shape[0]):
        line = source[y]
        # Indexed in one go, not through a (sx, QW) view: numba knows these rows contiguous.
        phase_y, cell_y = (y + pad_y) % stride_y, (y + pad_y) // stride_y
        if stride_x == 1:
            inside = grid[phase_y, 0, cell_y, pad_x:]
            for x in range(width):
                inside[x] = line[x]
        elif stride_x == 2:
            even = grid[phase_y, pad_x % 2, cell_y, pad_x // 2:]  # input columns 0, 2, 4…
            odd = grid[phase_y, 1 - pad_x % 2, cell_y, (pad_x + 1) // 2:]
            for x in range(width // 2):
                even[x] = line[2 * x]
                odd[x] = line[2 * x + 1]
            if width % 2:
                even[width // 2] = line[width - 1]
        else:
            for phase in range(stride_x):
                first = (phase - pad_x) % stride_x  # the first input column in this phase
                inside = grid[phase_y, phase, cell_y, (first + pad_x) // stride_x:]
                for x in range((width - first + stride_x - 1) // stride_x):
                    inside[x] = line[first + x * stride_x]


def _sum_taps(flat: Any, offsets: Any, weights: Any, shift: Any,
              row: Any) -> None:  # pragma: no cover - runs compiled
    """``row[j] = shift + Σₖ weights[k] · flat[offsets[k] + j]``. With 3×3's nine taps each
    output is summed in a register (one store per output, not one per tap): 1.3–1.6× faster."""
    if offsets.shape[0] == 9:
        w0, w1, w2, w3, w4, w5, w6, w7, w8 = weights[0], weights[1], weights[2], weights[3], \
            weights[4], weights[5], weights[6], weights[7], weights[8]
        # Slices: their loop index stays non-negative, so no wrap-around test per element.
        f0, f1, f2 = flat[offsets[0]:], flat[offsets[1]:], flat[offsets[2]:]
        f3, f4, f5 = flat[offsets[3]:], flat[offsets[4]:], flat[offsets[5]:]
        f6, f7, f8 = flat[offsets[6]:], flat[offsets[7]:], flat[offsets[8]:]
        for j in range(row.shape[0]):
            row[j] = (shift + w0 * f0[j] + w1 * f1[j] + w2 * f2[j] + w3 * f3[j] + w4 * f4[j]
                      + w5 * f5[j] + w6 * f6[j] + w7 * f7[j] + w8 * f8[j])
        return
    row[:] = shift
    for tap in range(offsets.shape[0]):
        weight = weights[tap]
        source = flat[offsets[tap]:]
        for j in range(row.shape[0]):
            row[j] += weight * source[j]


def _write_clamped(row: Any, target: Any, grid_width: int, low: Any,
                   high: Any) -> None:  # pragma: no cover - runs compiled
    """The valid outputs of ``row`` (every ``grid_width``-th run) into ``target`` (H, W)."""
    for y in range(target.shape[0]):
        line = row[y * grid_width:]
        for x in range(target.shape[1]):
            value = line[x]
            value = low if value < low else value  # not min/max: NaN stays NaN
            target[y, x] = high if value > high else value



def _same_3x3(data: Any, offsets: Any, weights: Any, bias: Any, out: Any, low: Any,
              high: Any) -> None:  # pragma: no cover - runs compiled
    planes, height, width = data.shape
    channels = weights.shape[0]
    start, stop = width + 1, (height - 1) * width - 1
    # Summed into a buffer of its own, then clamped into place: LLVM vectorises the nine-tap
    # sum only where it can tell the target from the taps (into the output: 1.4× slower).
    row = np.empty(max(stop - start, 0), dtype=data.dtype)
    for plane in range(planes):
        channel = plane % channels
        target = out[plane].reshape(-1)
        # Rows 1 to H-2 as one run over the flat plane, each tap a shifted slice of it
        # (offsets[k] = ky·W + kx from the run's start less W + 1). The run's first and last
        # columns read across a row's end: they are redone below, with the top and bottom rows.
        if stop > start:
            _sum_taps(data[plane].reshape(-1), offsets, weights[channel], bias[channel], row)
            inner = target[start:stop]
            for j in range(row.shape[0]):
                inner[j] = _clamped(row[j], low, high)
        _edges(data[plane], weights[channel], bias[channel], out[plane], low, high)


def _edges(plane: Any, weights: Any, shift: Any, target: Any, low: Any,
           high: Any) -> None:  # pragma: no cover - runs compiled
    """The outputs of a 3×3 pad-1 convolution that touch the padding: top and bottom rows
    (vectorised runs of three taps per input row) and the first and last columns."""
    height, width = plane.shape
    if height < 3 or width < 3:  # too small to have an inside: every output bounded
        for y in range(height):
            for x in range(width):
                target[y, x] = _clamped(_bounded_sum(plane, weights, shift, y, x), low, high)
        return
    for y in (0, height - 1):
        line = target[y, 1:width - 1]
        line[:] = shift
        for row in range(max(y - 1, 0), min(y + 2, height)):
            tap = 3 * (row - y + 1)
            w0, w1, w2 = weights[tap], weights[tap + 1], weights[tap + 2]
            left, middle, right = plane[row, 0:], plane[row, 1:], plane[row, 2:]
            for x in range(width - 2):
                line[x] += w0 * left[x] + w1 * middle[x] + w2 * right[x]
        for x in range(width - 2):
            line[x] = _clamped(line[x], low, high)
    for y in range(height):
        first, last = shift, shift
        for row in range(max(y - 1, 0), min(y + 2, height)):
            tap = 3 * (row - y + 1)
            first += weights[tap + 1] * plane[row, 0] + weights[tap + 2] * plane[row, 1]
            last += weights[tap] * plane[row, width - 2] + weights[tap + 1] * plane[row, width - 1]
        target[y, 0] = _clamped(first, low, high)
        target[y, width - 1] = _clamped(last, low, high)


def _clamped(value: Any, low: Any, high: Any) -> Any:  # pragma: no cover - runs compiled
    """``value`` clamped to [low, high] as ``clip`` does: not min/max, so NaN stays NaN."""
    value = low if value < low else value
    return high if value > high else value


def _bounded_sum(plane: Any, weights: Any, shift: Any, y: int,
                 x: int) -> Any:  # pragma: no cover - runs compiled
    """One output of a 3×3 pad-1 convolution at (y, x), taps outside the plane left out."""
    value = shift
    for ky in range(3):
        for kx in range(3):
            row, column = y + ky - 1, x + kx - 1
            if 0 <= row < plane.shape[0] and 0 <= column < plane.shape[1]:
                value += weights[3 * ky + kx] * plane[row, column]
    return value


# Where each kernel's operands sit in its bound call: the (planes, …) arrays, the per-channel
# arrays, and the phase grid a call writes (None: it has none).
_OPERANDS = {"depthwise_rows": ((0, 4), (2, 3), None),
             "depthwise_planes": ((0, 5), (3, 4), 1),
             "depthwise_same_3x3": ((0, 4), (2, 3), None)}


def is_kernel_call(call: Any) -> bool:
    """Whether ``call`` is a bound call of one of this module's kernels (see `slab`)."""
    func = getattr(call, "func", None)
    return getattr(func, "__module__", None) == __name__ and func.__name__ in _OPERANDS


def extent(call: Any) -> tuple[int, int, int]:
    """(planes, channels, bytes of the planar arrays: input and output) of a kernel call."""
    planar, per_channel, _ = _OPERANDS[call.func.__name__]
    arrays = [call.args[index] for index in planar]
    return (arrays[0].shape[0], call.args[per_channel[0]].shape[0],
            sum(array.nbytes for array in arrays))


def slab(call: Any, start: int, stop: int) -> Any:
    """``call`` restricted to planes [start, stop), which must be whole samples or lie within
    one sample: a call of its own, with its own phase grid, that can run beside the others."""
    planar, per_channel, grid = _OPERANDS[call.func.__name__]
    args = list(call.args)
    channels = args[per_channel[0]].shape[0]
    for index in planar:
        args[index] = args[index][start:stop]
    if (stop - start) % channels or start % channels:  # within one sample: its channels
        first = start % channels
        for index in per_channel:
            args[index] = args[index][first:first + stop - start]
    if grid is not None:
        args[grid] = np.zeros_like(args[grid])
    return type(call)(call.func, *args)
