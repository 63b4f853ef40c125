"""Epilogues: a clamp that follows a bound op, applied while the op's result is in cache.

A fused elementwise chain on the CPU runs its steps one after another over the whole output
(`engine.runtime.plan`): after a convolution, MobileNet v2's ReLU6 (``clip(0, 6)``) is one more
pass over memory, after the bias add's. `absorb` drops the step where the head's last call can
clamp instead: the compiled depthwise kernel clamps as it writes, and a GEMM convolution's
in-place bias add becomes one compiled pass adding the bias and clamping (`bias_clamp`), and a
compiled Winograd convolution adds a residual and clamps in its output transform, as our GEMMs
and the direct bf16 convolution do as they store (`gemm_bind.with_residual`). A kernel's
call says what it can take: ``clamped(low, high)`` (a `ClampingCall`), ``adds_residual_to(out)``
and ``with_residual(other, bounds)`` (`WinogradCall`), so no kernel is named here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled
from engine.cpu.parts import PartedCall
from engine.kernels import gemm_bind


class ClampingCall(PartedCall):
    """A compiled kernel's call whose last two arguments are the bounds it clamps its output
    to as it writes (±inf: no clamp), so that a clamp after it folds into it."""

    def clamped(self, low: Any, high: Any) -> ClampingCall:
        """This call clamping its output to [low, high] too."""
        return type(self)(self.func, *self.args[:-2], max(self.args[-2], low),
                          min(self.args[-1], high))


def clamp_bounds(step: Any) -> tuple[float, float] | None:
    """(low, high) of a unary step that is a clamp of the running value, else None."""
    if step.arity != 1 or step.position != 0:
        return None
    if step.op.name == "clip":
        return float(step.attrs.a_min), float(step.attrs.a_max)
    if step.op.name == "Activation" and step.attrs.act_type == "relu":
        return 0.0, float("inf")
    return None


def absorb(calls: list[Callable[[], Any]], steps: Sequence[Any], out: Any,
           extras: Sequence[Sequence[Any]] = ()) -> tuple[list[Callable[[], Any]], Sequence[Any]]:
    """``calls`` with the first of ``steps`` (a residual add and the clamp after it: the first
    two) folded into the last call where it can be, and the steps left to run; else both
    unchanged. ``extras`` are each step's other operands. Only a float output is changed here."""
    if not calls or not steps or out.dtype.kind != "f":
        return calls, steps
    residual = _residual(calls, steps, out, extras)
    if residual is not None:
        return residual
    bounds = clamp_bounds(steps[0])
    last = calls[-1]
    if bounds is None:
        return calls, steps
    low, high = (out.dtype.type(bound) for bound in bounds)
    products = gemm_bind.clamped(calls, low, high)
    if products is not None:  # our GEMM clamps as it stores (its bias already added)
        return products, steps[1:]
    clamp = getattr(last, "clamped", None)  # a compiled kernel that clamps as it writes
    if clamp is not None:
        return [*calls[:-1], clamp(low, high)], steps[1:]
    dense = _dense_bias_added(last, out)
    if dense is not None:
        return [*calls[:-1], *_dense_bias_clamp(*dense, low, high)], steps[1:]
    found = _bias_added(last, out)
    if (found is None or out.dtype not in compiled.COMPILED_DTYPES
            or not compiled.available()):
        return calls, steps
    target, bias = found
    return [*calls[:-1], partial(bias_clamp, target, bias, low, high)], steps[1:]


RESIDUAL_ADDS = ("elemwise_add", "broadcast_add")  # canonical names: aliases resolve to them


def _residual(calls: list[Callable[[], Any]], steps: Sequence[Any], out: Any,
              extras: Sequence[Sequence[Any]]) -> tuple[list, Sequence[Any]] | None:
    """A convolution's bias add, the residual add after it and the clamp after that (ResNet's
    and MobileNet v2's block ends) as one compiled pass instead of three NumPy passes; None
    where they are not that: another step, an operand of another shape, no compiled kernels."""
    step = steps[0]
    if (step.op.name not in RESIDUAL_ADDS or step.arity != 2 or len(extras) < 1
            or out.ndim < 3 or not out.flags.c_contiguous
            or out.dtype not in compiled.COMPILED_DTYPES):
        return None
    other = extras[0][0]
    if (not isinstance(other, np.ndarray) or other.shape != out.shape
            or other.dtype != out.dtype or not other.flags.c_contiguous
            or np.may_share_memory(other, out) or not compiled.available()):
        return None
    bounds = clamp_bounds(steps[1]) if len(steps) > 1 else None
    adds_residual = getattr(calls[-1], "adds_residual_to", None)
    if adds_residual is not None and adds_residual(out):  # a compiled Winograd convolution
        return [*calls[:-1], calls[-1].with_residual(other, bounds)], \
            steps[1 + (bounds is not None):]
    products = gemm_bind.with_residual(calls, out, other)
    if products is not None:  # our GEMMs add it as they store (their bias already added)
        if bounds is not None:
            products = gemm_bind.clamped(products, *(out.dtype.type(b) for b in bounds))
        return products, steps[1 + (bounds is not None):]
    found = _bias_added(calls[-1], out)
    if found is None and bounds is None:  # a lone add: one NumPy pass already
        return None
    target = out.reshape(out.shape[0], out.shape[1], -1)
    bias = found[1] if found is not None else np.zeros((out.shape[1], 1), out.dtype)
    low, high = (out.dtype.type(bound) for bound in (bounds or (-np.inf, np.inf)))
    head = calls[:-1] if found is not None else calls
    fused = partial(bias_add_clamp, target, bias, other.reshape(target.shape), low, high)
    return [*head, fused], steps[1 + (bounds is not None):]


