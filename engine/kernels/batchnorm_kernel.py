"""Inference BatchNorm (a per-channel scale and shift) and the clamp after it, as one pass.

A BatchNorm that follows a convolution is folded into its weights; one that comes before a
convolution with a ReLU between (ResNet v2's pre-activation blocks) cannot be, so it runs on
every call. In NumPy that is a multiply and an add into temporaries, a copy into the output
and the ReLU's pass (four passes over the activation). Here one compiled loop reads each
channel's row once, works out the channel's scale and shift from the moving statistics (the
same float operations, in the same order, as the NumPy kernel: the result is the same) and
writes ``clip(x * scale + shift, low, high)``. The clamp after it folds into the call
(`epilogue.ClampingCall`), and the rows are cut into jobs of the spin pool.

In a bf16 plan whose 1×1 products (on AMX, or on the AVX-512 BF16 tile where there is no
AMX) all read the output (`bf16_handoff`), the pass writes
their bf16 pairs instead (`bf16.patch_pairing` with the statistics: the same values, rounded),
so that no pairing pass reads the float32 output again (ResNet v2's pre-activation blocks;
a downsampling block's stride-2 shortcut copies its share of the words, `gemm_bind`);
where its readers are direct 3×3 convolutions (`conv_amx`), it writes the pairs into their
zero-bordered grid (a basic ResNet v2 block's first convolution). Where its data's writer,
bound right before it, is a residual 1×1 product on AMX that can write those words itself
from its epilogue (`gemm_preact`), the pass asks it to, and runs nothing on the runs where
it did.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs
from engine.cpu.compiled import compile_kernel, compiled_once
from engine.kernels import bf16, bf16_handoff, gemm_preact
from engine.kernels.epilogue import ClampingCall
from engine.kernels.workspace import address

MIN_ELEMENTS = 4096  # smaller ones are left to NumPy: not worth numba's import at load time
_kernels: dict[str, Any] = {}


class BatchNormCall(ClampingCall):
    """``BatchNormCall(batchnorm_rows, data, gamma, beta, mean, var, eps, one, fix_gamma, out,
    low, high)``: data and out viewed as (samples × channels, cells)."""

    def as_job(self, workspace: Any) -> Any:
        """The rows shared out as a `spin_pool` job; None where no job can run it."""
        data = self.args[0]
        rows = data.shape[0]
        return kernel_jobs.bind((__name__, "rows"), self.args, rows,
                                kernel_jobs.parts_for(rows, 2 * data.size))


class PairingBatchNormCall(BatchNormCall):
    """``PairingBatchNormCall(batchnorm_or_pairs, data, gamma, beta, mean, var, eps, one,
    fix_gamma, out, handoff, low, high)``: the pass writing ``handoff``'s words in place of
    ``out`` on the runs where every reader took them."""

    leaves_blas_alone = True

    def plain(self) -> BatchNormCall:
        """The float32 pass alone."""
        return BatchNormCall(batchnorm_rows, *self.args[:9], *self.args[10:])

    def as_job(self, workspace: Any) -> Any:
        """The float32 pass's job, or the pairing one, as each run finds the hand-off; none
        on the runs where the data's writer wrote the words (`gemm_preact`)."""
        handoff = self.args[9]
        either = bf16_handoff.EitherJob(handoff, lambda: self.plain().as_job(workspace),
                                        lambda: _pairs(*self.args))
        request = handoff.written_by
        if request is None:
            return either
        request.bounds = (float(self.args[-2]), float(self.args[-1]))
        return _UnlessWritten(request, either)


class _UnlessWritten:
    """The pass's job, run only where the data's writer did not write the words."""

    leaves_blas_alone = True

    def __init__(self, request: Any, job: Any) -> None:
        self.request, self.job = request, job

    def __call__(self) -> None:
        if self.request.written:
            self.request.out_handoff.laid = True
        else:
            self.job()


