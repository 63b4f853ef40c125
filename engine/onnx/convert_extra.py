"""Converters for NumPy-mode layout, joining, splitting and elementwise ops."""

from __future__ import annotations

import math

import numpy as np

from engine.onnx.context import NodeContext, converts, normalize_axis
from engine.onnx.convert_math import reduce_axes
from engine.onnx.convert_tensor import INT_MAX, reverse


@converts("reshape_like", "_np_squeeze", "_np_atleast_1d", "_np_atleast_2d", "_np_atleast_3d")
def reshape_to_inferred(ctx: NodeContext) -> str | list[str]:
    # Only the shape changes, and shape inference already knows each output's.
    outputs = [ctx.op("Reshape", [ctx.inputs[k], ctx.out_shape_tensor(k, infer_one=True)])
               for k in range(len(ctx.out_shapes))]
    return outputs if len(outputs) > 1 else outputs[0]


@converts("_np_transpose")
def np_transpose(ctx: NodeContext) -> str:
    axes = ctx.params.axes or tuple(reversed(range(ctx.rank())))
    return ctx.op("Transpose", [ctx.inputs[0]],
                  perm=[normalize_axis(a, ctx.rank()) for a in axes])


@converts("_np_moveaxis")
def moveaxis(ctx: NodeContext) -> str:
    rank = ctx.rank()
    source = [normalize_axis(a, rank) for a in _as_tuple(ctx.params.source)]
    target = [normalize_axis(a, rank) for a in _as_tuple(ctx.params.destination)]
    perm = [axis for axis in range(rank) if axis not in source]
    for destination, axis in sorted(zip(target, source)):
        perm.insert(destination, axis)
    return ctx.op("Transpose", [ctx.inputs[0]], perm=perm)


def _as_tuple(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)


@converts("_npi_flip")
def flip(ctx: NodeContext) -> str:
    return reverse(ctx)


@converts("_npi_broadcast_to")
def np_broadcast_to(ctx: NodeContext) -> str:
    return ctx.op("Expand", [ctx.inputs[0], ctx.out_shape_tensor(0)])


@converts("_npi_concatenate", "_npi_hstack", "_npi_vstack", "_npi_column_stack", "_npi_dstack")
def np_join(ctx: NodeContext) -> str:
    rank = len(ctx.out_shapes[0])
    axis = {"_npi_vstack": 0, "_npi_column_stack": 1, "_npi_dstack": 2}.get(ctx.op_name)
    if ctx.op_name == "_npi_concatenate":
        axis = normalize_axis(ctx.params.axis, rank)
    elif ctx.op_name == "_npi_hstack":
        axis = 1 if rank > 1 else 0
    parts = [name if len(shape) == rank else ctx.op("Reshape", [name, ctx.ints(
        _promoted(shape, rank, ctx.op_name))]) for name, shape in zip(ctx.inputs, ctx.in_shapes)]
    return ctx.op("Concat", parts, axis=axis)


def _promoted(shape: tuple, rank: int, op_name: str) -> list[int]:
    """The shape NumPy's stacking functions give a lower-rank operand."""
    if op_name == "_npi_column_stack":
        return [*shape, 1]
    if op_name == "_npi_dstack" and len(shape) == 2:
        return [*shape, 1]
    return [1] * (rank - len(shape) - (op_name == "_npi_dstack")) + list(shape) + (
        [1] if op_name == "_npi_dstack" else [])


@converts("_split_v2", "_npi_hsplit", "_npi_dsplit")
def split_v2(ctx: NodeContext) -> str | list[str]:
    axis = normalize_axis(ctx.params.axis, ctx.rank()) if ctx.rank() > 1 else 0
    squeeze = bool(ctx.params.squeeze_axis)
    sizes = [1 if squeeze else shape[axis] for shape in ctx.out_shapes]
    if len(sizes) == 1:
        parts = [ctx.op("Identity", [ctx.inputs[0]])]
    else:
        parts = ctx.op("Split", [ctx.inputs[0], ctx.ints(sizes)], outputs=len(sizes), axis=axis)
    if squeeze:
        parts = [ctx.squeeze(part, [axis]) for part in parts]
    return parts if len(parts) > 1 else parts[0]


