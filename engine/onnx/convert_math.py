"""Converters for elementwise, scalar, comparison, reduction and matrix-product ops."""

from __future__ import annotations

import math

import numpy as np

from engine.onnx.context import NodeContext, converts, normalize_axis

UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log",
         "sqrt": "Sqrt", "abs": "Abs", "negative": "Neg", "reciprocal": "Reciprocal",
         "floor": "Floor", "ceil": "Ceil", "sign": "Sign", "erf": "Erf", "softsign": "Softsign",
         "_copy": "Identity", "BlockGrad": "Identity", "LinearRegressionOutput": "Identity",
         "LogisticRegressionOutput": "Sigmoid", "MAERegressionOutput": "Identity",
         "sin": "Sin", "cos": "Cos", "tan": "Tan", "arcsin": "Asin", "arccos": "Acos",
         "arctan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "arcsinh": "Asinh",
         "arccosh": "Acosh", "arctanh": "Atanh", "_identity_with_attr_like_rhs": "Identity",
         # Loss heads and gradient markers whose forward passes the data through.
         "SVMOutput": "Identity", "MakeLoss": "Identity", "make_loss": "Identity",
         "_contrib_gradientmultiplier": "Identity"}
LOG_BASES = {"log2": 2.0, "log10": 10.0}
BINARY = {"elemwise_add": "Add", "elemwise_sub": "Sub", "elemwise_mul": "Mul",
          "elemwise_div": "Div", "broadcast_add": "Add", "broadcast_sub": "Sub",
          "broadcast_mul": "Mul", "broadcast_div": "Div", "broadcast_power": "Pow",
          "_maximum": "Max", "_minimum": "Min", "broadcast_maximum": "Max",
          "broadcast_minimum": "Min", "_power": "Pow", "_npi_matmul": "MatMul",
          "_npi_true_divide": "Div"}
# Comparisons return 0/1 in the inputs' dtype in MXNet, booleans in ONNX.
COMPARE = {"broadcast_equal": ("Equal", False), "broadcast_not_equal": ("Equal", True),
           "broadcast_greater": ("Greater", False), "broadcast_lesser": ("Less", False),
           "broadcast_greater_equal": ("GreaterOrEqual", False),
           "broadcast_lesser_equal": ("LessOrEqual", False), "_equal": ("Equal", False),
           "_not_equal": ("Equal", True), "_greater": ("Greater", False),
           "_greater_equal": ("GreaterOrEqual", False), "_lesser": ("Less", False),
           "_lesser_equal": ("LessOrEqual", False), "_npi_equal": ("Equal", False),
           "_npi_not_equal": ("Equal", True), "_npi_greater": ("Greater", False),
           "_npi_greater_equal": ("GreaterOrEqual", False), "_npi_less": ("Less", False),
           "_npi_less_equal": ("LessOrEqual", False)}
LOGICAL = {"_logical_and": "And", "_logical_or": "Or", "_logical_xor": "Xor",
           "broadcast_logical_and": "And", "broadcast_logical_or": "Or",
           "broadcast_logical_xor": "Xor", "_npi_logical_and": "And", "_npi_logical_or": "Or",
           "_npi_logical_xor": "Xor"}
# name -> (ONNX op, scalar on the left)
SCALAR = {"_plus_scalar": ("Add", False), "_minus_scalar": ("Sub", False),
          "_rminus_scalar": ("Sub", True), "_mul_scalar": ("Mul", False),
          "_div_scalar": ("Div", False), "_rdiv_scalar": ("Div", True),
          "_power_scalar": ("Pow", False), "_rpower_scalar": ("Pow", True),
          "_maximum_scalar": ("Max", False), "_minimum_scalar": ("Min", False),
          "_npi_add_scalar": ("Add", False), "_npi_subtract_scalar": ("Sub", False),
          "_npi_rsubtract_scalar": ("Sub", True), "_npi_multiply_scalar": ("Mul", False),
          "_npi_true_divide_scalar": ("Div", False), "_npi_rtrue_divide_scalar": ("Div", True),
          "_npi_power_scalar": ("Pow", False), "_npi_rpower_scalar": ("Pow", True),
          "_npi_maximum_scalar": ("Max", False), "_npi_minimum_scalar": ("Min", False)}
SCALAR_COMPARE = {"_equal_scalar": ("Equal", False), "_not_equal_scalar": ("Equal", True),
                  "_greater_scalar": ("Greater", False), "_lesser_scalar": ("Less", False),
                  "_greater_equal_scalar": ("GreaterOrEqual", False),
                  "_lesser_equal_scalar": ("LessOrEqual", False),
                  "_npi_equal_scalar": ("Equal", False), "_npi_not_equal_scalar": ("Equal", True),
                  "_npi_greater_scalar": ("Greater", False),
                  "_npi_less_scalar": ("Less", False),
                  "_npi_greater_equal_scalar": ("GreaterOrEqual", False),
                  "_npi_less_equal_scalar": ("LessOrEqual", False)}
REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin",
          "prod": "ReduceProd", "_npi_sum": "ReduceSum", "_npi_mean": "ReduceMean",
          "_npi_max": "ReduceMax", "_npi_min": "ReduceMin", "_npi_prod": "ReduceProd"}


@converts(*UNARY)
def unary(ctx: NodeContext) -> str:
    return ctx.op(UNARY[ctx.op_name], [ctx.inputs[0]])


@converts(*LOG_BASES)
def log_base(ctx: NodeContext) -> str:
    return ctx.op("Div", [ctx.op("Log", [ctx.inputs[0]]),
                          ctx.scalar(math.log(LOG_BASES[ctx.op_name]))])


@converts("trunc", "fix")
def trunc(ctx: NodeContext) -> str:
    data = ctx.inputs[0]
    return ctx.op("Mul", [ctx.op("Sign", [data]), ctx.op("Floor", [ctx.op("Abs", [data])])])


@converts("rsqrt")
def rsqrt(ctx: NodeContext) -> str:
    return ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.inputs[0]])])


@converts("square")
def square(ctx: NodeContext) -> str:
    return ctx.op("Mul", [ctx.inputs[0], ctx.inputs[0]])


@converts("round")
def round_half_away(ctx: NodeContext) -> str:
    # MXNet rounds halves away from zero; ONNX Round rounds them to even.
    data = ctx.inputs[0]
    magnitude = ctx.op("Floor", [ctx.op("Add", [ctx.op("Abs", [data]), ctx.scalar(0.5)])])
    return ctx.op("Mul", [ctx.op("Sign", [data]), magnitude])


@converts("hard_sigmoid")
def hard_sigmoid(ctx: NodeContext) -> str:
    return ctx.op("HardSigmoid", [ctx.inputs[0]], alpha=float(ctx.params.alpha),
                  beta=float(ctx.params.beta))


@converts("clip")
def clip(ctx: NodeContext) -> str:
    return ctx.op("Clip", [ctx.inputs[0], ctx.scalar(ctx.params.a_min),
                           ctx.scalar(ctx.params.a_max)])


@converts(*BINARY)
def binary(ctx: NodeContext) -> str:
    operands = [_as_output_dtype(ctx, k) for k in range(2)]
    return ctx.op(BINARY[ctx.op_name], operands)


def _as_output_dtype(ctx: NodeContext, index: int) -> str:
    # NumPy-mode true division of integers gives floats: compute in the output dtype.
    if ctx.in_dtypes[index] == ctx.out_dtypes[0]:
        return ctx.inputs[index]
    return ctx.cast(ctx.inputs[index], ctx.out_dtypes[0])


@converts(*LOGICAL)
def logical(ctx: NodeContext) -> str:
    operands = [ctx.cast(name, np.bool_) for name in ctx.inputs[:2]]
    return ctx.cast(ctx.op(LOGICAL[ctx.op_name], operands), ctx.out_dtypes[0])


@converts("logical_not", "_npi_logical_not")
def logical_not(ctx: NodeContext) -> str:
    return ctx.cast(ctx.op("Not", [ctx.cast(ctx.inputs[0], np.bool_)]), ctx.out_dtypes[0])


@converts("add_n")
def add_n(ctx: NodeContext) -> str:
    return ctx.op("Sum", ctx.inputs)


@converts(*COMPARE)
def compare(ctx: NodeContext) -> str:
    op_type, negate = COMPARE[ctx.op_name]
    return _as_number(ctx, ctx.op(op_type, ctx.inputs[:2]), negate)


@converts(*SCALAR)
def scalar_op(ctx: NodeContext) -> str:
    op_type, scalar_first = SCALAR[ctx.op_name]
    data = _as_output_dtype(ctx, 0)
    scalar = ctx.builder.const(np.asarray(ctx.params.scalar, ctx.out_dtypes[0]),
                               f"{ctx.hint}_scalar")
    operands = [scalar, data] if scalar_first else [data, scalar]
    return ctx.op(op_type, operands)


@converts(*SCALAR_COMPARE)
def scalar_compare(ctx: NodeContext) -> str:
    op_type, negate = SCALAR_COMPARE[ctx.op_name]
    return _as_number(ctx, ctx.op(op_type, [ctx.inputs[0], ctx.scalar(ctx.params.scalar)]),
                      negate)


def _as_number(ctx: NodeContext, boolean: str, negate: bool) -> str:
    if negate:
        boolean = ctx.op("Not", [boolean])
    return ctx.cast(boolean, ctx.out_dtypes[0])


