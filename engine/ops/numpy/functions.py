"""More NumPy-mode operators: ``std``/``var``, ``diff``, ``rot90``, stacks, window functions,
``logspace``, ``indices``, bitwise and integer maths, ``ldexp``, ``tensordot`` and ``einsum``.

Shape rules that NumPy already knows run NumPy itself on empty stand-in arrays, so the inferred
shape is exactly the kernel's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.ops.attrs import (
    optional,
    parse_bool,
    parse_dtype,
    parse_float,
    parse_int,
    parse_int_tuple,
    parse_str,
)
from engine.ops.dtypes import FLOAT32, INT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, broadcast_shapes, same_shape


def numpy_shape(compute: Callable[..., Any]) -> Callable[[Attrs, list[MaybeShape]], Inferred]:
    """A shape rule: ``compute(np, attrs, *inputs)`` on zero-filled stand-ins of known shapes."""

    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        if any(shape is None or not all(shape) for shape in shapes):
            return shapes, [None]
        stand_ins = [np.zeros(shape, np.float32) for shape in shapes]
        return shapes, [tuple(np.shape(compute(np, attrs, *stand_ins)))]

    return infer


def _first_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    known = next((dtype for dtype in dtypes if dtype is not None), None)
    return dtypes, [known]


def _add(name: str, inputs: Any, params: tuple[Param, ...], kernel: Callable[..., Any],
         doc: str, infer: Any = None, dtype: Any = _first_dtype, hidden: int = 0) -> None:
    register(OpDef(name=name, inputs=inputs, params=params, kernel=kernel,
                   infer_shape=infer or numpy_shape(kernel), infer_dtype=dtype,
                   hidden_outputs=hidden, doc=doc))


def _arguments(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"arg{index}" for index in range(attrs.num_args))


# --- statistics and differences ---------------------------------------------------------------

def _moment(fn: str) -> Callable[..., Any]:
    def kernel(xp: Any, attrs: Attrs, a: Any) -> Any:
        dtype = a.dtype if attrs.dtype is None else attrs.dtype
        return getattr(xp, fn)(a, axis=attrs.axis, ddof=attrs.ddof,
                               keepdims=attrs.keepdims).astype(dtype)

    return kernel


_MOMENT_PARAMS = (Param("axis", optional(parse_int_tuple), None),
                  Param("dtype", optional(parse_dtype), None), Param("ddof", parse_int, 0),
                  Param("keepdims", parse_bool, False))
for _name in ("std", "var"):
    _add(f"_npi_{_name}", ("a",), _MOMENT_PARAMS, _moment(_name),
         f"NumPy {_name} over axis (ddof: delta degrees of freedom).",
         dtype=lambda attrs, dtypes: (dtypes, [dtypes[0] if attrs.dtype is None
                                               else attrs.dtype]), hidden=1)

_add("_npi_diff", ("a",), (Param("n", parse_int, 1), Param("axis", parse_int, -1)),
     lambda xp, attrs, a: xp.diff(a, n=attrs.n, axis=attrs.axis),
     "n-th discrete difference along axis.")
_add("_npi_rot90", ("data",), (Param("k", parse_int, 1),
                              Param("axes", optional(parse_int_tuple), None)),
     lambda xp, attrs, a: xp.ascontiguousarray(xp.rot90(a, attrs.k, attrs.axes or (0, 1))),
     "Rotate by 90 degrees k times in the plane of axes.")


# --- stacks -----------------------------------------------------------------------------------

_add("_npi_column_stack", _arguments, (Param("num_args", parse_int),),
     lambda xp, attrs, *arrays: xp.column_stack(arrays), "1-D arrays as columns of a matrix.")
_add("_npi_dstack", _arguments, (Param("num_args", parse_int), Param("dim", parse_int, 1)),
     lambda xp, attrs, *arrays: xp.dstack(arrays), "Join along the third axis.")


# --- generated arrays -------------------------------------------------------------------------

_CREATION_TAIL = (Param("ctx", parse_str, ""), Param("dtype", parse_dtype, FLOAT32))


def _window(fn: str) -> Callable[..., Any]:
    return lambda xp, attrs: getattr(xp, fn)(attrs.M or 0).astype(attrs.dtype)


for _name in ("hanning", "hamming", "blackman"):
    _add(f"_npi_{_name}", (), (Param("M", optional(parse_int), None), *_CREATION_TAIL),
         _window(_name), f"The {_name} window of M points.",
         dtype=lambda attrs, dtypes: ([], [attrs.dtype]))

_add("_npi_logspace", (),
     (Param("start", parse_float), Param("stop", parse_float), Param("num", parse_int),
      Param("endpoint", parse_bool, True), Param("base", parse_float, 10.0), *_CREATION_TAIL),
     lambda xp, attrs: xp.logspace(attrs.start, attrs.stop, attrs.num, endpoint=attrs.endpoint,
                                   base=attrs.base).astype(attrs.dtype),
     "num values spaced evenly on a log scale, base**start to base**stop.",
     dtype=lambda attrs, dtypes: ([], [attrs.dtype]))
_add("_npi_indices", (),
     (Param("dimensions", parse_int_tuple), Param("dtype", parse_dtype, INT32),
      Param("ctx", parse_str, "")),
     lambda xp, attrs: xp.indices(attrs.dimensions, dtype=attrs.dtype),
     "A grid of indices for an array of the given dimensions.",
     dtype=lambda attrs, dtypes: ([], [attrs.dtype]))


# --- integer and exponent maths ---------------------------------------------------------------

_SCALAR = (Param("scalar", parse_float, 1.0), Param("is_int", parse_bool, True))


def _int_scalar(xp: Any, attrs: Attrs, like: Any) -> Any:
    """The scalar in ``like``'s dtype as a numpy scalar, which CuPy takes without a host copy."""
    return np.asarray(int(attrs.scalar), dtype=like.dtype)[()]


