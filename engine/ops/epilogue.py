"""Epilogues: a clamp that follows a bound op, applied while the op's result is in cache.

A fused elementwise chain on the CPU runs its steps one after another over the whole output
(`engine.runtime.plan`): after a convolution, MobileNet v2's ReLU6 (``clip(0, 6)``) is one more
pass over memory, after the bias add's. `absorb` drops the step where the head's last call can
clamp instead: the compiled depthwise kernel clamps as it writes, and a GEMM convolution's
in-place bias add becomes one compiled pass adding the bias and clamping (`bias_clamp`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from engine.ops import depthwise_kernel


def clamp_bounds(step: Any) -> tuple[float, float] | None:
    """(low, high) of a unary step that is a clamp of the running value, else None."""
    if step.arity != 1 or step.position != 0:
        return None
    if step.op.name == "clip":
        return float(step.attrs.a_min), float(step.attrs.a_max)
    if step.op.name == "Activation" and step.attrs.act_type == "relu":
        return 0.0, float("inf")
    return None


def absorb(calls: list[Callable[[], Any]], steps: Sequence[Any],
           out: Any) -> tuple[list[Callable[[], Any]], Sequence[Any]]:
    """``calls`` with the first of ``steps`` folded into the last call where it can be, and
    the steps left to run; else both unchanged. Only a float output is clamped here."""
    if not calls or not steps or out.dtype.kind != "f":
        return calls, steps
    bounds = clamp_bounds(steps[0])
    last = calls[-1]
    if bounds is None:
        return calls, steps
    low, high = (out.dtype.type(bound) for bound in bounds)
    if getattr(last, "func", None) is depthwise_kernel.depthwise_rows:
        clamped = partial(last.func, *last.args[:6], max(last.args[6], low),
                          min(last.args[7], high))
        return [*calls[:-1], clamped], steps[1:]
    bias = _bias_added(last, out)
    if (bias is None or out.dtype not in depthwise_kernel.COMPILED_DTYPES
            or not depthwise_kernel.available()):
        return calls, steps
    planes = out.reshape(out.shape[0], out.shape[1], -1)
    return [*calls[:-1], partial(bias_clamp, planes, bias, low, high)], steps[1:]


def _bias_added(call: Any, out: Any) -> Any:
    """The per-channel bias of an in-place ``np.add(out, bias, out)`` over a contiguous
    channels-first ``out`` (conv_bind's last call), else None."""
    if not isinstance(call, partial) or call.func is not np.add or call.keywords:
        return None
    if len(call.args) != 3 or call.args[0] is not out or call.args[2] is not out:
        return None
    bias = call.args[1]
    channels = out.shape[1] if out.ndim > 1 else 0
    if (not out.flags.c_contiguous or bias.dtype != out.dtype or bias.size != channels
            or bias.shape != (1, channels, *(1,) * (out.ndim - 2))):
        return None
    return bias.reshape(channels)


_kernel: list[Any] = []


def bias_clamp(planes: Any, bias: Any, low: Any, high: Any) -> None:
    """``planes[n, c] = clip(planes[n, c] + bias[c], low, high)`` in one compiled pass."""
    if not _kernel:
        from numba import njit

        _kernel.append(njit(cache=True, nogil=True)(_bias_clamp))
    _kernel[0](planes, bias, low, high)


def _bias_clamp(planes: Any, bias: Any, low: Any, high: Any) -> None:  # pragma: no cover
    samples, channels, cells = planes.shape
    for sample in range(samples):
        for channel in range(channels):
            shift = bias[channel]
            row = planes[sample, channel]
            for cell in range(cells):
                value = row[cell] + shift
                value = low if value < low else value  # not min/max: NaN stays NaN
                row[cell] = high if value > high else value
