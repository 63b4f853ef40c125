"""The 3×3, pad-1, stride-1 or -2 float32 depthwise convolution as `depthwise_ir`'s vector
kernel: its bound call and the machine code, compiled once per process.

`depthwise_bind` binds it where llvmlite compiles it: vectors of 16 floats with AVX-512, of 8
with AVX2 and FMA alone (`lanes`); elsewhere the numba kernels (`depthwise_kernel`) run.
Given a `bf16_handoff.PairedHandoff`, a run finding it taken writes the hand-off's bf16 words
(`depthwise_ir`'s paired tasks) in place of the float32 planes. Its input may be bf16 planes
in place of float32 ones (a uint16 array of the bf16 bits, `bf16.round_to_bf16`'s), which
`depthwise_ir`'s ``_from_bf16`` tasks read. Measured on MobileNet v2's 17 depthwise layers
at batch 1, one thread, against those kernels (steps timed in order in a run), on an AVX-512
host and on an AVX2 one: see docs/benchmarks.md.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from engine.cpu import compiled, host_features, kernel_jobs, llvm_jit, spin_pool, steady_walk
from engine.kernels import bf16_handoff
from engine.kernels.depthwise_kernel import DepthwiseCall

STRIDES = (1, 2)  # what `depthwise_ir` generates
LANES = 16  # outputs per vector: a row of a multiple of this many fills its vectors
AVX2_LANES = 8  # the same on a host with AVX2 and FMA but no AVX-512
BF16_BITS = np.dtype(np.uint16)  # bf16 planes' dtype: each value's 16 bits
_compiled: dict[str, Any] = {}  # the LLVM engine (it owns the machine code), once made
_TASK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


def applies(data: Any, weight: Any, bias: Any, out: Any, geometry: Any) -> bool:
    """Whether this kernel runs the convolution: float32 NCHW arrays it can read flat, a 3×3
    kernel, pad 1, no dilation, the same stride 1 or 2 on both axes, and the kernel compiled
    for this host."""
    kernel, stride, dilate, pad = (tuple(values) for values in geometry)
    arrays = (data, weight, out) if bias is None else (data, weight, bias, out)
    return (kernel == (3, 3) and pad == (1, 1) and dilate == (1, 1)
            and stride in ((1, 1), (2, 2)) and data.ndim == 4
            and all(isinstance(a, np.ndarray) and a.dtype == np.float32
                    and a.flags.c_contiguous for a in arrays)
            and _task(stride[0]) is not None)


def bind(data: Any, weight: Any, bias: Any, out: Any, stride: int,
         handoff: bf16_handoff.PairedHandoff | None = None,
         source: bf16_handoff.PairedHandoff | None = None) -> VectorDepthwiseCall:
    """The call computing ``out = depthwise_conv(data, weight) + bias`` (see `applies`; the
    data may be bf16 planes instead, `BF16_BITS`, of the same shape), unclamped (±inf bounds)
    until an epilogue clamps it; with ``handoff`` (one sample), into its words as bf16 pairs
    in place of ``out`` on the runs after every reader took it. ``source``: the hand-off of
    ``data`` this call took as bf16 planes (`bf16_handoff.take_planes`), read in place of
    ``data`` on the runs where its writer laid them."""
    batch, channels = data.shape[:2]
    bias = np.zeros(channels, np.float32) if bias is None else bias.reshape(channels)
    return VectorDepthwiseCall(depthwise_3x3, data.reshape(batch * channels, *data.shape[2:]),
                               weight.reshape(channels, -1), bias,
                               out.reshape(batch * channels, *out.shape[2:]), stride, handoff,
                               source, np.float32("-inf"), np.float32("inf"))


def depthwise_3x3(data: Any, weights: Any, bias: Any, out: Any, stride: int, handoff: Any,
                  source: Any, low: Any, high: Any) -> None:
    """``out[p] = clip(bias[c] + conv3x3(data[p], weights[c]), low, high)`` for every plane
    ``p`` of ``data`` (planes, H, W) and ``out`` (planes, OH, OW), ``c = p % channels``,
    on this thread; into ``handoff``'s words instead where every reader took it; from
    ``source``'s bf16 planes instead where its writer laid them."""
    data = _input(data, source)
    paired = handoff is not None and handoff.taken
    context = _context(data, weights, bias, out, low, high,
                       handoff.words if paired else None)
    _TASK(_task(stride, paired, data.shape[2], data.dtype == BF16_BITS))(
        context.ctypes.data, 0, 1)
    if handoff is not None:
        handoff.laid = paired