@converts("_npi_where")
def np_where(ctx: NodeContext) -> str:
    return ctx.op("Where", [ctx.cast(ctx.inputs[0], np.bool_), *ctx.inputs[1:3]])


@converts("_npi_where_lscalar", "_npi_where_rscalar", "_npi_where_scalar2")
def np_where_scalar(ctx: NodeContext) -> str:
    condition, dtype = ctx.cast(ctx.inputs[0], np.bool_), ctx.out_dtypes[0]

    def scalar(value: float) -> str:
        return ctx.builder.const(np.asarray(value, dtype), f"{ctx.hint}_scalar")

    if ctx.op_name == "_npi_where_scalar2":
        operands = [scalar(ctx.params.x), scalar(ctx.params.y)]
    elif ctx.op_name == "_npi_where_lscalar":
        operands = [scalar(ctx.params.scalar), ctx.inputs[1]]
    else:
        operands = [ctx.inputs[1], scalar(ctx.params.scalar)]
    return ctx.op("Where", [condition, *operands])


@converts("_npi_isnan", "_npi_isinf", "_npi_isposinf", "_npi_isneginf", "_npi_isfinite")
def float_class(ctx: NodeContext) -> str:
    data = ctx.inputs[0]
    if ctx.op_name == "_npi_isnan":
        return ctx.op("IsNaN", [data])
    if ctx.op_name == "_npi_isfinite":
        return ctx.op("Not", [ctx.op("Or", [ctx.op("IsNaN", [data]), ctx.op("IsInf", [data])])])
    sides = {"_npi_isinf": (1, 1), "_npi_isposinf": (0, 1), "_npi_isneginf": (1, 0)}
    negative, positive = sides[ctx.op_name]
    return ctx.op("IsInf", [data], detect_negative=negative, detect_positive=positive)


@converts("degrees", "radians", "_npi_degrees", "_npi_radians")
def angle_units(ctx: NodeContext) -> str:
    factor = 180.0 / math.pi if ctx.op_name.endswith("degrees") else math.pi / 180.0
    return ctx.op("Mul", [ctx.inputs[0], ctx.scalar(factor)])


@converts("rint", "_npi_rint")
def rint(ctx: NodeContext) -> str:
    return ctx.op("Round", [ctx.inputs[0]])  # both round halves to even


@converts("_npi_around")
def around(ctx: NodeContext) -> str:
    scale = ctx.scalar(10.0 ** int(ctx.params.decimals))
    return ctx.op("Div", [ctx.op("Round", [ctx.op("Mul", [ctx.inputs[0], scale])]), scale])


@converts("_npi_nan_to_num")
def nan_to_num(ctx: NodeContext) -> str:
    params, data = ctx.params, ctx.inputs[0]
    info = np.finfo(ctx.in_dtypes[0])
    posinf = info.max if params.posinf is None else params.posinf
    neginf = info.min if params.neginf is None else params.neginf
    result = ctx.op("Where", [ctx.op("IsNaN", [data]), ctx.scalar(params.nan), data])
    result = ctx.op("Where", [ctx.op("IsInf", [data], detect_negative=0), ctx.scalar(posinf),
                              result])
    return ctx.op("Where", [ctx.op("IsInf", [data], detect_positive=0), ctx.scalar(neginf),
                            result])


@converts("_np_all", "_np_any")
def all_any(ctx: NodeContext) -> str:
    truthy = ctx.cast(ctx.cast(ctx.inputs[0], np.bool_), np.int32)
    op_type = "ReduceMin" if ctx.op_name == "_np_all" else "ReduceMax"
    reduced = ctx.reduce(op_type, truthy, reduce_axes(ctx), bool(ctx.params.keepdims))
    return ctx.cast(reduced, np.bool_)


