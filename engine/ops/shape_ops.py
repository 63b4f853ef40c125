"""Shape operators: the reshape family, transposes, slicing, joining, splitting, tiling, padding.

View-like ops (``Reshape``, ``Flatten``, ``expand_dims``, ``squeeze`` and NumPy-mode reshapes)
return ``data.reshape(...)``, which shares storage with the input. Every other op returns a new
array, or writes into ``out`` when the executor gives one.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_float,
    parse_int,
    parse_int_tuple,
    parse_optional_int_tuple,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, register
from engine.ops.shapes import is_known, merge, normalize_axis

Inferred = tuple[list[MaybeShape], list[MaybeShape]]


def _prod(dims: Any) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


def _emit(xp: Any, value: Any, out: Any) -> Any:
    """A fresh C-ordered copy of ``value``, or ``value`` written into ``out``."""
    if out is None:
        return value.copy()
    xp.copyto(out, value, casting="unsafe")
    return out


# --- Reshape and its NumPy-mode relatives ------------------------------------------------------

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
            whole, first, second = read(), token[1], token[2]
            if first == -1 and second == -1:
                raise ShapeError("a reshape split may infer only one of its two dimensions")
            if first == -1:
                first = whole // second if whole and second else 0
            elif second == -1:
                second = whole // first if whole and first else 0
            if whole and first * second != whole:
                raise ShapeError(f"cannot split dimension {whole} into {first} x {second}")
            out.extend((first, second))
    if infer_at >= 0:
        # Unknown (0) input dims copied straight to the output cancel out of the division.
        copied = sum(1 for index in copies if out[index] == 0)
        rest = _prod(dim for dim in out if dim)
        total = _prod(dim for dim in data if dim)
        if copied != sum(1 for dim in data if not dim) or copied != out.count(0):
            out[infer_at] = 0
        elif total % rest:
            raise ShapeError(f"cannot reshape {data} ({total} elements) with one inferred "
                             f"dimension beside {tuple(out)}")
        else:
            out[infer_at] = total // rest
    if is_known(data) and is_known(tuple(out)) and _prod(out) != _prod(data):
        shown = tuple(out[::-1]) if reverse else tuple(out)
        raise ShapeError(f"cannot reshape {data} ({_prod(data)} elements) into {shown} "
                         f"({_prod(out)} elements)")
    return tuple(out[::-1]) if reverse else tuple(out)


def _legacy_target(data: Shape, target: tuple[int, ...], keep_highest: bool) -> Shape:
    """Pre-1.0 ``target_shape``: one 0 is inferred; ``keep_highest`` keeps dimension 0."""
    out = list(target)
    start = 1 if keep_highest else 0
    if keep_highest:
        out[0] = data[0]
    unknown = [index for index in range(start, len(out)) if out[index] == 0]
    if len(unknown) == 1 and is_known(data):
        out[unknown[0]] = 1
        out[unknown[0]] = _prod(data) // max(_prod(out), 1)
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
    return (data[0], _prod(data[1:]))


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


# --- Transposes -------------------------------------------------------------------------------

def _permutation(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    if not attrs.axes:
        return tuple(range(ndim - 1, -1, -1))
    axes = tuple(normalize_axis(axis, ndim, "transpose axis") for axis in attrs.axes)
    if sorted(axes) != list(range(ndim)):
        raise ShapeError(f"transpose axes {attrs.axes} are not a permutation of {ndim} axes")
    return axes


def _transpose_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    return [data], [tuple(data[axis] for axis in _permutation(attrs, len(data)))]


register(OpDef(
    name="transpose",
    params=(Param("axes", parse_int_tuple, ()),),
    infer_shape=_transpose_infer,
    kernel=lambda xp, attrs, data, out=None: _emit(
        xp, data.transpose(_permutation(attrs, data.ndim)), out),
    writes_out=True,
    doc="Permute axes (reverse them when axes is empty).",
))


def _swap(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    order = list(range(ndim))
    first = normalize_axis(attrs.dim1, ndim, "SwapAxis dim1")
    second = normalize_axis(attrs.dim2, ndim, "SwapAxis dim2")
    order[first], order[second] = order[second], order[first]
    return tuple(order)


def _swap_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    return [data], [tuple(data[axis] for axis in _swap(attrs, len(data)))]


register(OpDef(
    name="SwapAxis",
    aliases=("swapaxes",),
    params=(Param("dim1", parse_int, 0), Param("dim2", parse_int, 0)),
    infer_shape=_swap_infer,
    kernel=lambda xp, attrs, data, out=None: _emit(
        xp, data.transpose(_swap(attrs, data.ndim)), out),
    writes_out=True,
    doc="Swap two axes.",
))


def _depth_to_space_shape(attrs: Attrs, data: Shape, inverse: bool) -> Shape:
    if len(data) != 4:
        raise ShapeError(f"expected a 4-D (N, C, H, W) input, got {data}")
    block = attrs.block_size
    batch, channels, height, width = data
    if inverse:
        if (height and height % block) or (width and width % block):
            raise ShapeError(f"height and width of {data} must divide by block_size {block}")
        return (batch, channels * block * block, height // block, width // block)
    if channels and channels % (block * block):
        raise ShapeError(f"channels of {data} must divide by block_size² = {block * block}")
    return (batch, channels // (block * block), height * block, width * block)


def _space_infer(inverse: bool) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data = shapes[0]
        return [data], [None if data is None else _depth_to_space_shape(attrs, data, inverse)]

    return infer


def _depth_to_space(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    block = attrs.block_size
    batch, channels, height, width = data.shape
    shape = _depth_to_space_shape(attrs, data.shape, False)
    grid = data.reshape(batch, block, block, channels // (block * block), height, width)
    return _emit(xp, grid.transpose(0, 3, 4, 1, 5, 2).reshape(shape), out)


def _space_to_depth(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    block = attrs.block_size
    batch, channels, height, width = data.shape
    shape = _depth_to_space_shape(attrs, data.shape, True)
    grid = data.reshape(batch, channels, height // block, block, width // block, block)
    return _emit(xp, grid.transpose(0, 3, 5, 1, 2, 4).reshape(shape), out)


register(OpDef(
    name="depth_to_space",
    params=(Param("block_size", parse_int),),
    infer_shape=_space_infer(False),
    kernel=_depth_to_space,
    writes_out=True,
    doc="Move channel blocks into block_size x block_size spatial tiles (DCR order).",
))
register(OpDef(
    name="space_to_depth",
    params=(Param("block_size", parse_int),),
    infer_shape=_space_infer(True),
    kernel=_space_to_depth,
    writes_out=True,
    doc="Move block_size x block_size spatial tiles into channels.",
))


# --- Slicing ----------------------------------------------------------------------------------

def _slice_length(dim: int, index: slice) -> int:
    return len(range(*index.indices(dim)))


def _slices(attrs: Attrs, ndim: int) -> tuple[slice, ...]:
    begin, end, step = attrs.begin, attrs.end, attrs.step
    if len(begin) != len(end) or (step and len(step) != len(begin)):
        raise ShapeError(f"slice begin {begin}, end {end} and step {step} differ in length")
    if len(begin) > ndim:
        raise ShapeError(f"slice of {len(begin)} axes on a {ndim}-D input")
    result = []
    for axis in range(len(begin)):
        stride = step[axis] if step and step[axis] is not None else 1
        if stride == 0:
            raise ShapeError("slice step must not be 0")
        result.append(slice(begin[axis], end[axis], stride))
    return tuple(result)


def _slice_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    slices = _slices(attrs, len(data))
    out = [(_slice_length(dim, slices[axis]) if dim else 0) if axis < len(slices) else dim
           for axis, dim in enumerate(data)]
    return [data], [tuple(out)]


register(OpDef(
    name="slice",
    aliases=("crop",),
    params=(
        Param("begin", parse_optional_int_tuple),
        Param("end", parse_optional_int_tuple),
        Param("step", parse_optional_int_tuple, ()),
    ),
    infer_shape=_slice_infer,
    kernel=lambda xp, attrs, data, out=None: _emit(xp, data[_slices(attrs, data.ndim)], out),
    writes_out=True,
    doc="Python-style slicing per axis; None takes the default end, step may be negative.",
))


def _axis_slice(attrs: Attrs, ndim: int) -> tuple[int, slice]:
    axis = normalize_axis(attrs.axis, ndim, "slice_axis axis")
    return axis, slice(attrs.begin, attrs.end)


def _slice_axis_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    axis, index = _axis_slice(attrs, len(data))
    out = list(data)
    out[axis] = _slice_length(data[axis], index) if data[axis] else 0
    return [data], [tuple(out)]


def _slice_axis_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    axis, index = _axis_slice(attrs, data.ndim)
    return _emit(xp, data[(slice(None),) * axis + (index,)], out)


register(OpDef(
    name="slice_axis",
    params=(
        Param("axis", parse_int),
        Param("begin", parse_int),
        Param("end", optional(parse_int)),
    ),
    infer_shape=_slice_axis_infer,
    kernel=_slice_axis_kernel,
    writes_out=True,
    doc="data[begin:end] along one axis (end None = to the end).",
))


def _like_axes(attrs: Attrs, data: Shape, like: Shape) -> list[int]:
    if attrs.axes:
        return [normalize_axis(axis, len(data), "slice_like axis") for axis in attrs.axes]
    if len(like) > len(data):
        raise ShapeError(f"slice_like: shape_like {like} has more axes than data {data}")
    return list(range(len(like)))


def _slice_like_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, like = shapes
    if data is None or like is None:
        return [data, like], [None]
    out = list(data)
    for axis in _like_axes(attrs, data, like):
        if axis >= len(like):
            raise ShapeError(f"slice_like axis {axis} is out of range for shape_like {like}")
        if data[axis] and like[axis] and like[axis] > data[axis]:
            raise ShapeError(f"slice_like: shape_like {like} is larger than data {data}")
        out[axis] = like[axis]
    return [data, like], [tuple(out)]


def _slice_like_kernel(xp: Any, attrs: Attrs, data: Any, like: Any, out: Any = None) -> Any:
    index = [slice(None)] * data.ndim
    for axis in _like_axes(attrs, data.shape, like.shape):
        index[axis] = slice(0, like.shape[axis])
    return _emit(xp, data[tuple(index)], out)


def _first_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    """Output takes input 0's dtype; other inputs keep theirs."""
    return dtypes, [dtypes[0]]


