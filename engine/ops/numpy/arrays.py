"""NumPy-mode operators that numpy-style Gluon exports contain (``_np_*``, ``_npi_*``, ``_eye``).

Reductions to all/any, axis shuffles (transpose, squeeze, moveaxis, roll, flip, broadcast_to),
joins (concatenate, hstack, vstack), ``tril``, ``where`` with scalar branches, floating-point
classification (isnan...), ``around``, ``nan_to_num``, ``copysign``/``arctan2`` and ``eye``.
Shapes follow NumPy: reducing every axis gives a 0-d array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import (
    optional,
    parse_bool,
    parse_dtype,
    parse_float,
    parse_int,
    parse_int_tuple,
    parse_str,
)
from engine.ops.dtypes import BOOL, FLOAT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, broadcast_shapes, normalize_axis, same_shape

AXES = optional(parse_int_tuple)


def _axes(axis: tuple[int, ...] | None, ndim: int, what: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted({normalize_axis(item, ndim, what) for item in axis}))


def _known(shape: MaybeShape, op: Callable[..., Any], *args: Any) -> MaybeShape:
    """The output shape by running ``op`` on a zero-size stand-in (shape logic only)."""
    if shape is None:
        return None
    return tuple(op(np.empty(shape, np.bool_), *args).shape)


def _simple(name: str, inputs: tuple[str, ...], params: tuple[Param, ...],
            kernel: Callable[..., Any], infer: Any, doc: str, dtype: Any = None) -> None:
    register(OpDef(name=name, inputs=inputs, params=params, kernel=kernel, infer_shape=infer,
                   infer_dtype=dtype or (lambda attrs, dtypes: (dtypes, [dtypes[0]])), doc=doc))


# --- all / any --------------------------------------------------------------------------------

def _logical_reduce(fn: str) -> Callable[..., Any]:
    def kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
        axes = _axes(attrs.axis, data.ndim, f"{fn} axis")
        return getattr(xp, fn)(data != 0, axis=axes, keepdims=attrs.keepdims)

    return kernel


def _logical_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    axes = _axes(attrs.axis, len(data), "reduction axis")
    if attrs.keepdims:
        return shapes, [tuple(1 if axis in axes else dim for axis, dim in enumerate(data))]
    return shapes, [tuple(dim for axis, dim in enumerate(data) if axis not in axes)]


for _name, _fn in (("_np_all", "all"), ("_np_any", "any")):
    _simple(_name, ("data",), (Param("axis", AXES, None), Param("keepdims", parse_bool, False)),
            _logical_reduce(_fn), _logical_infer, f"Whether {_fn} values are non-zero, over axis.",
            lambda attrs, dtypes: (dtypes, [BOOL]))


# --- axis shuffles ----------------------------------------------------------------------------

def _transpose_axes(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    if attrs.axes is None or len(attrs.axes) == 0:
        return tuple(reversed(range(ndim)))
    return tuple(normalize_axis(axis, ndim, "transpose axes") for axis in attrs.axes)


def _squeeze_axes(attrs: Attrs, shape: tuple[int, ...]) -> tuple[int, ...]:
    if attrs.axis is None:
        return tuple(axis for axis, dim in enumerate(shape) if dim == 1)
    axes = _axes(attrs.axis, len(shape), "squeeze axis")
    for axis in axes:
        if shape[axis] not in (0, 1):
            raise ShapeError(f"_np_squeeze: axis {axis} has size {shape[axis]}, not 1")
    return axes


_LAYOUT: tuple[tuple[str, str, tuple[Param, ...], Callable[..., Any], Callable[..., Any],
                     str], ...] = (
    ("_np_transpose", "a", (Param("axes", AXES, None),),
     lambda xp, attrs, a: xp.ascontiguousarray(a.transpose(_transpose_axes(attrs, a.ndim))),
     lambda attrs, shape: tuple(shape[axis] for axis in _transpose_axes(attrs, len(shape))),
     "Permute axes (reverse them when axes is None)."),
    ("_np_squeeze", "a", (Param("axis", AXES, None),),
     lambda xp, attrs, a: a.reshape(tuple(dim for axis, dim in enumerate(a.shape)
                                          if axis not in _squeeze_axes(attrs, a.shape))),
     lambda attrs, shape: tuple(dim for axis, dim in enumerate(shape)
                                if axis not in _squeeze_axes(attrs, shape)),
     "Drop size-1 axes (all of them when axis is None)."),
    ("_np_moveaxis", "a", (Param("source", parse_int_tuple), Param("destination", parse_int_tuple)),
     lambda xp, attrs, a: xp.ascontiguousarray(xp.moveaxis(a, attrs.source, attrs.destination)),
     lambda attrs, shape: _known(shape, np.moveaxis, attrs.source, attrs.destination),
     "Move axes source to positions destination."),
    ("_npi_flip", "data", (Param("axis", parse_int_tuple),),
     lambda xp, attrs, a: xp.ascontiguousarray(xp.flip(a, axis=attrs.axis)),
     lambda attrs, shape: shape, "Reverse the order of elements along axis."),
    ("_npi_tril", "data", (Param("k", parse_int, 0),),
     lambda xp, attrs, a: xp.tril(a, attrs.k), lambda attrs, shape: shape,
     "Zero everything above the k-th diagonal of the last two axes."),
)


def _shape_rule(rule: Callable[[Attrs, tuple[int, ...]], MaybeShape]) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        return shapes, [None if shapes[0] is None else rule(attrs, shapes[0])]

    return infer


for _name, _input, _params, _kernel, _rule, _doc in _LAYOUT:
    _simple(_name, (_input,), _params, _kernel, _shape_rule(_rule), _doc)


def _roll(xp: Any, attrs: Attrs, data: Any) -> Any:
    if attrs.shift is None:
        raise ShapeError("_np_roll: shift is required")
    if attrs.axis is None:
        return xp.roll(data.reshape(-1), attrs.shift[0]).reshape(data.shape)
    return xp.roll(data, attrs.shift if len(attrs.shift) > 1 else attrs.shift[0], attrs.axis)


_simple("_np_roll", ("data",), (Param("shift", AXES, None), Param("axis", AXES, None)), _roll,
        same_shape, "Shift elements along axis, wrapping around (flattened when axis is None).")


def _broadcast_to_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    array = shapes[0]
    if array is not None:
        np.broadcast_shapes(tuple(max(dim, 1) for dim in array), attrs.shape)
    return shapes, [tuple(attrs.shape)]


_simple("_npi_broadcast_to", ("array",), (Param("shape", parse_int_tuple, ()),),
        lambda xp, attrs, a: xp.ascontiguousarray(xp.broadcast_to(a, attrs.shape)),
        _broadcast_to_infer, "array broadcast to shape.")


# --- joins ------------------------------------------------------------------------------------

def _arguments(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"arg{index}" for index in range(attrs.num_args))


def _join_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    known = next((dtype for dtype in dtypes if dtype is not None), None)
    return [known if dtype is None else dtype for dtype in dtypes], [known]


def _join(name: str, join: Callable[[Any, Attrs, list[Any]], Any],
          params: tuple[Param, ...], doc: str) -> None:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        if any(shape is None or not all(shape) for shape in shapes):
            return shapes, [None]
        return shapes, [join(np, attrs, [np.empty(shape, np.bool_) for shape in shapes]).shape]

    register(OpDef(name=name, params=(Param("num_args", parse_int), *params), inputs=_arguments,
                   infer_shape=infer, infer_dtype=_join_dtype,
                   kernel=lambda xp, attrs, *arrays: join(xp, attrs, list(arrays)), doc=doc))


_join("_npi_concatenate",
      lambda xp, attrs, arrays: xp.concatenate(
          [a.reshape(-1) for a in arrays] if attrs.axis is None else arrays,
          axis=0 if attrs.axis is None else attrs.axis),
      (Param("axis", optional(parse_int), 0),),
      "Join along axis (of the flattened arrays when axis is None).")
_join("_npi_hstack", lambda xp, attrs, arrays: xp.hstack(arrays), (Param("dim", parse_int, 1),),
      "Join along axis 1 (axis 0 for 1-D arrays).")
_join("_npi_vstack", lambda xp, attrs, arrays: xp.vstack(arrays), (),
      "Join along axis 0, 1-D arrays becoming rows.")


# --- where ------------------------------------------------------------------------------------

def _where_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    return broadcast_shapes(attrs, shapes)


def _where_dtype(position: int | None) -> Any:
    def infer(attrs: Attrs, dtypes: list) -> tuple[list, list]:
        out = FLOAT32 if position is None else dtypes[position]
        return dtypes, [out]

    return infer


def _scalar(xp: Any, value: float, like: Any) -> Any:
    """``value`` in ``like``'s dtype as a numpy scalar, which CuPy takes without a host copy."""
    return np.asarray(value, dtype=like.dtype)[()]


