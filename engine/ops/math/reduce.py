"""Reductions (sum, mean, max, min, prod, nansum, nanprod, norm), argmax/argmin, topk, sort.

Legacy reductions take ``axis`` (empty or absent: every axis), ``keepdims`` and ``exclude``
(reduce the axes *not* listed); reducing everything without ``keepdims`` gives shape ``(1,)``.
NumPy-mode ``_npi_*`` reductions reduce everything when ``axis`` is None, nothing when it is
``()``, and give a 0-d result. Index outputs use the input dtype (legacy) or the ``dtype``
attribute (topk, argsort), as MXNet does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_dtype,
    parse_float,
    parse_int,
    parse_int_tuple,
)
from engine.ops.dtypes import FLOAT32, INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, default_dtype, register
from engine.ops.shapes import normalize_axis

DTypes = list["np.dtype | None"]
ShapeResult = tuple[list[MaybeShape], list[MaybeShape]]


# ---------------------------------------------------------------------------------------------
# axes and shapes


def reduced_axes(axis: tuple[int, ...] | None, exclude: bool, ndim: int,
                 numpy_mode: bool = False) -> tuple[int, ...]:
    """The sorted, non-negative axes a reduction runs over.

    Legacy: ``axis`` None or ``()`` means every axis (``exclude`` is then ignored).
    NumPy mode: None means every axis and ``()`` none.
    """
    if axis is None or (not axis and not numpy_mode):
        return tuple(range(ndim))
    axes = sorted(normalize_axis(item, ndim, "reduction axis") for item in axis)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"reduction axis {axis} names an axis twice")
    if exclude:
        return tuple(item for item in range(ndim) if item not in axes)
    return tuple(axes)


def reduced_shape(shape: Shape, axes: tuple[int, ...], keepdims: bool,
                  numpy_mode: bool = False) -> Shape:
    """The output shape of reducing ``shape`` over ``axes``."""
    if keepdims:
        return tuple(1 if index in axes else dim for index, dim in enumerate(shape))
    kept = tuple(dim for index, dim in enumerate(shape) if index not in axes)
    return kept if kept or numpy_mode else (1,)


def _reduce_shape(numpy_mode: bool) -> Callable[[Attrs, list[MaybeShape]], ShapeResult]:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
        data = shapes[0]
        if data is None:
            return [None], [None]
        exclude = attrs.get("exclude", False)
        axes = reduced_axes(attrs.axis, exclude, len(data), numpy_mode)
        return [data], [reduced_shape(data, axes, attrs.keepdims, numpy_mode)]

    return infer


# ---------------------------------------------------------------------------------------------
# value reductions


def _reduce_kernel(fn_name: str, numpy_mode: bool,
                   dtype_rule: Callable[[Attrs, np.dtype], np.dtype]) -> Callable[..., Any]:
    def kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
        axes = reduced_axes(attrs.axis, attrs.get("exclude", False), data.ndim, numpy_mode)
        dtype = dtype_rule(attrs, data.dtype)
        kept = reduced_shape(data.shape, axes, True)
        fn = getattr(xp, fn_name)
        extra: dict[str, Any] = {}
        if fn_name in ("sum", "mean", "prod", "nansum", "nanprod"):
            # Accumulate float16 in float32 (as MXNet does); ints keep their dtype.
            extra["dtype"] = np.float32 if dtype == np.float16 else dtype
        # CuPy 14.2's min raises a TypeError when given `out` (seen on an H100): not there.
        writes_out = xp is np or fn_name != "min"
        if out is not None and writes_out and out.flags.c_contiguous and out.dtype == dtype:
            fn(data, axis=axes, keepdims=True, out=out.reshape(kept), **extra)
            return out
        result = fn(data, axis=axes, keepdims=True, **extra)
        result = result.reshape(reduced_shape(data.shape, axes, attrs.keepdims, numpy_mode))
        result = result.astype(dtype, copy=False)
        if out is None:
            return result
        xp.copyto(out, result, casting="unsafe")
        return out

    kernel.__name__ = f"{fn_name}_kernel"
    return kernel


def _same(attrs: Attrs, dtype: np.dtype) -> np.dtype:
    return np.dtype(dtype)


def _np_sum_dtype(attrs: Attrs, dtype: np.dtype) -> np.dtype:
    if attrs.get("dtype") is not None:
        return np.dtype(attrs.dtype)
    return INT64 if dtype == np.bool_ else np.dtype(dtype)


def _np_mean_dtype(attrs: Attrs, dtype: np.dtype) -> np.dtype:
    if attrs.get("dtype") is not None:
        return np.dtype(attrs.dtype)
    return np.dtype(dtype) if np.issubdtype(dtype, np.floating) else FLOAT32


def _dtype_fn(rule: Callable[[Attrs, np.dtype], np.dtype]) -> Callable[[Attrs, DTypes],
                                                                         tuple[DTypes, DTypes]]:
    def infer(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
        if dtypes[0] is None:
            return [None], [None]
        return [dtypes[0]], [rule(attrs, np.dtype(dtypes[0]))]

    return infer


_AXES_PARAMS = (
    Param("axis", optional(parse_int_tuple), None, "axes to reduce; empty/None: all"),
    Param("keepdims", parse_bool, False, "keep reduced axes with size 1"),
    Param("exclude", parse_bool, False, "reduce over the axes not listed"),
)

# (name, xp function, aliases)
_LEGACY: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("sum", "sum", ("sum_axis",)),
    ("mean", "mean", ()),
    ("max", "max", ("max_axis",)),
    ("min", "min", ("min_axis",)),
    ("prod", "prod", ()),
    ("nansum", "nansum", ()),
    ("nanprod", "nanprod", ()),
)
for _name, _fn, _aliases in _LEGACY:
    register(OpDef(
        name=_name, aliases=_aliases, params=_AXES_PARAMS,
        kernel=_reduce_kernel(_fn, False, _same), infer_shape=_reduce_shape(False),
        writes_out=True, doc=f"Reduce by {_fn} over `axis` (all axes when empty)."))

_NP_AXIS = Param("axis", optional(parse_int_tuple), None, "axes to reduce; None: all")
_NP_KEEPDIMS = Param("keepdims", parse_bool, False)
_NP_DTYPE = Param("dtype", optional(parse_dtype), None)
_NP_INITIAL = Param("initial", optional(parse_float), None)
_NP_WITH_DTYPE = (_NP_AXIS, _NP_DTYPE, _NP_KEEPDIMS, _NP_INITIAL)
_NP_NO_DTYPE = (_NP_AXIS, _NP_KEEPDIMS, _NP_INITIAL)

# (name, xp function, params, dtype rule)
_NUMPY: tuple[tuple[str, str, tuple[Param, ...], Callable[[Attrs, np.dtype], np.dtype]], ...] = (
    ("_npi_sum", "sum", _NP_WITH_DTYPE, _np_sum_dtype),
    ("_npi_prod", "prod", _NP_WITH_DTYPE, _np_sum_dtype),
    ("_npi_mean", "mean", _NP_WITH_DTYPE, _np_mean_dtype),
    ("_npi_max", "max", _NP_NO_DTYPE, _same),
    ("_npi_min", "min", _NP_NO_DTYPE, _same),
)


def _with_initial(kernel: Callable[..., Any], fn_name: str) -> Callable[..., Any]:
    """Fold NumPy's ``initial`` into the result (sum: +, prod: *, max/min: clamp)."""

    def wrapped(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
        result = kernel(xp, attrs, data, out=out)
        if attrs.initial is None:
            return result
        combine = {"sum": xp.add, "prod": xp.multiply, "max": xp.maximum,
                   "min": xp.minimum}.get(fn_name)
        if combine is None:
            raise ShapeError(f"_npi_{fn_name}: attribute 'initial' is not supported")
        return combine(result, attrs.initial, out=result, casting="unsafe")

    wrapped.__name__ = kernel.__name__
    return wrapped


for _name, _fn, _params, _rule in _NUMPY:
    register(OpDef(
        name=_name, params=_params, inputs=("a",),
        kernel=_with_initial(_reduce_kernel(_fn, True, _rule), _fn),
        infer_shape=_reduce_shape(True), infer_dtype=_dtype_fn(_rule), writes_out=True,
        doc=f"NumPy-mode {_fn} over `axis` (None: all, giving a 0-d result)."))


# ---------------------------------------------------------------------------------------------
# norm


def _norm_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    axes = reduced_axes(attrs.axis, False, data.ndim)
    work = data.astype(np.float32) if data.dtype == np.float16 else data
    if attrs.ord == 1:
        result = xp.sum(xp.abs(work), axis=axes, keepdims=True)
    else:
        result = xp.sqrt(xp.sum(work * work, axis=axes, keepdims=True))
    dtype = attrs.out_dtype or data.dtype
    return result.reshape(reduced_shape(data.shape, axes, attrs.keepdims)).astype(dtype,
                                                                                  copy=False)


def _norm_ord(value: Any) -> int:
    order = parse_int(value)
    if order not in (1, 2):
        raise ValueError(f"expected ord 1 or 2, got {order}")
    return order


def _norm_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    inputs, outputs = default_dtype(attrs, dtypes)
    return inputs, [attrs.out_dtype or outputs[0]]


register(OpDef(
    name="norm",
    params=(
        Param("ord", _norm_ord, 2, "1 (sum of |x|) or 2 (sqrt of sum of squares)"),
        Param("axis", optional(parse_int_tuple), None),
        Param("out_dtype", optional(parse_dtype), None),
        Param("keepdims", parse_bool, False),
    ),
    kernel=_norm_kernel,
    infer_shape=_reduce_shape(False),
    infer_dtype=_norm_dtype,
    doc="L1 or L2 norm over `axis` (all axes when absent), elementwise (Frobenius) for 2 axes.",
))


# ---------------------------------------------------------------------------------------------
# argmax / argmin


def _search_shape(numpy_mode: bool) -> Callable[[Attrs, list[MaybeShape]], ShapeResult]:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
        data = shapes[0]
        if data is None:
            return [None], [None]
        if attrs.axis is None:
            out = (1,) * len(data) if attrs.keepdims else (() if numpy_mode else (1,))
            return [data], [out]
        axis = normalize_axis(attrs.axis, len(data))
        return [data], [reduced_shape(data, (axis,), attrs.keepdims, numpy_mode)]

    return infer


def _search_kernel(fn_name: str, numpy_mode: bool) -> Callable[..., Any]:
    def kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
        dtype = INT64 if numpy_mode else data.dtype
        if attrs.axis is None:
            index = getattr(xp, fn_name)(data.reshape(-1))
            shape = (1,) * data.ndim if attrs.keepdims else (() if numpy_mode else (1,))
            return xp.asarray(index).astype(dtype).reshape(shape)
        axis = normalize_axis(attrs.axis, data.ndim)
        index = getattr(xp, fn_name)(data, axis=axis, keepdims=True)
        shape = reduced_shape(data.shape, (axis,), attrs.keepdims, numpy_mode)
        return index.astype(dtype).reshape(shape)

    kernel.__name__ = f"{fn_name}_kernel"
    return kernel


def _search_dtype(numpy_mode: bool) -> Callable[[Attrs, DTypes], tuple[DTypes, DTypes]]:
    def infer(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
        return [dtypes[0]], [INT64 if numpy_mode else dtypes[0]]

    return infer


_SEARCH_PARAMS = (
    Param("axis", optional(parse_int), None, "axis to search; None: the flattened input"),
    Param("keepdims", parse_bool, False),
)
for _fn in ("argmax", "argmin"):
    register(OpDef(
        name=_fn, params=_SEARCH_PARAMS, kernel=_search_kernel(_fn, False),
        infer_shape=_search_shape(False), infer_dtype=_search_dtype(False),
        doc=f"Index of the first {_fn[3:]}imum along `axis`, in the input dtype."))
    register(OpDef(
        name=f"_npi_{_fn}", params=_SEARCH_PARAMS, kernel=_search_kernel(_fn, True),
        infer_shape=_search_shape(True), infer_dtype=_search_dtype(True),
        doc=f"NumPy-mode {_fn} (int64 indices)."))


# ---------------------------------------------------------------------------------------------
# sort, argsort, topk


def _order(xp: Any, data: Any, axis: int, ascending: bool) -> Any:
    """Indices that sort ``data`` along ``axis``."""
    order = xp.argsort(data, axis=axis)
    return order if ascending else xp.flip(order, axis=axis)


def _axis_or_flat(data: Any, axis: int | None) -> tuple[Any, int]:
    if axis is None:
        return data.reshape(-1), 0
    return data, normalize_axis(axis, data.ndim)


_INDEX_DTYPE = choice("uint8", "int32", "int64", "float16", "float32", "float64")


def _sort_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    flat, axis = _axis_or_flat(data, attrs.axis)
    result = xp.sort(flat, axis=axis)
    return result if attrs.is_ascend else xp.flip(result, axis=axis)


def _argsort_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    flat, axis = _axis_or_flat(data, attrs.axis)
    return _order(xp, flat, axis, attrs.is_ascend).astype(attrs.dtype)


def _sort_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    if data is None or attrs.axis is not None:
        return [data], [data]
    size = int(np.prod(data)) if data else 1
    return [data], [(size,)]


def _argsort_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    return [dtypes[0]], [np.dtype(attrs.dtype)]


_SORT_AXIS = Param("axis", optional(parse_int), -1, "axis to sort; None: the flattened input")

register(OpDef(
    name="sort",
    params=(_SORT_AXIS, Param("is_ascend", parse_bool, True)),
    kernel=_sort_kernel,
    infer_shape=_sort_shape,
    hidden_outputs=1,
    doc="Sorted values along `axis`.",
))

register(OpDef(
    name="argsort",
    params=(_SORT_AXIS, Param("is_ascend", parse_bool, True),
            Param("dtype", _INDEX_DTYPE, "float32")),
    kernel=_argsort_kernel,
    infer_shape=_sort_shape,
    infer_dtype=_argsort_dtype,
    doc="Indices that sort `axis`, in `dtype` (float32 by default).",
))


def _topk_outputs(attrs: Attrs) -> tuple[str, ...]:
    return {"both": ("value", "indices"), "value": ("value",), "indices": ("indices",),
            "mask": ("mask",)}[attrs.ret_typ]


def _topk_k(attrs: Attrs, length: int) -> int:
    if attrs.k < 1:
        return length
    if attrs.k > length:
        raise ShapeError(f"topk: k={attrs.k} is larger than the axis length {length}")
    return attrs.k


def _topk_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    count = len(_topk_outputs(attrs))
    if data is None:
        return [None], [None] * count
    if attrs.ret_typ == "mask":
        return [data], [data]
    if attrs.axis is None:
        size = int(np.prod(data)) if data else 1
        k = size if attrs.k < 1 else attrs.k
        return [data], [(k if all(data) else 0,)] * count
    axis = normalize_axis(attrs.axis, len(data))
    length = data[axis]
    k = length if attrs.k < 1 else attrs.k
    if length and k > length:
        raise ShapeError(f"topk: k={attrs.k} is larger than the axis length {length}")
    out = tuple(k if index == axis else dim for index, dim in enumerate(data))
    return [data], [out] * count


def _topk_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    data = dtypes[0]
    index = np.dtype(attrs.dtype)
    table = {"both": [data, index], "value": [data], "indices": [index], "mask": [data]}
    return [data], table[attrs.ret_typ]


def _topk_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    flat, axis = _axis_or_flat(data, attrs.axis)
    k = _topk_k(attrs, flat.shape[axis])
    order = _order(xp, flat, axis, attrs.is_ascend)
    if attrs.ret_typ == "mask":
        rank = xp.argsort(order, axis=axis)
        return (rank < k).astype(data.dtype).reshape(data.shape)
    top = xp.take(order, xp.arange(k), axis=axis)
    indices = top.astype(attrs.dtype)
    if attrs.ret_typ == "indices":
        return indices
    values = xp.take_along_axis(flat, top, axis=axis)
    return values if attrs.ret_typ == "value" else (values, indices)


register(OpDef(
    name="topk",
    aliases=("_npx_topk",),
    params=(
        Param("axis", optional(parse_int), -1, "axis to search; None: the flattened input"),
        Param("k", parse_int, 1, "how many; k < 1 returns the whole axis"),
        Param("ret_typ", choice("value", "indices", "mask", "both"), "indices"),
        Param("is_ascend", parse_bool, False, "the k smallest instead of the k largest"),
        Param("dtype", _INDEX_DTYPE, "float32", "dtype of the indices"),
    ),
    kernel=_topk_kernel,
    infer_shape=_topk_shape,
    infer_dtype=_topk_dtype,
    outputs=_topk_outputs,
    hidden_outputs=lambda attrs: 1 if attrs.ret_typ == "value" else 0,
    doc="The k largest (or smallest) entries along `axis`: values, indices, a mask, or both.",
))