register(OpDef(
    name="slice_like",
    params=(Param("axes", parse_int_tuple, ()),),
    inputs=("data", "shape_like"),
    infer_shape=_slice_like_infer,
    infer_dtype=_first_dtype,
    kernel=_slice_like_kernel,
    writes_out=True,
    doc="Slice data from 0 to shape_like's size on the given axes (all when empty).",
))


# --- Joining and splitting --------------------------------------------------------------------

def _arg_names(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"arg{index}" for index in range(attrs.num_args))


def _concat_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    known = [shape for shape in shapes if shape is not None]
    if not known:
        return shapes, [None]
    ndim = len(known[0])
    axis = normalize_axis(attrs.dim, ndim, "Concat dim")
    common: MaybeShape = None
    for shape in known:
        if len(shape) != ndim:
            raise ShapeError(f"Concat inputs differ in rank: {shapes}")
        common = merge(common, (*shape[:axis], 0, *shape[axis + 1:]), "Concat input shapes")
    assert common is not None
    filled = []
    for shape in shapes:
        size = 0 if shape is None else shape[axis]
        filled.append((*common[:axis], size, *common[axis + 1:]))
    sizes = [shape[axis] for shape in filled]
    total = sum(sizes) if all(sizes) else 0
    return filled, [(*common[:axis], total, *common[axis + 1:])]


