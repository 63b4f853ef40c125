"""ResNet's 3×3, stride-2, pad-1 float32 max pooling as `max_pool_ir`'s vector task: the
machine code, compiled once per process, and the calls running it on this thread or as a
`spin_pool` job over the planes.

`pool_kernel.max_pool` and its `MaxPoolCall` take it where `applies` holds (a host with
AVX-512 and llvmlite's JIT); elsewhere, and for other windows and float64, numba's kernels
run. Against them, one thread, 3×3 stride 2 over 112² planes: the same time where the input
(3.2 MB an image) streams from beyond L2 at batch 1, 8% less at batch 8 and 20% less on
planes in L2 (see docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from engine.cpu import kernel_jobs, llvm_jit, spin_pool

MAX_OUT_WIDTH = 4096
_TASK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


def _module() -> Any:
    from engine.kernels import max_pool_ir

    return max_pool_ir.module()


_MODULE = llvm_jit.HostModule(_module, "avx512f")


def applies(data: Any, out: Any, window: tuple[int, ...]) -> bool:
    """Whether the vector task pools planes ``data`` (P, H, W) into ``out`` (P, OH, OW) over
    ``window`` (kernel, stride and pad, y then x, as `pool_kernel.max_pool` takes them):
    float32, contiguous, a 3×3 window at stride 2 behind one cell of padding, an output no
    window of which starts past the input's padding, rows of `MAX_OUT_WIDTH` outputs at most
    (the task keeps a vector per 16 of them on its stack), and the task compiled here."""
    return (window == (3, 3, 2, 2, 1, 1) and data.ndim == 3 and out.ndim == 3
            and out.shape[2] <= MAX_OUT_WIDTH
            and data.dtype == np.float32 and out.dtype == np.float32
            and out.shape[0] == data.shape[0]
            and all(0 < size <= length // 2 + 1
                    for size, length in zip(out.shape[1:], data.shape[1:], strict=True))
            and data.flags.c_contiguous and out.flags.c_contiguous and _task() is not None)


def max_pool(data: Any, out: Any) -> None:
    """``out`` = the 3×3 stride-2 pad-1 max pooling of ``data``'s planes (see `applies`), on
    this thread."""
    _function()(_context(data, out).ctypes.data, 0, 1)


def job(data: Any, out: Any) -> spin_pool.Job:
    """`max_pool` as a job of parts over the planes."""
    planes = data.shape[0]
    return spin_pool.job(_task(), _context(data, out),
                         kernel_jobs.parts_for(planes, data.size + out.size), keep=(data, out))


def band_job(band: Any, top: int, height: int, out: Any, rows: tuple[int, int],
             parts: int) -> spin_pool.Job:
    """A job of ``parts`` parts over the planes pooling output rows [first, last) of ``out``
    (P, OH, OW) from ``band`` (P, R, W: contiguous rows, planes any number of floats apart),
    which holds rows [top, top + R) of each input plane of ``height`` rows: the rows those
    windows read that lie inside the plane, which ``band`` must hold."""
    first, last = rows
    planes, held, width = band.shape
    reach = (max(0, 2 * first - 1), min(height, 2 * last))
    if (not 0 <= first < last <= out.shape[1] or reach[0] < top or reach[1] > top + held
            or out.shape[0] != planes or band.dtype != np.float32 or out.dtype != np.float32
            or band.strides[1:] != (width * band.itemsize, band.itemsize)
            or band.strides[0] % band.itemsize or not out.flags.c_contiguous):
        raise ValueError(f"a band of input rows [{top}, {top + held}) of {band.shape} cannot "
                         f"give output rows [{first}, {last}) of {out.shape}")
    context = np.array([band.ctypes.data - top * width * band.itemsize, out.ctypes.data,
                        planes, height, width, *out.shape[1:], first, last,
                        band.strides[0] // band.itemsize],
                       np.int64)
    return spin_pool.job(_task(), context, parts, keep=(band, out))


def _context(data: Any, out: Any) -> np.ndarray:
    """The int64 words `max_pool_ir.FIELDS` names: every output row."""
    return np.array([data.ctypes.data, out.ctypes.data, data.shape[0], *data.shape[1:],
                     *out.shape[1:], 0, out.shape[1], data.shape[1] * data.shape[2]],
                    np.int64)


@functools.cache
def _task() -> int | None:
    """The task's address (None where it cannot run here), looked up once: a lookup costs
    about 3 µs, a tenth of a small pooling."""
    from engine.kernels import max_pool_ir

    return _MODULE.address(max_pool_ir.TASK)


@functools.cache
def _function() -> Any:
    """The task as a ctypes function, made once."""
    return _TASK(_task())