@converts("moments")
def moments(ctx: NodeContext) -> list[str]:
    axes = sorted(normalize_axis(a, ctx.rank()) for a in ctx.params.axes) \
        if ctx.params.axes else None
    mean = ctx.reduce("ReduceMean", ctx.inputs[0], axes, True)
    centred = ctx.op("Sub", [ctx.inputs[0], mean])
    variance = ctx.reduce("ReduceMean", ctx.op("Mul", [centred, centred]), axes, True)
    return [ctx.op("Reshape", [value, ctx.out_shape_tensor(k, infer_one=True)])
            for k, value in enumerate((mean, variance))]


@converts("_npi_var", "_npi_std")
def variance(ctx: NodeContext) -> str:
    if ctx.params.dtype is not None and np.dtype(ctx.params.dtype) != ctx.in_dtypes[0]:
        raise ctx.fail("dtype= different from the input's is not supported")
    axes = reduce_axes(ctx) or list(range(ctx.rank()))
    data = ctx.inputs[0]
    mean = ctx.reduce("ReduceMean", data, axes, True)
    centred = ctx.op("Sub", [data, mean])
    total = ctx.reduce("ReduceSum", ctx.op("Mul", [centred, centred]), axes,
                       bool(ctx.params.keepdims))
    # The count of reduced entries, at run time (the batch axis may be among them).
    count = ctx.cast(ctx.op("Div", [ctx.op("Size", [data]), ctx.op("Size", [mean])]),
                     ctx.in_dtypes[0])
    divisor = ctx.op("Sub", [count, ctx.scalar(float(ctx.params.ddof))])
    result = ctx.op("Div", [total, divisor])
    return ctx.op("Sqrt", [result]) if ctx.op_name == "_npi_std" else result


@converts("_np_cumsum")
def cumsum(ctx: NodeContext) -> str:
    data, axis = ctx.inputs[0], ctx.params.axis
    if axis is None:
        data, axis = ctx.op("Reshape", [data, ctx.ints([-1])]), 0
    if ctx.out_dtypes[0] != ctx.in_dtypes[0]:
        data = ctx.cast(data, ctx.out_dtypes[0])
    return ctx.op("CumSum", [data, ctx.builder.const(np.int64(axis), "axis")])


@converts("_npi_tril")
def tril(ctx: NodeContext) -> str:
    return ctx.op("Trilu", [ctx.inputs[0], ctx.builder.const(np.int64(ctx.params.k), "k")],
                  upper=0)


@converts("_np_roll")
def roll(ctx: NodeContext) -> str:
    data, params = ctx.inputs[0], ctx.params
    if params.axis is None:
        flat = ctx.op("Reshape", [data, ctx.ints([-1])])
        rolled = _roll_axis(ctx, flat, int(_as_tuple(params.shift)[0]), 0,
                            math.prod(ctx.in_shapes[0]))
        return ctx.op("Reshape", [rolled, ctx.op("Shape", [data])])
    axes = _as_tuple(params.axis)
    shifts = _as_tuple(params.shift)
    shifts = shifts * len(axes) if len(shifts) == 1 else shifts
    for axis, shift in zip(axes, shifts):
        axis = normalize_axis(axis, ctx.rank())
        data = _roll_axis(ctx, data, int(shift), axis, ctx.static_dim(0, axis))
    return data


def _roll_axis(ctx: NodeContext, data: str, shift: int, axis: int, size: int) -> str:
    cut = size - shift % size
    if cut in (0, size):
        return ctx.op("Identity", [data])
    tail = ctx.op("Slice", [data, ctx.ints([cut]), ctx.ints([INT_MAX]), ctx.ints([axis])])
    head = ctx.op("Slice", [data, ctx.ints([0]), ctx.ints([cut]), ctx.ints([axis])])
    return ctx.op("Concat", [tail, head], axis=axis)