def _concat_kernel(xp: Any, attrs: Attrs, *arrays: Any, out: Any = None) -> Any:
    axis = normalize_axis(attrs.dim, arrays[0].ndim, "Concat dim")
    if out is None:
        return xp.concatenate(arrays, axis=axis)
    return xp.concatenate(arrays, axis=axis, out=out)


register(OpDef(
    name="Concat",
    aliases=("concat",),
    params=(Param("num_args", parse_int), Param("dim", parse_int, 1)),
    inputs=_arg_names,
    infer_shape=_concat_infer,
    kernel=_concat_kernel,
    writes_out=True,
    doc="Join num_args arrays along axis dim.",
))


def _stack_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    common: MaybeShape = None
    for shape in shapes:
        common = merge(common, shape, "stack input shapes")
    if common is None:
        return shapes, [None]
    axis = normalize_axis(attrs.axis, len(common) + 1, "stack axis")
    return [common] * len(shapes), [(*common[:axis], attrs.num_args, *common[axis:])]


def _stack_kernel(xp: Any, attrs: Attrs, *arrays: Any, out: Any = None) -> Any:
    axis = normalize_axis(attrs.axis, arrays[0].ndim + 1, "stack axis")
    if out is None:
        return xp.stack(arrays, axis=axis)
    return xp.stack(arrays, axis=axis, out=out)


