"""Elementwise operators: unary math, same-shape and broadcast binaries, scalar forms, clip.

Every op here is one `OpDef` built by a small factory from a table row: MXNet's name and aliases,
the kernel (written against ``xp``, writing into ``out=`` where a ufunc can) and a C expression
over ``a`` (and ``b``) with attributes as ``{name}`` for the fusion pass.

Dtypes follow MXNet: legacy ops keep the input dtype (comparisons give 1.0/0.0 in it, a scalar
is first cast to an integer input's dtype), NumPy-mode (``_npi_*``) comparisons give ``bool``
and NumPy-mode arithmetic promotes mixed inputs (a float input wins).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_float
from engine.ops.dtypes import BOOL, FLOAT32
from engine.ops.math.stable_functions import erf, sigmoid
from engine.ops.registry import REQUIRED, Attrs, MaybeShape, OpDef, Param, default_dtype, register
from engine.ops.shapes import broadcast, same_shape

DType = np.dtype
DTypes = list["np.dtype | None"]
# compute(xp, *operands, out) -> array; `out` may be None and may alias an operand.
Compute = Callable[..., Any]
DTypeRule = Callable[[Attrs, DTypes], tuple[DTypes, DTypes]]



# ---------------------------------------------------------------------------------------------
# dtype rules


def _first_known(dtypes: DTypes) -> np.dtype | None:
    return next((np.dtype(dtype) for dtype in dtypes if dtype is not None), None)


def promote(dtypes: list[np.dtype]) -> np.dtype:
    """NumPy-mode result dtype: equal dtypes stay, a float input wins over integers."""
    unique = {np.dtype(dtype) for dtype in dtypes}
    if len(unique) == 1:
        return unique.pop()
    floats = [dtype for dtype in unique if np.issubdtype(dtype, np.floating)]
    return np.result_type(*(floats or unique))


def _promote_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    known = [np.dtype(dtype) for dtype in dtypes if dtype is not None]
    if not known:
        return list(dtypes), [None]
    out = promote(known)
    return [out if dtype is None else dtype for dtype in dtypes], [out]


def _true_divide_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    inputs, (out,) = _promote_dtype(attrs, dtypes)
    if out is not None and not np.issubdtype(out, np.floating):
        out = FLOAT32
    return inputs, [out]


def _bool_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    known = _first_known(dtypes)
    return [known if dtype is None else dtype for dtype in dtypes], [BOOL]


def _np_scalar_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    dtype = _first_known(dtypes)
    if dtype is None or np.issubdtype(dtype, np.floating) or attrs.is_int:
        return [dtype], [dtype]
    return [dtype], [FLOAT32]


def _np_true_divide_scalar_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    dtype = _first_known(dtypes)
    if dtype is None or np.issubdtype(dtype, np.floating):
        return [dtype], [dtype]
    return [dtype], [FLOAT32]


def _output_dtype(rule: DTypeRule, attrs: Attrs, dtypes: list[np.dtype]) -> np.dtype:
    _, (out,) = rule(attrs, list(dtypes))
    return np.dtype(out)


# ---------------------------------------------------------------------------------------------
# shapes


def _broadcast_dim(x: int, y: int) -> int:
    if x and y:
        return broadcast((x,), (y,))[0]
    known = x or y
    return known if known != 1 else 0


def broadcast_partial(first: MaybeShape, second: MaybeShape) -> MaybeShape:
    """Broadcast shape of two partially known shapes (0 = unknown dim, None = unknown shape)."""
    if first is None or second is None:
        return None
    if all(first) and all(second):
        return broadcast(first, second)
    length = max(len(first), len(second))
    a = (1,) * (length - len(first)) + tuple(first)
    b = (1,) * (length - len(second)) + tuple(second)
    try:
        return tuple(_broadcast_dim(x, y) for x, y in zip(a, b, strict=True))
    except ShapeError:
        raise ShapeError(f"shapes {tuple(first)} and {tuple(second)} do not broadcast") from None


def _broadcast_shape(attrs: Attrs,
                     shapes: list[MaybeShape]) -> tuple[list[MaybeShape], list[MaybeShape]]:
    return list(shapes), [broadcast_partial(shapes[0], shapes[1])]


# ---------------------------------------------------------------------------------------------
# kernel plumbing


def _finish(xp: Any, compute: Compute, operands: tuple[Any, ...], dtype: np.dtype,
            out: Any) -> Any:
    """Run ``compute`` into ``out`` (cast unsafely), or return its result in ``dtype``."""
    if out is not None:
        compute(xp, *operands, out)
        return out
    result = compute(xp, *operands, None)
    return result if result.dtype == dtype else result.astype(dtype)


def _via_temp(fn: Callable[..., Any]) -> Compute:
    """Adapt ``fn(xp, *operands)`` (which may need temporaries) to the ``compute`` protocol."""

    def compute(xp: Any, *args: Any) -> Any:
        *operands, out = args
        result = fn(xp, *operands)
        if out is None:
            return result
        xp.copyto(out, result, casting="unsafe")
        return out

    return compute


def _ufunc(name: str) -> Compute:
    """``compute`` that calls ``xp.<name>`` with ``out=`` and unsafe casting."""

    def compute(xp: Any, *args: Any) -> Any:
        *operands, out = args
        if out is None:
            return getattr(xp, name)(*operands)
        return getattr(xp, name)(*operands, out=out, casting="unsafe")

    compute.__name__ = name
    return compute


def _as_dtype(xp: Any, array: Any, dtype: np.dtype) -> Any:
    # Integer inputs of an op with a float result are computed in that float dtype.
    if np.issubdtype(dtype, np.floating) and array.dtype != dtype:
        return array.astype(dtype)
    return array


# ---------------------------------------------------------------------------------------------
# numerics that are not a single ufunc


def _erf(xp: Any, x: Any) -> Any:
    # float16 is computed in float32: the fit's coefficients need more than 11 bits.
    return erf(xp, x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False))


def _round(xp: Any, x: Any) -> Any:
    whole = xp.trunc(x)
    bump = xp.abs(x - whole) >= 0.5
    return xp.where(bump, whole + xp.sign(x), whole)


def _softsign(xp: Any, x: Any) -> Any:
    return x / (1 + xp.abs(x))


def _mod(xp: Any, a: Any, b: Any) -> Any:
    """MXNet's mod: the sign of the divisor (as Python's ``%``), and 0 where the divisor is 0."""
    if np.isscalar(b):
        return xp.zeros_like(a) if b == 0 else xp.mod(a, b)
    zero = b == 0
    result = xp.mod(a, xp.where(zero, 1, b))
    return xp.where(zero, 0, result).astype(result.dtype, copy=False)


def _rsqrt(xp: Any, x: Any, out: Any) -> Any:
    out = xp.sqrt(x, out=out) if out is None else xp.sqrt(x, out=out, casting="unsafe")
    return xp.divide(1, out, out=out, casting="unsafe")


def _relu(xp: Any, x: Any, out: Any) -> Any:
    zero = x.dtype.type(0)
    return xp.maximum(x, zero) if out is None else xp.maximum(x, zero, out=out, casting="unsafe")


def _copy(xp: Any, x: Any, out: Any) -> Any:
    if out is None:
        return x.copy()
    if out is not x:
        xp.copyto(out, x, casting="unsafe")
    return out


# ---------------------------------------------------------------------------------------------
# unary operators


def _unary(name: str, compute: Compute, expression: str, aliases: tuple[str, ...] = (),
           params: tuple[Param, ...] = (), writes_out: bool = True,
           infer_dtype: DTypeRule = default_dtype, doc: str = "") -> OpDef:
    def kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
        dtype = _output_dtype(infer_dtype, attrs, [data.dtype])
        return _finish(xp, compute, (data,), dtype, out)

    kernel.__name__ = f"{name}_kernel"
    return register(OpDef(name=name, kernel=kernel, infer_shape=same_shape, params=params,
                          aliases=aliases, elementwise=expression, inplace=True,
                          writes_out=writes_out, infer_dtype=infer_dtype,
                          doc=doc or f"Elementwise {name}."))


# (name, numpy ufunc, C expression, aliases)
_UFUNC_UNARY: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("abs", "absolute", "(a < 0 ? -a : a)", ("_npi_absolute",)),
    ("sign", "sign", "(a > 0 ? 1 : (a < 0 ? -1 : 0))", ("_npi_sign",)),
    ("ceil", "ceil", "ceil(a)", ("_npi_ceil",)),
    ("floor", "floor", "floor(a)", ("_npi_floor",)),
    ("trunc", "trunc", "trunc(a)", ("_npi_trunc",)),
    ("fix", "trunc", "trunc(a)", ("_npi_fix",)),
    ("exp", "exp", "exp(a)", ("_npi_exp",)),
    ("expm1", "expm1", "expm1(a)", ("_npi_expm1",)),
    ("log", "log", "log(a)", ("_npi_log",)),
    ("log2", "log2", "log2(a)", ("_npi_log2",)),
    ("log10", "log10", "log10(a)", ("_npi_log10",)),
    ("log1p", "log1p", "log1p(a)", ("_npi_log1p",)),
    ("sqrt", "sqrt", "sqrt(a)", ("_npi_sqrt",)),
    ("cbrt", "cbrt", "cbrt(a)", ("_npi_cbrt",)),
    ("square", "square", "(a * a)", ("_npi_square",)),
    ("reciprocal", "reciprocal", "(1 / a)", ("_npi_reciprocal",)),
    ("negative", "negative", "(-a)", ("_npi_negative",)),
    ("sin", "sin", "sin(a)", ("_npi_sin",)),
    ("cos", "cos", "cos(a)", ("_npi_cos",)),
    ("tan", "tan", "tan(a)", ("_npi_tan",)),
    ("arcsin", "arcsin", "asin(a)", ("_npi_arcsin",)),
    ("arccos", "arccos", "acos(a)", ("_npi_arccos",)),
    ("arctan", "arctan", "atan(a)", ("_npi_arctan",)),
    ("sinh", "sinh", "sinh(a)", ("_npi_sinh",)),
    ("cosh", "cosh", "cosh(a)", ("_npi_cosh",)),
    ("tanh", "tanh", "tanh(a)", ("_npi_tanh",)),
    ("arcsinh", "arcsinh", "asinh(a)", ("_npi_arcsinh",)),
    ("arccosh", "arccosh", "acosh(a)", ("_npi_arccosh",)),
    ("arctanh", "arctanh", "atanh(a)", ("_npi_arctanh",)),
    ("logical_not", "logical_not", "(a == 0 ? 1 : 0)", ()),
)

for _name, _ufunc_name, _expr, _aliases in _UFUNC_UNARY:
    _unary(_name, _ufunc(_ufunc_name), _expr, _aliases)

_unary("_npi_logical_not", _ufunc("logical_not"), "(a == 0)", infer_dtype=_bool_dtype,
       doc="NumPy-mode logical not (bool output).")
_unary("round", _via_temp(_round), "round(a)", writes_out=False,
       doc="Round to the nearest integer, halves away from zero.")
_unary("rsqrt", _rsqrt, "(1 / sqrt(a))", doc="1 / sqrt(x).")
_unary("erf", _via_temp(_erf), "erf(a)", writes_out=False, doc="The Gauss error function.")
_unary("sigmoid", _via_temp(sigmoid), "(1 / (1 + exp(-a)))", ("_npx_sigmoid",),
       writes_out=False, doc="1 / (1 + exp(-x)).")
_unary("relu", _relu, "(a > 0 ? a : 0)", ("_npx_relu",), doc="max(x, 0).")
_unary("softsign", _via_temp(_softsign), "(a / (1 + (a < 0 ? -a : a)))", writes_out=False,
       doc="x / (1 + |x|).")
_unary("_copy", _copy, "a", ("identity", "_np_copy"), doc="A copy of the input.")
_unary("BlockGrad", _copy, "a", ("stop_gradient",),
       doc="Identity at inference (blocks gradients in training).")


def _hard_sigmoid(xp: Any, x: Any, out: Any, alpha: float, beta: float) -> Any:
    out = xp.multiply(x, alpha, out=out, casting="unsafe")
    xp.add(out, beta, out=out, casting="unsafe")
    xp.maximum(out, 0, out=out, casting="unsafe")
    return xp.minimum(out, 1, out=out, casting="unsafe")


def _hard_sigmoid_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    result = _hard_sigmoid(xp, data, out, attrs.alpha, attrs.beta)
    return result if out is not None or result.dtype == data.dtype else result.astype(data.dtype)


register(OpDef(
    name="hard_sigmoid",
    params=(Param("alpha", parse_float, 0.2), Param("beta", parse_float, 0.5)),
    kernel=_hard_sigmoid_kernel,
    infer_shape=same_shape,
    elementwise=("({alpha} * a + {beta} > 1 ? 1 : "
                 "({alpha} * a + {beta} < 0 ? 0 : {alpha} * a + {beta}))"),
    inplace=True,
    writes_out=True,
    doc="clip(alpha * x + beta, 0, 1).",
))


def _integral_bound(value: float, dtype: np.dtype) -> Any:
    # MXNet casts a float attribute to the data's dtype first (toward zero for integers).
    if np.issubdtype(dtype, np.integer):
        return int(value)
    return value


def _clip_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    low = _integral_bound(attrs.a_min, data.dtype)
    high = _integral_bound(attrs.a_max, data.dtype)
    if data.dtype.kind == "f":  # one pass (6x faster than maximum then minimum), NaN kept
        return xp.clip(data, data.dtype.type(low), data.dtype.type(high), out=out)
    if out is None:
        result = xp.minimum(xp.maximum(data, low), high)
        return result if result.dtype == data.dtype else result.astype(data.dtype)
    xp.maximum(data, low, out=out, casting="unsafe")
    return xp.minimum(out, high, out=out, casting="unsafe")


register(OpDef(
    name="clip",
    params=(Param("a_min", parse_float, REQUIRED), Param("a_max", parse_float, REQUIRED)),
    kernel=_clip_kernel,
    infer_shape=same_shape,
    elementwise="(a < {a_min} ? {a_min} : (a > {a_max} ? {a_max} : a))",
    inplace=True,
    writes_out=True,
    doc="Limit values to [a_min, a_max].",
))


# ---------------------------------------------------------------------------------------------
# binary operators (same shape, broadcast, NumPy-mode)


def _binary(name: str, compute: Compute, expression: str, aliases: tuple[str, ...] = (), *,
            broadcasting: bool, infer_dtype: DTypeRule, writes_out: bool = True,
            doc: str = "") -> OpDef:
    def kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any, out: Any = None) -> Any:
        dtype = _output_dtype(infer_dtype, attrs, [lhs.dtype, rhs.dtype])
        if not broadcasting and lhs.shape != rhs.shape:
            raise ShapeError(f"{name}: lhs {lhs.shape} and rhs {rhs.shape} must have one shape")
        lhs, rhs = _as_dtype(xp, lhs, dtype), _as_dtype(xp, rhs, dtype)
        return _finish(xp, compute, (lhs, rhs), dtype, out)

    kernel.__name__ = f"{name}_kernel"
    return register(OpDef(
        name=name, kernel=kernel, aliases=aliases, inputs=("lhs", "rhs"),
        infer_shape=_broadcast_shape if broadcasting else same_shape, infer_dtype=infer_dtype,
        elementwise=expression, inplace=not broadcasting, writes_out=writes_out,
        doc=doc or f"Elementwise {name} of lhs and rhs"
                   f"{' with NumPy broadcasting' if broadcasting else ''}."))


_MOD_EXPR = ("(b == 0 ? 0 : ((fmod(a, b) != 0 && ((fmod(a, b) < 0) != (b < 0))) "
             "? fmod(a, b) + b : fmod(a, b)))")

# (key, compute, C expression); the key names the op in every family below.
_ARITHMETIC: dict[str, tuple[Compute, str]] = {
    "add": (_ufunc("add"), "(a + b)"),
    "sub": (_ufunc("subtract"), "(a - b)"),
    "mul": (_ufunc("multiply"), "(a * b)"),
    "div": (_ufunc("divide"), "(a / b)"),
    "mod": (_via_temp(_mod), _MOD_EXPR),
    "power": (_ufunc("power"), "pow(a, b)"),
    "maximum": (_ufunc("maximum"), "(a > b ? a : b)"),
    "minimum": (_ufunc("minimum"), "(a < b ? a : b)"),
    "hypot": (_ufunc("hypot"), "hypot(a, b)"),
}
_LOGIC: dict[str, tuple[Compute, str]] = {
    "equal": (_ufunc("equal"), "(a == b ? 1 : 0)"),
    "not_equal": (_ufunc("not_equal"), "(a != b ? 1 : 0)"),
    "greater": (_ufunc("greater"), "(a > b ? 1 : 0)"),
    "greater_equal": (_ufunc("greater_equal"), "(a >= b ? 1 : 0)"),
    "lesser": (_ufunc("less"), "(a < b ? 1 : 0)"),
    "lesser_equal": (_ufunc("less_equal"), "(a <= b ? 1 : 0)"),
    "logical_and": (_ufunc("logical_and"), "((a != 0 && b != 0) ? 1 : 0)"),
    "logical_or": (_ufunc("logical_or"), "((a != 0 || b != 0) ? 1 : 0)"),
    "logical_xor": (_ufunc("logical_xor"), "(((a != 0) != (b != 0)) ? 1 : 0)"),
}

# Same-shape (legacy) names and their aliases.
_ELEMWISE_NAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "add": ("elemwise_add", ("_plus", "_Plus", "_add")),
    "sub": ("elemwise_sub", ("_minus", "_Minus", "_sub")),
    "mul": ("elemwise_mul", ("_mul", "_Mul")),
    "div": ("elemwise_div", ("_div", "_Div")),
    "mod": ("_mod", ("_Mod",)),
    "power": ("_power", ("_Power", "_pow")),
    "maximum": ("_maximum", ("_Maximum",)),
    "minimum": ("_minimum", ("_Minimum",)),
    "hypot": ("_hypot", ("_Hypot",)),
}
# Broadcast names: legacy name, its aliases (NumPy-mode arithmetic shares the record).
_BROADCAST_NAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "add": ("broadcast_add", ("broadcast_plus", "_npi_add")),
    "sub": ("broadcast_sub", ("broadcast_minus", "_npi_subtract")),
    "mul": ("broadcast_mul", ("_npi_multiply",)),
    "div": ("broadcast_div", ()),
    "mod": ("broadcast_mod", ("_npi_mod",)),
    "power": ("broadcast_power", ("_npi_power",)),
    "maximum": ("broadcast_maximum", ("_npi_maximum",)),
    "minimum": ("broadcast_minimum", ("_npi_minimum",)),
    "hypot": ("broadcast_hypot", ("_npi_hypot",)),
}
_NP_LOGIC_NAMES = {"lesser": "less", "lesser_equal": "less_equal"}

for _key, (_compute, _expr) in _ARITHMETIC.items():
    _name, _aliases = _ELEMWISE_NAMES[_key]
    _binary(_name, _compute, _expr, _aliases, broadcasting=False, infer_dtype=default_dtype,
            writes_out=_key != "mod")
    _name, _aliases = _BROADCAST_NAMES[_key]
    _binary(_name, _compute, _expr, _aliases, broadcasting=True, infer_dtype=_promote_dtype,
            writes_out=_key != "mod")

_binary("_npi_true_divide", _ufunc("divide"), "(a / b)", broadcasting=True,
        infer_dtype=_true_divide_dtype, doc="NumPy-mode true division (integers give float32).")

for _key, (_compute, _expr) in _LOGIC.items():
    _binary(f"_{_key}", _compute, _expr, broadcasting=False, infer_dtype=default_dtype,
            doc=f"Elementwise {_key}: 1 where true, 0 where false, in the input dtype.")
    _binary(f"broadcast_{_key}", _compute, _expr, broadcasting=True, infer_dtype=_promote_dtype,
            doc=f"Broadcast {_key}: 1 where true, 0 where false, in the input dtype.")
    _np_key = _NP_LOGIC_NAMES.get(_key, _key)
    _binary(f"_npi_{_np_key}", _compute, _expr.replace(" ? 1 : 0", ""), broadcasting=True,
            infer_dtype=_bool_dtype, doc=f"NumPy-mode broadcast {_np_key} (bool output).")


# ---------------------------------------------------------------------------------------------
# scalar operators


_SCALAR_PARAMS = (Param("scalar", parse_float, 1.0), Param("is_int", parse_bool, True))


def _scalar_value(value: float, dtype: np.dtype) -> Any:
    if np.issubdtype(dtype, np.integer):
        return int(value)
    if dtype == BOOL:
        return bool(value)
    return value


def _swap(compute: Compute) -> Compute:
    def swapped(xp: Any, a: Any, b: Any, out: Any) -> Any:
        return compute(xp, b, a, out)

    return swapped


def _scalar(name: str, compute: Compute, expression: str, aliases: tuple[str, ...] = (),
            infer_dtype: DTypeRule = default_dtype, writes_out: bool = True,
            doc: str = "") -> OpDef:
    def kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
        dtype = _output_dtype(infer_dtype, attrs, [data.dtype])
        data = _as_dtype(xp, data, dtype)
        scalar = _scalar_value(attrs.scalar, data.dtype)
        return _finish(xp, compute, (data, scalar), dtype, out)

    kernel.__name__ = f"{name}_kernel"
    return register(OpDef(name=name, kernel=kernel, infer_shape=same_shape,
                          params=_SCALAR_PARAMS, aliases=aliases, elementwise=expression,
                          inplace=True, writes_out=writes_out, infer_dtype=infer_dtype,
                          doc=doc or f"Elementwise {name} with the attribute `scalar`."))


def _scalar_expression(expression: str, reverse: bool) -> str:
    """A binary expression with the scalar as ``b`` (or as ``a`` when ``reverse``)."""
    scalar_name = "a" if reverse else "b"
    return re.sub(r"\b[ab]\b",
                  lambda match: "{scalar}" if match.group() == scalar_name else "a", expression)


# (key, legacy name, legacy aliases, NumPy-mode name or "", reversed operands)
_SCALAR_OPS: tuple[tuple[str, str, tuple[str, ...], str, bool], ...] = (
    ("add", "_plus_scalar", ("_PlusScalar",), "_npi_add_scalar", False),
    ("sub", "_minus_scalar", ("_MinusScalar",), "_npi_subtract_scalar", False),
    ("sub", "_rminus_scalar", ("_RMinusScalar",), "_npi_rsubtract_scalar", True),
    ("mul", "_mul_scalar", ("_MulScalar",), "_npi_multiply_scalar", False),
    ("div", "_div_scalar", ("_DivScalar",), "", False),
    ("div", "_rdiv_scalar", ("_RDivScalar",), "", True),
    ("mod", "_mod_scalar", ("_ModScalar",), "_npi_mod_scalar", False),
    ("mod", "_rmod_scalar", ("_RModScalar",), "_npi_rmod_scalar", True),
    ("power", "_power_scalar", ("_PowerScalar",), "_npi_power_scalar", False),
    ("power", "_rpower_scalar", ("_RPowerScalar",), "_npi_rpower_scalar", True),
    ("maximum", "_maximum_scalar", ("_MaximumScalar",), "_npi_maximum_scalar", False),
    ("minimum", "_minimum_scalar", ("_MinimumScalar",), "_npi_minimum_scalar", False),
    ("hypot", "_hypot_scalar", ("_HypotScalar",), "_npi_hypot_scalar", False),
)
_SCALAR_LOGIC: tuple[tuple[str, str, str], ...] = (
    ("equal", "_EqualScalar", "equal"),
    ("not_equal", "_NotEqualScalar", "not_equal"),
    ("greater", "_GreaterScalar", "greater"),
    ("greater_equal", "_GreaterEqualScalar", "greater_equal"),
    ("lesser", "_LesserScalar", "less"),
    ("lesser_equal", "_LesserEqualScalar", "less_equal"),
    ("logical_and", "_LogicalAndScalar", "logical_and"),
    ("logical_or", "_LogicalOrScalar", "logical_or"),
    ("logical_xor", "_LogicalXorScalar", "logical_xor"),
)

for _key, _name, _aliases, _np_name, _reverse in _SCALAR_OPS:
    _compute, _expr = _ARITHMETIC[_key]
    _compute = _swap(_compute) if _reverse else _compute
    _expr = _scalar_expression(_expr, _reverse)
    _scalar(_name, _compute, _expr, _aliases, writes_out=_key != "mod")
    if _np_name:
        _scalar(_np_name, _compute, _expr, infer_dtype=_np_scalar_dtype,
                writes_out=_key != "mod")

for _reverse, _np_name in ((False, "_npi_true_divide_scalar"),
                           (True, "_npi_rtrue_divide_scalar")):
    _compute = _swap(_ufunc("divide")) if _reverse else _ufunc("divide")
    _scalar(_np_name, _compute, _scalar_expression("(a / b)", _reverse),
            infer_dtype=_np_true_divide_scalar_dtype,
            doc="NumPy-mode true division by a scalar (integers give float32).")

for _key, _camel, _np_key in _SCALAR_LOGIC:
    _compute, _expr = _LOGIC[_key]
    _scalar(f"_{_key}_scalar", _compute, _scalar_expression(_expr, False), (_camel,),
            doc=f"Elementwise {_key} with `scalar`: 1/0 in the input dtype.")
    _scalar(f"_npi_{_np_key}_scalar", _compute,
            _scalar_expression(_expr.replace(" ? 1 : 0", ""), False), infer_dtype=_bool_dtype,
            doc=f"NumPy-mode {_np_key} with `scalar` (bool output).")