def _bias_added(call: Any, out: Any) -> tuple[Any, Any] | None:
    """(target, bias) of an in-place ``np.add(out, bias, out)`` over a contiguous
    channels-first output (conv_bind's per-channel bias), target viewed as (N, C, cells);
    else None. Not a FullyConnected's: it would save ~1 µs per layer, and importing numba
    and loading the kernel costs 0.5-1 s at a model's first run (the seed MLP's load time)."""
    if not isinstance(call, partial) or call.func is not np.add or call.keywords:
        return None
    if len(call.args) != 3 or call.args[0] is not out or call.args[2] is not out:
        return None
    bias = call.args[1]
    channels = out.shape[1] if out.ndim > 2 else 0
    if (not isinstance(bias, np.ndarray) or bias.dtype != out.dtype
            or not out.flags.c_contiguous
            or bias.shape != (1, channels, *(1,) * (out.ndim - 2))):
        return None
    return out.reshape(out.shape[0], channels, -1), bias.reshape(channels, 1)


# From this many rows a FullyConnected's bias add and clamp run on operands of the output's own
# shape, made once at bind time: NumPy's loops over two contiguous arrays are vectorised where
# a broadcast bias row and a scalar bound are not. Seed MLP, 64 × 256 (one thread, best of
# 3000): bias add 3.1 → 2.3 µs, ReLU (`clip`) 4.3 → 2.3 µs. One row too (1 × 256, best of
# 50000 calls): the ReLU as ``maximum`` with a row of zeros 0.40 µs, with a scalar 0.69.
DENSE_ROWS = 1


def _dense_bias_added(call: Any, out: Any) -> tuple[Any, Any] | None:
    """(target, bias) of FullyConnected's in-place ``np.add(target, bias, target)`` over a
    2-D view of ``out`` with `DENSE_ROWS` or more rows and a read-only (constant) bias row;
    else None. A bias fed as an input changes between runs, so it is never copied."""
    if not isinstance(call, partial) or call.func is not np.add or call.keywords:
        return None
    if len(call.args) != 3 or call.args[0] is not call.args[2]:
        return None
    target, bias = call.args[0], call.args[1]
    if (not isinstance(bias, np.ndarray) or bias.flags.writeable or bias.dtype != out.dtype
            or target.ndim != 2 or target.shape[0] < DENSE_ROWS
            or bias.shape[-1:] != target.shape[1:] or bias.size != target.shape[1]
            or not np.shares_memory(target, out)):
        return None
    return target, bias


def _dense_bias_clamp(target: Any, bias: Any, low: Any, high: Any) -> list[Callable[[], Any]]:
    """The bias add and the clamp as passes over whole-shape operands (NaN stays NaN:
    ``maximum`` and ``minimum`` propagate it, as ``clip`` does)."""
    shape, dtype = target.shape, target.dtype
    calls = [partial(np.add, target, np.ascontiguousarray(np.broadcast_to(bias, shape)), target)]
    if low > -np.inf:
        calls.append(partial(np.maximum, target, np.full(shape, low, dtype), out=target))
    if high < np.inf:
        calls.append(partial(np.minimum, target, np.full(shape, high, dtype), out=target))
    return calls


_kernels: dict[str, Any] = {}  # the two compiled passes below, once made


def _passes() -> dict[str, Any]:
    return compiled.compiled_once(_kernels, lambda: {
        "bias_add_clamp": compiled.compile_kernel(_bias_add_clamp),
        "bias_clamp": compiled.compile_kernel(_bias_clamp)})


def bias_add_clamp(target: Any, bias: Any, other: Any, low: Any, high: Any) -> None:
    """``target = clip(target + bias + other, low, high)`` in one compiled pass, for ``target``
    and ``other`` (outer, middle, inner) and ``bias`` (middle, 1); added in that order, as the
    unfused steps add."""
    _passes()["bias_add_clamp"](target, bias, other, low, high)


def _bias_add_clamp(target: Any, bias: Any, other: Any, low: Any,
                    high: Any) -> None:  # pragma: no cover - runs compiled
    outer, middle, inner = target.shape
    for first in range(outer):
        for second in range(middle):
            row, added, shift = target[first, second], other[first, second], bias[second, 0]
            for cell in range(inner):
                value = row[cell] + shift + added[cell]
                value = low if value < low else value  # not min/max: NaN stays NaN
                row[cell] = high if value > high else value


def bias_clamp(target: Any, bias: Any, low: Any, high: Any) -> None:
    """``target = clip(target + bias, low, high)`` in one compiled pass, for ``target``
    (outer, middle, inner) and ``bias`` (middle, inner) broadcast over the outer axis (either
    of bias's axes may be 1)."""
    _passes()["bias_clamp"](target, bias, low, high)


def _bias_clamp(target: Any, bias: Any, low: Any, high: Any) -> None:  # pragma: no cover
    outer, middle, inner = target.shape
    for first in range(outer):
        for second in range(middle):
            row = target[first, second]
            shifts = bias[second if bias.shape[0] != 1 else 0]
            if shifts.shape[0] != 1:  # one bias per cell (a dense row), else one per row
                for cell in range(inner):
                    value = row[cell] + shifts[cell]
                    value = low if value < low else value  # not min/max: NaN stays NaN
                    row[cell] = high if value > high else value
            else:
                shift = shifts[0]
                for cell in range(inner):
                    value = row[cell] + shift
                    value = low if value < low else value
                    row[cell] = high if value > high else value