register(OpDef(
    name="stack",
    aliases=("_npi_stack",),
    params=(Param("num_args", parse_int), Param("axis", parse_int, 0)),
    inputs=_arg_names,
    infer_shape=_stack_infer,
    kernel=_stack_kernel,
    writes_out=True,
    doc="Join num_args same-shaped arrays along a new axis.",
))


def _split_outputs(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"output{index}" for index in range(attrs.num_outputs))


def _split_part(attrs: Attrs, data: Shape) -> Shape:
    axis = normalize_axis(attrs.axis, len(data), "SliceChannel axis")
    size = data[axis]
    if size and size % attrs.num_outputs:
        raise ShapeError(f"SliceChannel: axis {axis} of {data} does not split into "
                         f"{attrs.num_outputs} equal parts")
    if attrs.squeeze_axis:
        if size and size != attrs.num_outputs:
            raise ShapeError(f"SliceChannel squeeze_axis needs axis {axis} of {data} to equal "
                             f"num_outputs {attrs.num_outputs}")
        return (*data[:axis], *data[axis + 1:])
    return (*data[:axis], size // attrs.num_outputs, *data[axis + 1:])


def _split_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    part = None if data is None else _split_part(attrs, data)
    return [data], [part] * attrs.num_outputs


def _split_kernel(xp: Any, attrs: Attrs, data: Any) -> tuple[Any, ...]:
    axis = normalize_axis(attrs.axis, data.ndim, "SliceChannel axis")
    shape = _split_part(attrs, data.shape)
    return tuple(part.reshape(shape).copy() for part in xp.split(data, attrs.num_outputs, axis))


register(OpDef(
    name="SliceChannel",
    aliases=("split",),
    params=(
        Param("num_outputs", parse_int),
        Param("axis", parse_int, 1),
        Param("squeeze_axis", parse_bool, False),
    ),
    outputs=_split_outputs,
    infer_shape=_split_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]] * attrs.num_outputs),
    kernel=_split_kernel,
    doc="Split into num_outputs equal parts along axis (squeeze_axis drops it).",
))


# --- Tiling, repeating, broadcasting ----------------------------------------------------------

def _tile_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    length = max(len(data), len(attrs.reps))
    dims = (1,) * (length - len(data)) + tuple(data)
    reps = (1,) * (length - len(attrs.reps)) + tuple(attrs.reps)
    return [data], [tuple(dim * rep for dim, rep in zip(dims, reps, strict=True))]


register(OpDef(
    name="tile",
    params=(Param("reps", parse_int_tuple),),
    infer_shape=_tile_infer,
    kernel=lambda xp, attrs, data: xp.tile(data, attrs.reps),
    doc="Repeat the whole array reps times per axis (NumPy tile).",
))


def _repeat_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    if attrs.axis is None:
        return [data], [(_prod(data) * attrs.repeats,)]
    axis = normalize_axis(attrs.axis, len(data), "repeat axis")
    return [data], [(*data[:axis], data[axis] * attrs.repeats, *data[axis + 1:])]


register(OpDef(
    name="repeat",
    params=(Param("repeats", parse_int), Param("axis", optional(parse_int), None)),
    infer_shape=_repeat_infer,
    kernel=lambda xp, attrs, data: xp.repeat(data, attrs.repeats, axis=attrs.axis),
    doc="Repeat each element repeats times along axis (flattened when axis is None).",
))


def _broadcast_dims(data: Shape, target: Shape) -> Shape:
    if len(data) != len(target):
        raise ShapeError(f"cannot broadcast {data} to {target}: ranks differ")
    out = []
    for have, want in zip(data, target, strict=True):
        if not want:
            out.append(have)
        elif have not in (0, 1, want):
            raise ShapeError(f"cannot broadcast {data} to {target}")
        else:
            out.append(want)
    return tuple(out)


def _broadcast_to_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    return [data], [_broadcast_dims(data, attrs.shape)]


def _broadcast_kernel(shape_of: Any) -> Any:
    def kernel(xp: Any, attrs: Attrs, data: Any, *rest: Any, out: Any = None) -> Any:
        shape = shape_of(attrs, data.shape, *(array.shape for array in rest))
        if out is None:
            return xp.broadcast_to(data, shape).copy()
        xp.copyto(out, data, casting="unsafe")
        return out

    return kernel


register(OpDef(
    name="broadcast_to",
    params=(Param("shape", parse_int_tuple),),
    infer_shape=_broadcast_to_infer,
    kernel=_broadcast_kernel(lambda attrs, data: _broadcast_dims(data, attrs.shape)),
    writes_out=True,
    doc="Broadcast to shape; a 0 in shape keeps the input's dimension.",
))


