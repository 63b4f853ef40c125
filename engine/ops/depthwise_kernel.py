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
_kernel: list[Any] = []  # the compiled function, once made


def available() -> bool:
    """Whether numba can be imported (the kernel is compiled on its first call)."""
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
    if not _kernel:
        _kernel.append(_compile())
    _kernel[0](flat, offsets, weights, bias, out, grid_width, low, high)


def _compile() -> Any:
    return compile_kernel(_rows, fastmath={"contract"})


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
        start = bias[channel]
        for j in range(length):
            row[j] = start
        for tap in range(offsets.shape[0]):
            weight = weights[channel, tap]
            source = flat[plane, offsets[tap]:]  # a slice: the loop index stays non-negative
            for j in range(length):
                row[j] += weight * source[j]
        target = out[plane]
        for y in range(height):
            line = row[y * grid_width:]
            for x in range(width):
                value = line[x]
                value = low if value < low else value  # not min/max: NaN stays NaN
                target[y, x] = high if value > high else value