@converts("_npi_diff")
def diff(ctx: NodeContext) -> str:
    data, axis = ctx.inputs[0], normalize_axis(ctx.params.axis, ctx.rank())
    for _ in range(int(ctx.params.n)):
        later = ctx.op("Slice", [data, ctx.ints([1]), ctx.ints([INT_MAX]), ctx.ints([axis])])
        earlier = ctx.op("Slice", [data, ctx.ints([0]), ctx.ints([-1]), ctx.ints([axis])])
        data = ctx.op("Sub", [later, earlier])
    return data


@converts("_npi_rot90")
def rot90(ctx: NodeContext) -> str:
    rank, data = ctx.rank(), ctx.inputs[0]
    first, second = (normalize_axis(a, rank) for a in (ctx.params.axes or (0, 1)))
    turns = int(ctx.params.k) % 4
    swap = list(range(rank))
    swap[first], swap[second] = second, first

    def flipped(name: str, axes: list[int]) -> str:
        count = len(axes)
        return ctx.op("Slice", [name, ctx.ints([-1] * count), ctx.ints([-INT_MAX] * count),
                                ctx.ints(axes), ctx.ints([-1] * count)])

    if turns == 0:
        return ctx.op("Identity", [data])
    if turns == 2:
        return flipped(data, [first, second])
    if turns == 1:
        return ctx.op("Transpose", [flipped(data, [second])], perm=swap)
    return flipped(ctx.op("Transpose", [data], perm=swap), [second])


@converts("argmax_channel")
def argmax_channel(ctx: NodeContext) -> str:
    index = ctx.op("ArgMax", [ctx.inputs[0]], axis=-1, keepdims=0)
    return ctx.cast(index, ctx.out_dtypes[0])


@converts("smooth_l1")
def smooth_l1(ctx: NodeContext) -> str:
    sigma2 = float(ctx.params.scalar) ** 2
    data = ctx.inputs[0]
    magnitude = ctx.op("Abs", [data])
    scaled = ctx.op("Mul", [data, ctx.scalar(float(ctx.params.scalar))])
    inner = ctx.op("Mul", [ctx.op("Mul", [scaled, scaled]), ctx.scalar(0.5)])
    outer = ctx.op("Sub", [magnitude, ctx.scalar(0.5 / sigma2)])
    return ctx.op("Where", [ctx.op("Less", [magnitude, ctx.scalar(1.0 / sigma2)]), inner,
                            outer])


@converts("_contrib_quadratic")
def quadratic(ctx: NodeContext) -> str:
    data, params = ctx.inputs[0], ctx.params
    square = ctx.op("Mul", [ctx.op("Mul", [data, data]), ctx.scalar(params.a)])
    linear = ctx.op("Mul", [data, ctx.scalar(params.b)])
    return ctx.op("Add", [ctx.op("Add", [square, linear]), ctx.scalar(params.c)])


@converts("_npi_ldexp", "_npi_ldexp_scalar", "_npi_rldexp_scalar")
def ldexp(ctx: NodeContext) -> str:
    # x * 2**e is exact in floating point, as ldexp is.
    if ctx.op_name == "_npi_ldexp":
        mantissa, exponent = ctx.inputs[:2]
    elif ctx.op_name == "_npi_ldexp_scalar":
        mantissa, exponent = ctx.inputs[0], ctx.scalar(ctx.params.scalar)
    else:
        mantissa, exponent = ctx.scalar(ctx.params.scalar), ctx.inputs[0]
    return ctx.op("Mul", [mantissa, ctx.op("Pow", [ctx.scalar(2.0), exponent])])


@converts("_npi_polyval")
def polyval(ctx: NodeContext) -> str:
    coefficients, data = ctx.inputs[:2]
    result = None
    for k in range(ctx.static_dim(0, 0)):  # Horner's scheme, as NumPy evaluates it
        coefficient = ctx.op("Gather", [coefficients, ctx.builder.const(np.int64(k), "k")])
        result = coefficient if result is None else ctx.op(
            "Add", [ctx.op("Mul", [result, data]), coefficient])
    return ctx.op("Expand", [result, ctx.op("Shape", [data])])


