"""`_fused_elementwise`: one node standing for an op followed by a chain of elementwise ops.

The fusion pass builds these nodes; they are never read from or written to JSON. On the CPU the
chain runs in place on the head op's output buffer (no temporaries); the GPU backend turns the
steps' ``elementwise`` expressions into one generated kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.kernels import banded_pool, bf16_handoff, epilogue, gemm_amx_shortcut
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register


@dataclass(frozen=True)
class FusedStep:
    """One op of a fused chain; the running value enters it at input ``position``."""

    op: OpDef
    attrs: Attrs
    position: int
    arity: int


def _identity(value: Any) -> Any:
    return value


def _inputs(attrs: Attrs) -> tuple[str, ...]:
    count = attrs.head.arity + sum(step.arity - 1 for step in attrs.steps)
    return tuple(f"arg{k}" for k in range(count))


def split_inputs(attrs: Attrs, values: list[Any]) -> tuple[list[Any], list[list[Any]]]:
    """(the head op's inputs, each step's extra operands) of a fused node's ``values``."""
    head_values = list(values[:attrs.head.arity])
    extras, offset = [], attrs.head.arity
    for step in attrs.steps:
        extras.append(list(values[offset:offset + step.arity - 1]))
        offset += step.arity - 1
    return head_values, extras


def _infer(method: str):
    def infer(attrs: Attrs, values: list[Any]) -> tuple[list[Any], list[Any]]:
        head_values, extras = split_inputs(attrs, values)
        head_in, head_out = getattr(attrs.head.op, method)(attrs.head.attrs, head_values)
        completed, running = list(head_in), head_out[0]
        for step, extra in zip(attrs.steps, extras):
            args = list(extra)
            args.insert(step.position, running)
            step_in, step_out = getattr(step.op, method)(step.attrs, args)
            completed += [v for k, v in enumerate(step_in) if k != step.position]
            running = step_out[0]
        return completed, [running]

    return infer


def _kernel(xp: Any, attrs: Attrs, *values: Any, out: Any = None) -> Any:
    head_values, extras = split_inputs(attrs, list(values))
    running = attrs.head.op.compute(xp, attrs.head.attrs, head_values, out)[0]
    if out is None and (running.base is not None or any(running is v for v in values)):
        running = running.copy()  # never write in place into a caller's array
    for step, extra in zip(attrs.steps, extras):
        args = list(extra)
        args.insert(step.position, running)
        running = step.op.compute(xp, step.attrs, args, running)[0]
    return running


def _bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
          workspace: Any = None) -> list[Callable[[], Any]]:
    """The head op bound as it would be alone, then the steps: on the CPU each bound in place
    on ``out`` (the first folded into the head's last call where `epilogue` can), on a GPU
    (``xp`` is CuPy) one generated kernel for the whole chain."""
    head_inputs, extras = split_inputs(attrs, inputs)
    steps = attrs.steps
    merged = _merged_shortcut(xp, attrs, head_inputs, extras, out, workspace)
    if merged is not None:  # the head's product and the shortcut it adds, as one
        calls, steps, extras = merged, steps[1:], extras[1:]
    else:
        calls = attrs.head.op.bind_calls(xp, attrs.head.attrs, head_inputs, out, workspace)
    if xp is not np:  # the GPU's array module (`engine.cuda.array_module`) binds the chain
        operands = [value for extra in extras for value in extra]
        return [*calls, *xp.bind_elementwise_chain(steps, operands, out)]
    calls, remaining = epilogue.absorb(calls, steps, out, extras)
    if remaining and workspace is not None:
        # the head's bf16 hand-off would skip the steps left: its readers read ``out``
        bf16_handoff.withdraw(workspace, out)
        banded_pool.withdraw(workspace, out)
    skipped = len(steps) - len(remaining)
    for step, extra in zip(remaining, extras[skipped:]):
        args = list(extra)
        args.insert(step.position, out)
        calls += step.op.bind_calls(xp, step.attrs, args, out)
    return calls


def _merged_shortcut(xp: Any, attrs: Attrs, head_inputs: list[Any], extras: list[list[Any]],
                     out: Any, workspace: Any) -> list[Callable[[], Any]] | None:
    """A 1×1 convolution adding a shortcut's output bound with that shortcut's product as
    one (`gemm_amx_shortcut.merge`: ResNet v2's downsampling blocks in bf16); else None."""
    if (xp is not np or workspace is None or not _adds_as_1x1_product(attrs)
            or len(head_inputs) != 2 or len(extras[0]) != 1):
        return None
    return gemm_amx_shortcut.merge(*head_inputs, extras[0][0], out, workspace)


def _adds_as_1x1_product(attrs: Attrs) -> bool:
    """Whether the chain is a 1×1 convolution without a bias (stride 1, no padding, one
    group, channels first) whose first step adds another array."""
    head = attrs.head
    if (head.op.name != "Convolution" or not attrs.steps or head.arity != 2
            or attrs.steps[0].op.name not in epilogue.RESIDUAL_ADDS):
        return False
    conv = head.attrs
    return (tuple(conv.kernel) == (1, 1) and conv.num_group == 1
            and all(value == 1 for value in (conv.stride or ()))
            and not any(conv.pad or ())
            and all(value == 1 for value in (conv.dilate or ()))
            and getattr(conv, "layout", None) in (None, "NCHW"))


def _reads_as_sum(reader: Any) -> bool:
    """Whether ``reader`` (a `workspace.Reader` of a fused node) is the add of a 1×1
    convolution's chain, reading the array as the other operand of its first step."""
    return _adds_as_1x1_product(reader.attrs) and reader.position == reader.attrs.head.arity


def _scratch(attrs: Attrs, shapes: list[Any], dtype: Any) -> int:
    """The head op's scratch (the steps run in place and need none)."""
    head = attrs.head
    if head.op.scratch is None:
        return 0
    return head.op.scratch(head.attrs, shapes[:head.arity], dtype)


def _parts(attrs: Attrs) -> tuple[OpDef, ...]:
    return (attrs.head.op, *(step.op for step in attrs.steps))


def _shape_infer(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    return _infer("infer_shape")(attrs, shapes)


FUSED_ELEMENTWISE = register(OpDef(
    name="_fused_elementwise",
    params=(Param("head", _identity), Param("steps", _identity)),
    inputs=_inputs,
    infer_shape=_shape_infer,
    infer_dtype=_infer("infer_dtype"),
    kernel=_kernel,
    writes_out=True,
    bind=_bind,
    scratch=_scratch,
    parts=_parts,
    doc="An op followed by elementwise ops applied in place to its output (built by fusion).",
))
# a downsampling shortcut's output this chain adds may be merged into its product
gemm_amx_shortcut.register_reader(FUSED_ELEMENTWISE.name, _reads_as_sum)