_simple("_npi_where", ("condition", "x", "y"), (),
        lambda xp, attrs, c, x, y: xp.where(c != 0, x, y), _where_infer,
        "x where condition is non-zero, else y (broadcasting).", _where_dtype(1))
_simple("_npi_where_lscalar", ("condition", "x"), (Param("scalar", parse_float, 0.0),),
        lambda xp, attrs, c, x: xp.where(c != 0, _scalar(xp, attrs.scalar, x), x),
        _where_infer, "scalar where condition is non-zero, else x.", _where_dtype(1))
_simple("_npi_where_rscalar", ("condition", "y"), (Param("scalar", parse_float, 0.0),),
        lambda xp, attrs, c, y: xp.where(c != 0, y, _scalar(xp, attrs.scalar, y)),
        _where_infer, "y where condition is non-zero, else scalar.", _where_dtype(1))
_simple("_npi_where_scalar2", ("condition",),
        (Param("x", parse_float, 0.0), Param("y", parse_float, 0.0)),
        lambda xp, attrs, c: xp.where(c != 0, xp.float32(attrs.x), xp.float32(attrs.y)),
        lambda attrs, shapes: (shapes, [shapes[0]]), "x where condition is non-zero, else y.",
        _where_dtype(None))


# --- elementwise ------------------------------------------------------------------------------