@converts("khatri_rao")
def khatri_rao(ctx: NodeContext) -> str:
    result, rows = ctx.inputs[0], ctx.in_shapes[0][0]
    for name, shape in zip(ctx.inputs[1:], ctx.in_shapes[1:]):
        product = ctx.op("Mul", [ctx.unsqueeze(result, [1]), ctx.unsqueeze(name, [0])])
        rows *= shape[0]
        result = ctx.op("Reshape", [product, ctx.ints([rows, -1])])
    return result


@converts("batch_take")
def batch_take(ctx: NodeContext) -> str:
    size = ctx.static_dim(0, 1)
    index = ctx.op("Clip", [ctx.cast(ctx.inputs[1], np.int64),
                            ctx.builder.const(np.int64(0), "zero"),
                            ctx.builder.const(np.int64(size - 1), "last")])
    picked = ctx.op("GatherElements", [ctx.inputs[0], ctx.unsqueeze(index, [1])], axis=1)
    return ctx.squeeze(picked, [1])


@converts("_contrib_allclose")
def allclose(ctx: NodeContext) -> str:
    lhs, rhs = ctx.inputs[:2]
    bound = ctx.op("Add", [ctx.scalar(ctx.params.atol),
                           ctx.op("Mul", [ctx.scalar(ctx.params.rtol), ctx.op("Abs", [rhs])])])
    close = ctx.op("LessOrEqual", [ctx.op("Abs", [ctx.op("Sub", [lhs, rhs])]), bound])
    if ctx.params.equal_nan:
        both_nan = ctx.op("And", [ctx.op("IsNaN", [lhs]), ctx.op("IsNaN", [rhs])])
        close = ctx.op("Or", [close, both_nan])
    every = ctx.op("ReduceMin", [ctx.cast(close, np.int32)], keepdims=0)
    return ctx.cast(ctx.op("Reshape", [every, ctx.ints(ctx.out_shapes[0])]), ctx.out_dtypes[0])


@converts("_contrib_index_copy")
def index_copy(ctx: NodeContext) -> str:
    index = ctx.unsqueeze(ctx.cast(ctx.inputs[1], np.int64), [1])
    return ctx.op("ScatterND", [ctx.inputs[0], index, ctx.inputs[2]])


@converts("gather_nd")
def gather_nd(ctx: NodeContext) -> str:
    # MXNet's index tuples run along the indices' first axis; ONNX's along their last.
    rank = ctx.rank(1)
    indices = ctx.op("Transpose", [ctx.cast(ctx.inputs[1], np.int64)],
                     perm=[*range(1, rank), 0])
    return ctx.op("GatherND", [ctx.inputs[0], indices])


@converts("_ravel_multi_index")
def ravel_multi_index(ctx: NodeContext) -> str:
    shape = [int(dim) for dim in ctx.params.shape]
    strides = np.cumprod([1, *shape[::-1]])[:-1][::-1].astype(np.int64)
    indices = ctx.cast(ctx.inputs[0], np.int64)
    weighted = ctx.op("Mul", [indices, ctx.builder.const(strides.reshape(-1, 1), "strides")])
    flat = ctx.op("ReduceSum", [weighted, ctx.ints([0])], keepdims=0)
    return ctx.cast(flat, ctx.out_dtypes[0])


@converts("_unravel_index")
def unravel_index(ctx: NodeContext) -> str:
    shape = [int(dim) for dim in ctx.params.shape]
    strides = np.cumprod([1, *shape[::-1]])[:-1][::-1].astype(np.int64)
    flat = ctx.unsqueeze(ctx.cast(ctx.inputs[0], np.int64), [0])
    quotient = ctx.op("Div", [flat, ctx.builder.const(strides.reshape(-1, 1), "strides")])
    digits = ctx.op("Mod", [quotient, ctx.builder.const(np.asarray(shape, np.int64).reshape(
        -1, 1), "sizes")])
    return ctx.cast(digits, ctx.out_dtypes[0])


BITWISE = {"_npi_bitwise_and": "BitwiseAnd", "_npi_bitwise_or": "BitwiseOr",
           "_npi_bitwise_xor": "BitwiseXor", "_npi_bitwise_and_scalar": "BitwiseAnd",
           "_npi_bitwise_or_scalar": "BitwiseOr", "_npi_bitwise_xor_scalar": "BitwiseXor"}