def _context(data: Any, weights: Any, bias: Any, out: Any, low: Any, high: Any,
             words: Any = None) -> np.ndarray:
    """The int64 words `depthwise_ir.FIELDS` names: written into ``out``, or into ``words``
    (float32-viewed, paired down their columns: one row per two channels, `bf16_handoff`)."""
    if out.shape[0] != data.shape[0] or weights.shape != (bias.shape[0], 9):
        raise ValueError(f"depthwise 3×3: planes {data.shape} → {out.shape} with weights "
                         f"{weights.shape} and bias {bias.shape} do not match")
    if words is not None and (words.ndim != 2 or words.shape[0] < -(-out.shape[0] // 2)
                              or words.shape[1] < out.shape[1] * out.shape[2]):
        raise ValueError(f"depthwise 3×3: words {words.shape} cannot hold the pairs of "
                         f"{out.shape}")
    bounds = [int(np.float64(bound).view(np.int64)) for bound in (low, high)]
    target = out if words is None else words
    return np.array([data.ctypes.data, target.ctypes.data, weights.ctypes.data,
                     bias.ctypes.data, data.shape[0], weights.shape[0], *data.shape[1:],
                     *out.shape[1:], *bounds, 0 if words is None else words.shape[1]],
                    np.int64)


def _input(data: Any, source: Any) -> Any:
    """The planes a run reads: ``source``'s bf16 halves where its writer laid them, else
    ``data``."""
    if source is None or not source.laid:
        return data
    return source.words.reshape(data.shape)


class VectorDepthwiseCall(DepthwiseCall):
    """A bound call of `depthwise_3x3`: ``(data, weights, bias, out, stride, handoff,
    source, low, high)``, cut by planes as `DepthwiseCall` cuts its kernels' calls (but for a
    hand-off either way, whose words or planes hold every plane: whole, or a job over the
    planes)."""

    def operands(self) -> tuple[tuple[int, ...], tuple[int, ...], None]:
        return (0, 3), (1, 2), None

    def slabs(self, count: int) -> list[DepthwiseCall] | None:
        """`DepthwiseCall.slabs`; None with a hand-off, and with AVX2's build, whose layers
        run as their job (`as_job`) on several threads too. MobileNet v2 fp32 on both vCPUs of
        Zen 3 (`parallel.set_threads(2)`, steps in order, each node's best of 100, wall): the 17
        layers in slabs on `parallel`'s threads 4.6–4.9 ms (2.4–2.7 with each slab's context
        made once), as jobs 1.2 armed and 1.7 on one thread, as `Choice` took runs."""
        handed = self.args[5] is not None or self.args[6] is not None
        if handed or lanes() == AVX2_LANES:
            return None
        return super().slabs(count)

    def as_job(self, workspace: Any) -> Any:
        """A `spin_pool` job over the planes (with a hand-off, the float32 one or the paired
        one as each run finds it taken; with a source, reading the float32 planes or the
        bf16 ones as each run finds them laid)."""
        data, weights, bias, out, stride, handoff, source, low, high = self.args
        parts = kernel_jobs.parts_for(data.shape[0], data.size + out.size)

        def job(planes: Any, words: Any = None) -> Any:
            return spin_pool.job(_task(stride, words is not None, planes.shape[2],
                                       planes.dtype == BF16_BITS), _context(
                planes, weights, bias, out, low, high, words), parts,
                keep=(planes, weights, bias, out, words))

        if handoff is None and source is None:
            return job(data)
        return _EitherWayJob(handoff, source, data, job)


    def planes_job(self, start: int, stop: int) -> Any:
        """A job of one part over planes [start, stop) of one sample: a step of a chain's
        share (`expansion_chain`); None with a hand-off or a source."""
        if self.args[5] is not None or self.args[6] is not None:
            return None
        data, weights, bias, out, stride, _, _, low, high = self.slab(start, stop).args
        return spin_pool.job(_task(stride, False, data.shape[2]),
                             _context(data, weights, bias, out, low, high), 1,
                             keep=(data, weights, bias, out))


class _EitherWayJob:
    """A depthwise layer's job whose input may come as bf16 planes (``source`` laid) and
    whose output may go as bf16 pairs (``handoff`` taken), found at each run, each job made
    on first use by ``make(planes, words)``; it says what it wrote (``handoff.laid``)."""

    leaves_blas_alone = True

    def __init__(self, handoff: Any, source: Any, data: Any, make: Any) -> None:
        # (not ``source``: `jobs.pooled` names the call a job replaces so)
        self.handoff, self.planes_from, self.data, self.make = handoff, source, data, make
        self.jobs: dict[tuple[bool, bool], Any] = {}

    def __call__(self) -> None:
        handoff, source = self.handoff, self.planes_from
        halves = source is not None and source.laid
        paired = handoff is not None and handoff.taken
        job = self.jobs.get((halves, paired))
        if job is None:
            job = self.jobs[halves, paired] = self.make(
                _input(self.data, source), handoff.words if paired else None)
        job()
        if handoff is not None:
            handoff.laid = paired

    def replayable(self) -> bool:
        """Its jobs, whichever it runs, post nothing but themselves (`steady_walk`)."""
        return steady_walk.all_replayable(*self.jobs.values())


def _task(stride: int, paired: bool = False, width: int = 0,
          from_bf16: bool = False) -> int | None:
    """The address of the task for ``stride`` (writing bf16 pairs where ``paired``) over
    planes ``width`` wide (the stacked task where `depthwise_ir.stacks`, but for bf16 input
    planes, ``from_bf16``: the column walk reads them); None where it cannot be compiled
    here."""
    engine = compiled.made_once(_compiled, "engine", _compile)
    if engine is None or stride not in STRIDES:
        return None
    from engine.kernels.depthwise_ir import stacks, task_name

    stacked = stacks(width, stride, lanes()) and not from_bf16
    return engine.get_function_address(task_name(stride, paired, stacked, from_bf16))


def lanes() -> int | None:
    """Floats a vector of the host's build holds: 16 with AVX-512, 8 with AVX2 and FMA (16
    would be split in two there, each masked store two ``vmaskmovps``), else None: no
    build."""
    if host_features.has("avx512f"):
        return LANES
    if host_features.has("avx2") and host_features.has("fma"):
        return AVX2_LANES
    return None


def _compile() -> Any:
    """The module compiled for the host, or None: no AVX-512 or AVX2 (`lanes`), no llvmlite,
    or no JIT for this target."""
    if lanes() is None:
        return None
    return llvm_jit.compile_for_host(_module, optimise=False)


def _module() -> Any:
    from engine.kernels.depthwise_ir import module

    if lanes() == LANES:
        return module()
    # AVX2: masked stores cost many µops a vector there, so the columns inside a plane take
    # plain ones (`depthwise_ir.module`'s ``plain_inside``)
    return module(AVX2_LANES, plain_inside=True)
