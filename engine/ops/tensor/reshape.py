"""The reshape family: ``Reshape``, its NumPy-mode relatives, ``Flatten``, ``expand_dims``,
``squeeze``.

Each returns ``data.reshape(...)``, which shares storage with the input.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_int,
    parse_int_tuple,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, register
from engine.ops.shapes import Inferred, is_known, normalize_axis

# Tokens of a reshape spec: ("dim", n), ("copy",), ("infer",), ("rest",), ("merge",),
# ("split", a, b), ("skip",). Legacy and npx codes both translate into them.
_LEGACY_CODES = {0: ("copy",), -1: ("infer",), -2: ("rest",), -3: ("merge",)}
_NPX_CODES = {-1: ("infer",), -2: ("copy",), -3: ("skip",), -4: ("rest",), -5: ("merge",)}


def _tokenize(spec: tuple[int, ...], codes: dict[int, tuple], split_code: int,
              low: int) -> list[tuple]:
    tokens: list[tuple] = []
    index = 0
    while index < len(spec):
        value = spec[index]
        if value == split_code:
            if index + 2 >= len(spec):
                raise ShapeError(f"reshape code {split_code} in {spec} must be followed by two "
                                 "dimensions")
            tokens.append(("split", spec[index + 1], spec[index + 2]))
            index += 3
            continue
        if value in codes:
            tokens.append(codes[value])
        elif value >= low:
            tokens.append(("dim", value))
        else:
            raise ShapeError(f"invalid reshape code {value} in {spec}")
        index += 1
    return tokens


@lru_cache(maxsize=1024)
def _apply_tokens(data: Shape, tokens: tuple[tuple, ...], reverse: bool) -> Shape:
    """Output shape of a tokenized reshape of ``data`` (0 dims are unknown and stay unknown)."""
    dims = data[::-1] if reverse else data
    if reverse:
        tokens = tuple(("split", t[2], t[1]) if t[0] == "split" else t for t in reversed(tokens))
    out: list[int] = []
    copies: list[int] = []
    src = 0
    infer_at = -1

    def read() -> int:
        nonlocal src
        if src >= len(dims):
            raise ShapeError(f"reshape spec reads past the {len(data)} input dimensions of "
                             f"{data}")
        src += 1
        return dims[src - 1]

    for token in tokens:
        kind = token[0]
        if kind == "dim":
            out.append(token[1])
            src += 1
        elif kind == "copy":
            copies.append(len(out))
            out.append(read())
        elif kind == "infer":
            if infer_at >= 0:
                raise ShapeError("a reshape spec may infer (-1) only one dimension")
            infer_at = len(out)
            out.append(1)
            src += 1
        elif kind == "rest":
            copies.extend(range(len(out), len(out) + len(dims) - src))
            out.extend(dims[src:])
            src = len(dims)
        elif kind == "merge":
            first, second = read(), read()
            out.append(first * second)
        elif kind == "skip":
            if read() not in (0, 1):
                raise ShapeError(f"reshape code -3 skips only dimensions of size 1, in {data}")
        else:
            out.extend(_split(read(), token[1], token[2]))
    if infer_at >= 0:
        out[infer_at] = _inferred(data, out, copies)
    if is_known(data) and is_known(tuple(out)) and math.prod(out) != math.prod(data):
        shown = tuple(out[::-1]) if reverse else tuple(out)
        raise ShapeError(f"cannot reshape {data} ({math.prod(data)} elements) into {shown} "
                         f"({math.prod(out)} elements)")
    return tuple(out[::-1]) if reverse else tuple(out)


def _split(whole: int, first: int, second: int) -> tuple[int, int]:
    """A split (code -4 or -6) of dimension ``whole``; one of its two parts may be -1."""
    if first == -1 and second == -1:
        raise ShapeError("a reshape split may infer only one of its two dimensions")
    if first == -1:
        first = whole // second if whole and second else 0
    elif second == -1:
        second = whole // first if whole and first else 0
    if whole and first * second != whole:
        raise ShapeError(f"cannot split dimension {whole} into {first} x {second}")
    return first, second


def _inferred(data: Shape, out: list[int], copies: list[int]) -> int:
    """The dimension a -1 stands for, beside the others of ``out`` (its own place holding 1);
    0 (unknown) when unknown input dimensions do not all reach the output as copies."""
    # Unknown (0) input dims copied straight to the output cancel out of the division.
    copied = sum(1 for index in copies if out[index] == 0)
    if copied != sum(1 for dim in data if not dim) or copied != out.count(0):
        return 0
    rest = math.prod(dim for dim in out if dim)
    total = math.prod(dim for dim in data if dim)
    if total % rest:
        raise ShapeError(f"cannot reshape {data} ({total} elements) with one inferred "
                         f"dimension beside {tuple(out)}")
    return total // rest


def _legacy_target(data: Shape, target: tuple[int, ...], keep_highest: bool) -> Shape:
    """Pre-1.0 ``target_shape``: one 0 is inferred; ``keep_highest`` keeps dimension 0."""
    out = list(target)
    start = 1 if keep_highest else 0
    if keep_highest:
        out[0] = data[0]
    unknown = [index for index in range(start, len(out)) if out[index] == 0]
    if len(unknown) == 1 and is_known(data):
        out[unknown[0]] = 1
        out[unknown[0]] = math.prod(data) // max(math.prod(out), 1)
    return tuple(out)


def reshape_shape(attrs: Attrs, data: Shape) -> Shape:
    """Output shape of ``Reshape`` (MXNet codes 0, -1, -2, -3, -4 and ``reverse``)."""
    if not attrs.shape and attrs.target_shape:
        return _legacy_target(data, attrs.target_shape, attrs.keep_highest)
    tokens = tuple(_tokenize(attrs.shape, _LEGACY_CODES, -4, 1))
    return _apply_tokens(tuple(data), tokens, attrs.reverse)


def npx_reshape_shape(attrs: Attrs, data: Shape) -> Shape:
    """Output shape of ``_npx_reshape`` (codes -1 infer, -2 copy, -3 skip a 1, -4 rest,
    -5 merge two, -6 split one)."""
    tokens = tuple(_tokenize(attrs.newshape, _NPX_CODES, -6, 0))
    return _apply_tokens(tuple(data), tokens, attrs.reverse)


def np_reshape_shape(attrs: Attrs, data: Shape) -> Shape:
    """Output shape of ``_np_reshape`` (NumPy rules: one -1 is inferred)."""
    if any(dim < -1 for dim in attrs.newshape):
        raise ShapeError(f"_np_reshape: invalid newshape {attrs.newshape}")
    tokens = tuple(("infer",) if dim == -1 else ("dim", dim) for dim in attrs.newshape)
    return _apply_tokens(tuple(data), tokens, False)


def _reshape_like(shape_of: Any) -> tuple[Any, Any]:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data = shapes[0]
        return [data], [None if data is None else shape_of(attrs, data)]

    def kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
        if attrs.get("order", "C") == "F":
            raise ShapeError("reshape with order='F' is not supported")
        return data.reshape(shape_of(attrs, data.shape))

    return infer, kernel


_reshape_infer, _reshape_kernel = _reshape_like(reshape_shape)
register(OpDef(
    name="Reshape",
    aliases=("reshape",),
    params=(
        Param("shape", parse_int_tuple, ()),
        Param("reverse", parse_bool, False),
        Param("target_shape", parse_int_tuple, ()),
        Param("keep_highest", parse_bool, False),
    ),
    infer_shape=_reshape_infer,
    kernel=_reshape_kernel,
    view=True,
    doc="Reshape with MXNet's special codes 0, -1, -2, -3, -4; reverse matches from the right.",
))

_np_reshape_infer, _np_reshape_kernel = _reshape_like(np_reshape_shape)
register(OpDef(
    name="_np_reshape",
    params=(
        Param("newshape", parse_int_tuple),
        Param("order", choice("C", "F", "A"), "C"),
    ),
    inputs=("a",),
    infer_shape=_np_reshape_infer,
    kernel=_np_reshape_kernel,
    view=True,
    doc="NumPy reshape: newshape with at most one -1.",
))

_npx_reshape_infer, _npx_reshape_kernel = _reshape_like(npx_reshape_shape)
register(OpDef(
    name="_npx_reshape",
    params=(
        Param("newshape", parse_int_tuple),
        Param("reverse", parse_bool, False),
        Param("order", choice("C", "F", "A"), "C"),
    ),
    inputs=("a",),
    infer_shape=_npx_reshape_infer,
    kernel=_npx_reshape_kernel,
    view=True,
    doc="npx.reshape: codes -1 infer, -2 copy, -3 drop a 1, -4 rest, -5 merge, -6 split.",
))


def _flatten_shape(data: Shape) -> Shape:
    if not data:
        raise ShapeError("Flatten needs at least one dimension, got a scalar")
    return (data[0], math.prod(data[1:]))


def _flatten_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    return [data], [None if data is None else _flatten_shape(data)]


register(OpDef(
    name="Flatten",
    aliases=("flatten",),
    infer_shape=_flatten_infer,
    kernel=lambda xp, attrs, data: data.reshape(_flatten_shape(data.shape)),
    view=True,
    doc="Collapse every axis after the first: (d0, d1 * d2 * ...).",
))


def _expand_shape(attrs: Attrs, data: Shape) -> Shape:
    axis = normalize_axis(attrs.axis, len(data) + 1, "expand_dims axis")
    return (*data[:axis], 1, *data[axis:])


def _expand_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    return [data], [None if data is None else _expand_shape(attrs, data)]


register(OpDef(
    name="expand_dims",
    params=(Param("axis", parse_int),),
    infer_shape=_expand_infer,
    kernel=lambda xp, attrs, data: data.reshape(_expand_shape(attrs, data.shape)),
    view=True,
    doc="Insert an axis of size 1 at position axis.",
))


def _squeeze_shape(attrs: Attrs, data: Shape) -> Shape:
    if attrs.axis is None:
        out = tuple(dim for dim in data if dim != 1)
        return out if out or not data else (1,)
    axes = {normalize_axis(axis, len(data), "squeeze axis") for axis in attrs.axis}
    for axis in axes:
        if data[axis] not in (0, 1):
            raise ShapeError(f"squeeze axis {axis} has size {data[axis]}, expected 1 in {data}")
    out = tuple(dim for index, dim in enumerate(data) if index not in axes)
    return out if out or not data else (1,)


def _squeeze_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    return [data], [None if data is None else _squeeze_shape(attrs, data)]


register(OpDef(
    name="squeeze",
    params=(Param("axis", optional(parse_int_tuple), None),),
    infer_shape=_squeeze_infer,
    kernel=lambda xp, attrs, data: data.reshape(_squeeze_shape(attrs, data.shape)),
    view=True,
    doc="Remove axes of size 1 (all of them, or those in axis).",
))