def _needs_opset(ctx: NodeContext, opset: int) -> None:
    if ctx.builder.opset < opset:
        raise ctx.fail(f"needs ONNX opset {opset} or later (exporting at "
                       f"{ctx.builder.opset}); export with opset={opset}")


@converts(*BITWISE)
def bitwise(ctx: NodeContext) -> str:
    _needs_opset(ctx, 18)
    if ctx.op_name.endswith("_scalar"):
        other = ctx.builder.const(np.asarray(int(ctx.params.scalar), ctx.in_dtypes[0]),
                                  f"{ctx.hint}_scalar")
        return ctx.op(BITWISE[ctx.op_name], [ctx.inputs[0], other])
    return ctx.op(BITWISE[ctx.op_name], ctx.inputs[:2])


@converts("_npi_bitwise_not")
def bitwise_not(ctx: NodeContext) -> str:
    _needs_opset(ctx, 18)
    return ctx.op("BitwiseNot", [ctx.inputs[0]])


@converts("scatter_nd")
def scatter_nd(ctx: NodeContext) -> str:
    from engine.onnx.convert_tensor import _fill

    rank = ctx.rank(1)
    indices = ctx.op("Transpose", [ctx.cast(ctx.inputs[1], np.int64)],
                     perm=[*range(1, rank), 0])
    zeros = _fill(ctx, ctx.ints(ctx.out_shapes[0]), 0.0, ctx.out_dtypes[0])
    return ctx.op("ScatterND", [zeros, indices, ctx.inputs[0]])


@converts("_contrib_index_array")
def index_array(ctx: NodeContext) -> str:
    rank, data = ctx.rank(), ctx.inputs[0]
    axes = [normalize_axis(a, rank) for a in (ctx.params.axes or range(rank))]
    shape = ctx.op("Shape", [data])
    columns = []
    for axis in axes:
        size = ctx.op("Shape", [data], start=axis, end=axis + 1)
        positions = ctx.op("Range", [ctx.builder.const(np.int64(0), "zero"),
                                     ctx.squeeze(size, [0]),
                                     ctx.builder.const(np.int64(1), "one")])
        along = ctx.op("Reshape", [positions, ctx.ints([-1 if k == axis else 1
                                                        for k in range(rank)])])
        columns.append(ctx.unsqueeze(ctx.op("Expand", [along, shape]), [rank]))
    return ctx.op("Concat", columns, axis=rank)


LOGICAL_SCALAR = {"_logical_and_scalar": "And", "_logical_or_scalar": "Or",
                  "_logical_xor_scalar": "Xor", "_npi_logical_and_scalar": "And",
                  "_npi_logical_or_scalar": "Or", "_npi_logical_xor_scalar": "Xor"}


@converts(*LOGICAL_SCALAR)
def logical_scalar(ctx: NodeContext) -> str:
    scalar = ctx.builder.const(np.asarray(bool(ctx.params.scalar)), f"{ctx.hint}_scalar")
    truth = ctx.op(LOGICAL_SCALAR[ctx.op_name], [ctx.cast(ctx.inputs[0], np.bool_), scalar])
    return ctx.cast(truth, ctx.out_dtypes[0])


@converts("nansum", "nanprod")
def nan_reduce(ctx: NodeContext) -> str:
    # NaN counts as the reduction's identity (0 for a sum, 1 for a product).
    identity, op_type = (0.0, "ReduceSum") if ctx.op_name == "nansum" else (1.0, "ReduceProd")
    data = ctx.inputs[0]
    cleaned = ctx.op("Where", [ctx.op("IsNaN", [data]), ctx.scalar(identity), data])
    result = ctx.reduce(op_type, cleaned, reduce_axes(ctx), bool(ctx.params.keepdims))
    return ctx.op("Reshape", [result, ctx.out_shape_tensor(0, infer_one=True)])
