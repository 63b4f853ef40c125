"""Shared by the op tests: run one registered op the way a graph would."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops import get_op


def run_op(name: str, attrs: dict[str, Any], inputs: list[np.ndarray],
           out: np.ndarray | None = None) -> np.ndarray:
    """Parse ``attrs``, infer the output shape, compute, and check the two agree."""
    op = get_op(name)
    parsed = op.parse_attrs(attrs)
    _, (shape,) = op.infer_shape(parsed, [tuple(array.shape) for array in inputs])
    (result,) = op.compute(np, parsed, inputs, out=out)
    assert result.shape == shape
    return result


def infer(op_name: str, raw: dict[str, Any], shapes: list) -> tuple[list, list]:
    """The op's shape inference for `shapes`, its attributes parsed from `raw`."""
    op = get_op(op_name)
    return op.infer_shape(op.parse_attrs(raw), shapes)


def run(op_name: str, raw: dict[str, Any], *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
    """The op's outputs for `inputs`, its attributes parsed from `raw`."""
    op = get_op(op_name)
    return op.compute(np, op.parse_attrs(raw), list(inputs))