for _name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf"):
    _simple(f"_npi_{_name}", ("x",), (),
            (lambda fn: lambda xp, attrs, x: getattr(xp, fn)(x))(_name), same_shape,
            f"Elementwise {_name} (bool output).", lambda attrs, dtypes: (dtypes, [BOOL]))

_simple("_npi_around", ("x",), (Param("decimals", parse_int, 0),),
        lambda xp, attrs, x: xp.around(x, attrs.decimals), same_shape,
        "Round to decimals places, halves to even.")


def _nan_to_num(xp: Any, attrs: Attrs, data: Any) -> Any:
    return xp.nan_to_num(data, copy=True, nan=attrs.nan, posinf=attrs.posinf,
                         neginf=attrs.neginf)


_simple("_npi_nan_to_num", ("data",),
        (Param("copy", parse_bool, True), Param("nan", parse_float, 0.0),
         Param("posinf", optional(parse_float), None),
         Param("neginf", optional(parse_float), None)),
        _nan_to_num, same_shape, "NaN to nan, infinities to posinf/neginf (the dtype's extremes "
        "when None).")

_SCALAR_PARAMS = (Param("scalar", parse_float, 1.0), Param("is_int", parse_bool, True))
for _name, _fn in (("copysign", "copysign"), ("arctan2", "arctan2")):
    inputs = ("lhs", "rhs") if _name == "copysign" else ("x1", "x2")
    _simple(f"_npi_{_name}", inputs, (),
            (lambda fn: lambda xp, attrs, a, b: getattr(xp, fn)(a, b))(_fn), broadcast_shapes,
            f"Elementwise {_fn} (broadcasting).")
    _simple(f"_npi_{_name}_scalar", ("data",), _SCALAR_PARAMS,
            (lambda fn: lambda xp, attrs, a: getattr(xp, fn)(a, _scalar(xp, attrs.scalar, a)))(
                _fn), same_shape, f"{_fn}(data, scalar).")
    _simple(f"_npi_r{_name}_scalar", ("data",), _SCALAR_PARAMS,
            (lambda fn: lambda xp, attrs, a: getattr(xp, fn)(_scalar(xp, attrs.scalar, a), a))(
                _fn), same_shape, f"{_fn}(scalar, data).")


# --- eye --------------------------------------------------------------------------------------

def _eye_size(attrs: Attrs) -> tuple[int, int]:
    if "shape" in attrs:
        return attrs.shape[0], attrs.shape[0]
    columns = attrs.M if attrs.M else attrs.N  # MXNet: M of 0 or None means N
    return attrs.N, columns


def _eye_kernel(xp: Any, attrs: Attrs) -> Any:
    rows, columns = _eye_size(attrs)
    return xp.eye(rows, columns, attrs.get("k", 0), dtype=attrs.dtype)


_EYE_TAIL = (Param("ctx", parse_str, ""), Param("dtype", parse_dtype, FLOAT32))
for _name, _params in (
    ("_eye", (Param("N", parse_int), Param("M", parse_int, 0), Param("k", parse_int, 0))),
    ("_npi_eye", (Param("N", parse_int), Param("M", optional(parse_int), None),
                  Param("k", parse_int, 0))),
    ("_npi_identity", (Param("shape", parse_int_tuple, ()),)),
):
    register(OpDef(name=_name, params=(*_params, *_EYE_TAIL), inputs=(),
                   infer_shape=lambda attrs, shapes: ([], [_eye_size(attrs)]),
                   infer_dtype=lambda attrs, dtypes: ([], [attrs.dtype]), kernel=_eye_kernel,
                   doc="Ones on the k-th diagonal of an N x M matrix (identity: square)."))