def _like_shape(attrs: Attrs, lhs: Shape, rhs: Shape) -> Shape:
    if attrs.lhs_axes is None and attrs.rhs_axes is None:
        return _broadcast_dims(lhs, rhs)
    lhs_axes, rhs_axes = attrs.lhs_axes or (), attrs.rhs_axes or ()
    if len(lhs_axes) != len(rhs_axes):
        raise ShapeError(f"broadcast_like lhs_axes {lhs_axes} and rhs_axes {rhs_axes} differ "
                         "in length")
    target = [0] * len(lhs)
    for left, right in zip(lhs_axes, rhs_axes, strict=True):
        target[normalize_axis(left, len(lhs), "lhs_axes")] = rhs[
            normalize_axis(right, len(rhs), "rhs_axes")]
    return _broadcast_dims(lhs, tuple(target))


def _broadcast_like_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None or rhs is None:
        return [lhs, rhs], [None]
    return [lhs, rhs], [_like_shape(attrs, lhs, rhs)]


register(OpDef(
    name="broadcast_like",
    params=(
        Param("lhs_axes", optional(parse_int_tuple), None),
        Param("rhs_axes", optional(parse_int_tuple), None),
    ),
    inputs=("lhs", "rhs"),
    infer_shape=_broadcast_like_infer,
    infer_dtype=_first_dtype,
    kernel=_broadcast_kernel(_like_shape),
    writes_out=True,
    doc="Broadcast lhs to rhs's shape (or only on lhs_axes, sized from rhs_axes).",
))


def _axis_shape(attrs: Attrs, data: Shape) -> Shape:
    if len(attrs.axis) != len(attrs.size):
        raise ShapeError(f"broadcast_axis axis {attrs.axis} and size {attrs.size} differ in "
                         "length")
    target = [0] * len(data)
    for axis, size in zip(attrs.axis, attrs.size, strict=True):
        target[normalize_axis(axis, len(data), "broadcast_axis axis")] = size
    return _broadcast_dims(data, tuple(target))


def _broadcast_axis_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    return [data], [None if data is None else _axis_shape(attrs, data)]


register(OpDef(
    name="broadcast_axis",
    aliases=("broadcast_axes",),
    params=(Param("axis", parse_int_tuple, ()), Param("size", parse_int_tuple, ())),
    infer_shape=_broadcast_axis_infer,
    kernel=_broadcast_kernel(_axis_shape),
    writes_out=True,
    doc="Broadcast the size-1 axes in axis to the matching size.",
))


# --- Padding and reversing --------------------------------------------------------------------

def _pad_pairs(attrs: Attrs, ndim: int) -> tuple[tuple[int, int], ...]:
    width = attrs.pad_width
    if len(width) != 2 * ndim:
        raise ShapeError(f"Pad pad_width {width} needs 2 x {ndim} = {2 * ndim} values for a "
                         f"{ndim}-D input")
    return tuple((width[2 * axis], width[2 * axis + 1]) for axis in range(ndim))


def _pad_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    pairs = _pad_pairs(attrs, len(data))
    return [data], [tuple(dim + before + after if dim else 0
                          for dim, (before, after) in zip(data, pairs, strict=True))]


def _pad_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    pairs = _pad_pairs(attrs, data.ndim)
    if attrs.mode == "constant":
        return xp.pad(data, pairs, mode="constant", constant_values=attrs.constant_value)
    return xp.pad(data, pairs, mode=attrs.mode)


register(OpDef(
    name="Pad",
    aliases=("pad",),
    params=(
        Param("mode", choice("constant", "edge", "reflect"), "constant"),
        Param("pad_width", parse_int_tuple),
        Param("constant_value", parse_float, 0.0),
    ),
    infer_shape=_pad_infer,
    kernel=_pad_kernel,
    doc="Pad each axis by (before, after) pairs from pad_width: constant, edge or reflect.",
))


def _reverse_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    axes = tuple(normalize_axis(axis, data.ndim, "reverse axis") for axis in attrs.axis)
    return _emit(xp, xp.flip(data, axis=axes), out)


register(OpDef(
    name="reverse",
    aliases=("flip",),
    params=(Param("axis", parse_int_tuple),),
    infer_shape=lambda attrs, shapes: (shapes, [shapes[0]]),
    kernel=_reverse_kernel,
    writes_out=True,
    doc="Reverse the order of elements along the given axes.",
))
