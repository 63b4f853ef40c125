"""Epilogues: a clamp that follows a bound op, applied while the op's result is in cache.

A fused elementwise chain on the CPU runs its steps one after another over the whole output
(`engine.runtime.plan`): after a depthwise convolution, MobileNet v2's ReLU6 (``clip(0, 6)``)
is one more pass over memory. Where the head's last call is a kernel that can clamp as it
writes (`depthwise_kernel.depthwise_rows`), `absorb` hands it the bounds and drops the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

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
    if bounds is None or getattr(last, "func", None) is not depthwise_kernel.depthwise_rows:
        return calls, steps
    low, high = (out.dtype.type(bound) for bound in bounds)
    clamped = partial(last.func, *last.args[:6], max(last.args[6], low), min(last.args[7], high))
    return [*calls[:-1], clamped], steps[1:]
