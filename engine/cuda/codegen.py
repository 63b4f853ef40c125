"""C source for one fused elementwise chain: the body of a single CuPy ``ElementwiseKernel``.

The head op of a fused elementwise node runs as usual into the output ``y``; the generated
kernel then applies every step to ``y`` in place, reading each step's extra operand from inputs
``e0, e1, ...``. Each step's result is cast to ``y``'s dtype, as on the CPU where every step
writes into the output buffer. Pure Python: no CuPy needed to build or test the source.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import EngineError
from engine.ops.internal.fused import FusedStep

# C type used for the arithmetic of each output dtype (half is computed in float, as CUDA does).
_COMPUTE_TYPES = {
    "float16": "float", "float32": "float", "float64": "double",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
    "int32": "int", "uint32": "unsigned int", "int64": "long long", "uint64": "unsigned long long",
    "bool": "bool",
}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
FLOAT_INF = "__int_as_float(0x7f800000)"
FLOAT_NAN = "__int_as_float(0x7fc00000)"
DOUBLE_INF = "__longlong_as_double(0x7ff0000000000000LL)"
DOUBLE_NAN = "__longlong_as_double(0x7ff8000000000000LL)"


@dataclass(frozen=True)
class ChainStep:
    """One step with its attributes already written in: ``expression`` over ``a`` and ``b``."""

    expression: str
    position: int
    arity: int


@dataclass(frozen=True)
class FusedSource:
    """Everything `cupy.ElementwiseKernel` needs, and the key the compiled kernel is cached by."""

    name: str
    in_params: str
    out_params: str
    operation: str
    key: tuple


def compute_type(dtype: np.dtype) -> str:
    """The C type the chain computes in for an output of ``dtype``."""
    try:
        return _COMPUTE_TYPES[np.dtype(dtype).name]
    except KeyError:
        raise EngineError(f"fused kernels do not support dtype {np.dtype(dtype).name}; "
                          f"supported: {', '.join(_COMPUTE_TYPES)}") from None


def c_literal(value: object, ctype: str) -> str:
    """``value`` as a C literal of the compute type (``inf``/``nan`` as bit patterns)."""
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (int, np.integer)):
        return f"({int(value)})" if value < 0 else str(int(value))
    if not isinstance(value, (float, np.floating)):
        raise EngineError(f"cannot write attribute value {value!r} ({type(value).__name__}) "
                          "into a fused kernel; expected a number or a bool")
    single = ctype == "float"
    number = float(value)
    if math.isnan(number):
        return FLOAT_NAN if single else DOUBLE_NAN
    if math.isinf(number):
        magnitude = FLOAT_INF if single else DOUBLE_INF
        return magnitude if number > 0 else f"(-{magnitude})"
    text = repr(float(np.float32(number))) + "f" if single else repr(number)
    return f"({text})" if number < 0 or text.startswith("-") else text


def step_expression(step: FusedStep, ctype: str) -> str:
    """The step's C expression with each ``{attr}`` replaced by its literal value."""
    expression = step.op.expression(step.attrs)
    if expression is None:
        raise EngineError(f"op {step.op.name} has no elementwise expression; it cannot be part "
                          "of a generated fused kernel")

    def literal(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in step.attrs:
            raise EngineError(f"op {step.op.name}: expression {expression!r} names attribute "
                              f"{name!r}, which the op does not have")
        return c_literal(step.attrs[name], ctype)

    return _PLACEHOLDER.sub(literal, expression)


def chain_steps(steps: Sequence[FusedStep], dtype: np.dtype) -> tuple[ChainStep, ...]:
    """The chain's steps with literal attributes, for an output of ``dtype``."""
    ctype = compute_type(dtype)
    return tuple(ChainStep(step_expression(step, ctype), step.position, step.arity)
                 for step in steps)


def fused_source(steps: Sequence[FusedStep], out_dtype: np.dtype,
                 extra_dtypes: Sequence[np.dtype]) -> FusedSource:
    """The kernel that applies ``steps`` in place to ``y`` (extra operands ``e0, e1, ...``).

    Raises:
        EngineError: a step has no expression, or a dtype has no C type.
    """
    out_dtype = np.dtype(out_dtype)
    ctype = compute_type(out_dtype)
    for dtype in extra_dtypes:
        compute_type(dtype)
    chain = chain_steps(steps, out_dtype)
    expected = sum(step.arity - 1 for step in chain)
    if expected != len(extra_dtypes):
        raise EngineError(f"fused chain reads {expected} extra operand(s); got "
                          f"{len(extra_dtypes)} dtype(s)")
    lines, operand = [f"{ctype} v = ({ctype})y;"], 0
    for step in chain:
        names = ["v"]
        for _ in range(step.arity - 1):
            names.append(f"({ctype})e{operand}")
            operand += 1
        names.insert(step.position, names.pop(0))  # the running value enters at `position`
        bound = "; ".join(f"const {ctype} {var} = {value}"
                          for var, value in zip("ab", names))
        lines.append(f"{{ {bound}; v = ({ctype})(Y)({step.expression}); }}")
    lines.append("y = (Y)v;")
    key = (tuple((step.expression, step.position, step.arity) for step in chain),
           out_dtype.str, tuple(np.dtype(dtype).str for dtype in extra_dtypes))
    digest = hashlib.sha1(repr(key).encode()).hexdigest()[:16]
    # Extras by their concrete dtype: CuPy's type placeholders are single characters, too few
    # for a long chain, and the key already fixes every dtype.
    in_params = ", ".join(f"{np.dtype(dtype).name} e{k}" for k, dtype in enumerate(extra_dtypes))
    return FusedSource(f"hybridserve_fused_{digest}", in_params, "Y y", "\n".join(lines), key)


__all__ = ["ChainStep", "FusedSource", "c_literal", "chain_steps", "compute_type",
           "fused_source", "step_expression"]