for _name, _fn in (("bitwise_and", "bitwise_and"), ("bitwise_or", "bitwise_or"),
                   ("bitwise_xor", "bitwise_xor"), ("lcm", "lcm")):
    _add(f"_npi_{_name}", ("lhs", "rhs"), (),
         (lambda fn: lambda xp, attrs, a, b: getattr(xp, fn)(a, b))(_fn),
         f"Elementwise {_fn} of integers (broadcasting).", infer=broadcast_shapes)
    _add(f"_npi_{_name}_scalar", ("data",), _SCALAR,
         (lambda fn: lambda xp, attrs, a: getattr(xp, fn)(a, _int_scalar(xp, attrs, a)))(_fn),
         f"Elementwise {_fn} with an integer scalar.", infer=same_shape)
_add("_npi_bitwise_not", ("x",), (), lambda xp, attrs, x: xp.invert(x),
     "Elementwise bitwise NOT.", infer=same_shape)


def _ldexp(xp: Any, mantissa: Any, exponent: Any, dtype: Any) -> Any:
    return (mantissa * xp.power(2.0, exponent)).astype(dtype)


_add("_npi_ldexp", ("lhs", "rhs"), (),
     lambda xp, attrs, a, b: _ldexp(xp, a, b, a.dtype), "lhs * 2**rhs (broadcasting).",
     infer=broadcast_shapes)
_add("_npi_ldexp_scalar", ("data",), _SCALAR,
     lambda xp, attrs, a: _ldexp(xp, a, attrs.scalar, a.dtype), "data * 2**scalar.",
     infer=same_shape)
_add("_npi_rldexp_scalar", ("data",), _SCALAR,
     lambda xp, attrs, a: _ldexp(xp, attrs.scalar, a, a.dtype), "scalar * 2**data.",
     infer=same_shape)


# --- contractions -----------------------------------------------------------------------------

_add("_npi_tensordot", ("a", "b"),
     (Param("a_axes_summed", parse_int_tuple), Param("b_axes_summed", parse_int_tuple)),
     lambda xp, attrs, a, b: xp.tensordot(a, b, (attrs.a_axes_summed, attrs.b_axes_summed)),
     "Sum of products over the paired axes of a and b.")
_add("_npi_tensordot_int_axes", ("a", "b"), (Param("axes", parse_int),),
     lambda xp, attrs, a, b: xp.tensordot(a, b, attrs.axes),
     "Sum of products over a's last and b's first `axes` axes.")
_add("_npi_einsum", _arguments,
     (Param("num_args", parse_int), Param("subscripts", parse_str, ""),
      Param("optimize", parse_int, 0)),
     lambda xp, attrs, *arrays: xp.asarray(xp.einsum(attrs.subscripts, *arrays)),
     "Einstein summation over the operands, as subscripts spells it.")


# --- atleast_nd, polyval ----------------------------------------------------------------------

def _atleast(ndim: int) -> None:
    function = {1: "atleast_1d", 2: "atleast_2d", 3: "atleast_3d"}[ndim]

    def kernel(xp: Any, attrs: Attrs, *arrays: Any) -> tuple[Any, ...]:
        return tuple(xp.ascontiguousarray(getattr(xp, function)(array)) for array in arrays)

    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        return shapes, [None if shape is None else
                        getattr(np, function)(np.empty(shape, np.bool_)).shape
                        for shape in shapes]

    register(OpDef(
        name=f"_np_{function}", params=(Param("num_args", parse_int),), inputs=_arguments,
        outputs=lambda attrs: tuple(f"output{k}" for k in range(attrs.num_args)),
        infer_shape=infer, infer_dtype=lambda attrs, dtypes: (dtypes, list(dtypes)),
        kernel=kernel, doc=f"Every input viewed with at least {ndim} dimensions."))


for _ndim in (1, 2, 3):
    _atleast(_ndim)

_add("_npi_polyval", ("p", "x"), (),
     lambda xp, attrs, p, x: xp.polyval(p, x).astype(x.dtype),
     "The polynomial with coefficients p (highest power first) at x.",
     infer=lambda attrs, shapes: (shapes, [shapes[1]]),
     dtype=lambda attrs, dtypes: (dtypes, [dtypes[1]]))