def bind(data: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: float, fix_gamma: bool,
         out: Any, workspace: Any = None) -> BatchNormCall | None:
    """The compiled pass for BatchNorm on axis 1 of ``data`` into ``out`` (no clamp yet), or
    None where it does not apply: not float32/float64 NumPy arrays, statistics of another
    dtype or not one per channel, non-contiguous arrays, an output that overlaps the data
    without being it, too few elements, or no numba. With the plan's ``workspace``, one that
    may hand its output to bf16 products as their pairs (`bf16_handoff.offer`)."""
    arrays = (data, gamma, beta, mean, var, out)
    if not all(isinstance(array, np.ndarray) for array in arrays):
        return None
    if (data.dtype not in compiled.COMPILED_DTYPES or data.ndim < 2 or data.size < MIN_ELEMENTS
            or out.shape != data.shape or out.dtype != data.dtype):
        return None
    channels = data.shape[1]
    if any(value.dtype != data.dtype or value.shape != (channels,)
           for value in (gamma, beta, mean, var)):
        return None
    if not all(array.flags.c_contiguous for array in arrays):
        return None
    if np.may_share_memory(data, out) and address(data) != address(out):
        return None
    if not compiled.available():
        return None
    rows = data.shape[0] * channels
    kind = data.dtype.type
    args = (data.reshape(rows, -1), gamma, beta, mean, var, kind(eps), kind(1),
            int(bool(fix_gamma)), out.reshape(rows, -1))
    bounds = (kind(-np.inf), kind(np.inf))
    handoff = bf16_handoff.offer(workspace, out, grids=True, bf16_tile=True) \
        if workspace is not None and data.dtype == np.float32 and data.ndim == 4 else None
    if handoff is not None:
        if data.ndim == 4 and data.shape[0] == 1:
            handoff.written_by = gemm_preact.ask(
                workspace, data, handoff, (gamma, beta, mean, var, eps, bool(fix_gamma)))
        return PairingBatchNormCall(batchnorm_or_pairs, *args, handoff, *bounds)
    return BatchNormCall(batchnorm_rows, *args, *bounds)


def batchnorm_rows(data: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: Any, one: Any,
                   fix_gamma: int, out: Any, low: Any, high: Any) -> None:
    """Every row on this thread (see `BatchNormCall`)."""
    compiled_kernels()["rows"](data, gamma, beta, mean, var, eps, one, fix_gamma, out, low,
                               high, 0, data.shape[0])


def batchnorm_or_pairs(data: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: Any,
                       one: Any, fix_gamma: int, out: Any, handoff: Any, low: Any,
                       high: Any) -> None:
    """`batchnorm_rows`, or the hand-off's words where every reader took them, on this
    thread."""
    paired = handoff.taken
    if paired:
        _pairs(data, gamma, beta, mean, var, eps, one, fix_gamma, out, handoff, low, high)()
    else:
        batchnorm_rows(data, gamma, beta, mean, var, eps, one, fix_gamma, out, low, high)
    handoff.laid = paired


def _pairs(data: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: Any, one: Any,
           fix_gamma: int, out: Any, handoff: Any, low: Any, high: Any) -> Any:
    """A job writing ``clip(BatchNorm(data), low, high)`` (one sample's channels as rows) as
    the hand-off's bf16 words, paired down their columns, or into its reader's grid."""
    statistics = (*gemm_preact.scale_shift(gamma, beta, mean, var, eps, fix_gamma), low, high)
    if handoff.grid is None:
        return bf16.patch_pairing(data, 1, handoff.words, batchnorm=statistics)
    jobs = tuple(bf16.patch_pairing(view, 1, handoff.words, into, batchnorm=statistics)
                 for view, into in handoff.grid.phase_runs(data.reshape(handoff.source)))
    return jobs[0] if len(jobs) == 1 else partial(_each, jobs)


def _each(jobs: tuple[Any, ...]) -> None:
    for job in jobs:
        job()


def compiled_kernels() -> dict[str, Any]:
    """The kernel by name (`kernel_jobs` runs it as jobs), compiled on first use."""
    return compiled_once(_kernels, lambda: {"rows": compile_kernel(_rows)})


def _rows(data: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: Any, one: Any,
          fix_gamma: int, out: Any, low: Any, high: Any, first: int,
          last: int) -> None:  # pragma: no cover - runs compiled
    """Rows [first, last) of ``out = clip(data * scale + shift, low, high)``, row r being
    channel r % channels. ``eps`` and ``one`` have the data's dtype, so the statistics are
    worked in it, as NumPy does: no float64 (and no fused multiply-add) creeps in."""
    channels, cells = gamma.shape[0], data.shape[1]
    for row in range(first, last):
        channel = row % channels
        inv_std = one / np.sqrt(var[channel] + eps)
        scale = inv_std if fix_gamma else gamma[channel] * inv_std
        shift = beta[channel] - mean[channel] * scale
        source, target = data[row], out[row]
        for cell in range(cells):
            value = source[cell] * scale + shift
            value = low if value < low else value  # not min/max: NaN stays NaN
            target[cell] = high if value > high else value