def reduce_axes(ctx: NodeContext) -> list[int] | None:
    """The axes an MXNet reduction covers (None: all), with ``exclude`` applied."""
    axis, rank = ctx.params.axis, ctx.rank()
    if axis is None or axis == ():
        return None
    axes = sorted({normalize_axis(a, rank) for a in (axis if isinstance(axis, tuple) else
                                                     (axis,))})
    if ctx.params.get("exclude"):
        axes = [a for a in range(rank) if a not in axes]
    return axes


@converts(*REDUCE)
def reduce(ctx: NodeContext) -> str:
    if ctx.params.get("initial") is not None:
        raise ctx.fail("initial= is not supported")
    data = ctx.inputs[0]
    if ctx.params.get("dtype") is not None and np.dtype(ctx.params.dtype) != ctx.in_dtypes[0]:
        data = ctx.cast(data, ctx.params.dtype)  # NumPy accumulates in the requested dtype
    axes = reduce_axes(ctx)
    if axes == []:
        return ctx.op("Identity", [data])
    return _vector_if_scalar(ctx, ctx.reduce(REDUCE[ctx.op_name], data, axes,
                                             ctx.params.keepdims))


def _vector_if_scalar(ctx: NodeContext, result: str) -> str:
    # MXNet's full reductions give shape (1,) where ONNX gives a scalar.
    return ctx.op("Reshape", [result, ctx.ints([1])]) if ctx.out_shapes[0] == (1,) else result


@converts("norm")
def norm(ctx: NodeContext) -> str:
    orders = {1: "ReduceL1", 2: "ReduceL2"}
    if ctx.params.ord not in orders:
        raise ctx.fail(f"ord={ctx.params.ord} has no ONNX reduction; ord must be 1 or 2")
    return _vector_if_scalar(ctx, ctx.reduce(orders[ctx.params.ord], ctx.inputs[0],
                                             reduce_axes(ctx), ctx.params.keepdims))


@converts("argmax", "argmin", "_npi_argmax", "_npi_argmin")
def arg_reduce(ctx: NodeContext) -> str:
    data, axis = ctx.inputs[0], ctx.params.axis
    if axis is None:  # over the flattened input
        data, axis = ctx.op("Reshape", [data, ctx.ints([-1])]), 0
    op_type = "ArgMax" if ctx.op_name.endswith("argmax") else "ArgMin"
    index = ctx.op(op_type, [data], axis=int(axis), keepdims=int(bool(ctx.params.keepdims)))
    return ctx.cast(index, ctx.out_dtypes[0])  # MXNet returns indices as floats


@converts("dot", "_np_dot")
def dot(ctx: NodeContext) -> str:
    lhs, rhs = ctx.inputs[:2]
    lhs_rank, rhs_rank = ctx.rank(0), ctx.rank(1)
    if ctx.op_name == "_np_dot" and rhs_rank > 2:
        raise ctx.fail("NumPy dot with a right operand of more than 2 dimensions is not "
                       "supported")
    if (ctx.params.get("transpose_a") and lhs_rank != 2) or (
            ctx.params.get("transpose_b") and rhs_rank != 2):
        raise ctx.fail("transpose_a/transpose_b are supported for 2-D operands only")
    if ctx.params.get("transpose_a"):
        lhs = ctx.op("Transpose", [lhs], perm=[1, 0])
    if ctx.params.get("transpose_b"):
        rhs = ctx.op("Transpose", [rhs], perm=[1, 0])
    if rhs_rank <= 2:  # MatMul contracts lhs's last axis with rhs's first, like dot
        return _vector_if_scalar(ctx, ctx.op("MatMul", [lhs, rhs]))
    # dot contracts with rhs's first axis: flatten rhs to 2-D, multiply, restore the shape.
    flat = ctx.op("Reshape", [rhs, ctx.ints([ctx.static_dim(1, 0), -1])])
    return ctx.op("Reshape", [ctx.op("MatMul", [lhs, flat]), ctx.out_shape_tensor(0, True)])


@converts("batch_dot")
def batch_dot(ctx: NodeContext) -> str:
    operands = []
    for index, transposed in enumerate((ctx.params.transpose_a, ctx.params.transpose_b)):
        operand = ctx.inputs[index]
        if transposed:
            perm = list(range(ctx.rank(index)))
            perm[-2:] = perm[-1], perm[-2]
            operand = ctx.op("Transpose", [operand], perm=perm)
        operands.append(operand)
    return ctx.op("MatMul", operands)


@converts("where")
def where(ctx: NodeContext) -> str:
    condition = ctx.op("Cast", [ctx.inputs[0]], to=9)  # BOOL
    if ctx.rank(0) == 1 and ctx.rank(1) > 1:  # MXNet: a 1-D condition picks whole rows
        condition = ctx.unsqueeze(condition, list(range(1, ctx.rank(1))))
    return ctx.op("Where", [condition, ctx.inputs[1], ctx.inputs[2]])
