"""Fused-kernel code generation, checked on the CPU: literals, source, cache keys, numerics.

The generated kernel body is executed statement by statement with numpy (`cexpr`) and compared
with the CPU's `_fused_elementwise` kernel on the same chain, for every elementwise registry op.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from engine.cuda.codegen import (
    DOUBLE_INF,
    FLOAT_INF,
    FLOAT_NAN,
    FusedSource,
    c_literal,
    compute_type,
    fused_source,
)
from engine.errors import EngineError, ModelFormatError
from engine.ops.internal.fused import FUSED_ELEMENTWISE, FusedStep
from engine.ops.registry import Attrs, OpDef, all_ops, get_op
from engine.ops.shapes import same_shape
from tests.engine.gpu.cexpr import evaluate

RNG = np.random.default_rng(11)
C_DTYPES = {"float": np.float32, "double": np.float64, "int": np.int32, "bool": np.bool_}
SPECIAL_ATTRS: dict[str, list[dict[str, str]]] = {
    "Activation": [{"act_type": kind} for kind in
                   ("relu", "sigmoid", "tanh", "softrelu", "softsign", "log_sigmoid", "mish")],
    "clip": [{"a_min": "-0.5", "a_max": "0.8"}, {"a_min": "-inf", "a_max": "inf"}],
}


def step(name: str, position: int = 0, **attrs: str) -> FusedStep:
    op = get_op(name)
    parsed = op.parse_attrs(attrs)
    return FusedStep(op, parsed, position, len(op.input_names(parsed)))


def run_generated(source: FusedSource, y: np.ndarray, extras: list[np.ndarray]) -> np.ndarray:
    """Execute the kernel body: the declaration line, one block per step, the store."""
    lines = source.operation.splitlines()
    declared = re.fullmatch(r"(.+) v = \(\1\)y;", lines[0])
    assert declared, lines[0]
    ctype = C_DTYPES[declared.group(1)]
    assert lines[-1] == "y = (Y)v;"
    value = y.astype(ctype)
    for line in lines[1:-1]:
        block = re.fullmatch(r"\{ (.*); v = \((.+?)\)\(Y\)\((.*)\); \}", line)
        assert block, line
        names = {}
        for binding in block.group(1).split("; "):
            name, source_text = re.fullmatch(r"const .+? (\w) = (.*)", binding).groups()
            operand = re.fullmatch(r"\(.+\)e(\d+)", source_text)
            names[name] = value if source_text == "v" else extras[int(operand.group(1))].astype(
                ctype)
        result = np.broadcast_to(evaluate(block.group(3), names), y.shape)
        value = result.astype(y.dtype).astype(ctype)
    return value.astype(y.dtype)


def run_cpu(head: FusedStep, steps: tuple[FusedStep, ...], inputs: list[np.ndarray]) -> Any:
    attrs = Attrs({"head": head, "steps": steps})
    out = np.empty_like(inputs[0])
    with np.errstate(all="ignore"):
        return FUSED_ELEMENTWISE.kernel(np, attrs, *inputs, out=out)


def check_chain(head: FusedStep, steps: tuple[FusedStep, ...], inputs: list[np.ndarray],
                what: str) -> None:
    expected = run_cpu(head, steps, inputs)
    extras = inputs[head.arity:]
    y = np.empty_like(inputs[0])
    with np.errstate(all="ignore"):
        y[...] = head.op.compute(np, head.attrs, inputs[:head.arity])[0]
    source = fused_source(steps, y.dtype, [extra.dtype for extra in extras])
    actual = run_generated(source, y, extras)
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if y.dtype == np.float16 else \
        {"rtol": 2e-5, "atol": 1e-6}
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                               equal_nan=True, err_msg=f"{what}\n{source.operation}",
                               **tolerance)


def fusable_steps() -> list[tuple[str, FusedStep]]:
    """Every registry op the fusion pass could put in a chain, with each input position."""
    cases, seen = [], set()
    for op in sorted({id(op): op for op in all_ops().values()}.values(), key=lambda o: o.name):
        if op.elementwise is None or op.name in seen:
            continue
        seen.add(op.name)
        for raw in SPECIAL_ATTRS.get(op.name, [{"scalar": "0.7"}] if _has(op, "scalar")
                                     else [{}]):
            attrs = op.parse_attrs(raw)
            arity = len(op.input_names(attrs))
            if op.expression(attrs) is None or (arity > 1 and op.infer_shape is not same_shape):
                continue
            if op.infer_dtype(attrs, [np.dtype(np.float32)] * arity)[1][0] != np.float32:
                continue  # bool-valued ops never share a float chain's buffer
            for position in range(arity):
                label = f"{op.name}{raw or ''}@{position}"
                cases.append((label, FusedStep(op, attrs, position, arity)))
    return cases


def _has(op: OpDef, name: str) -> bool:
    return any(param.name == name for param in op.params)


FUSABLE = fusable_steps()


def test_registry_has_many_fusable_ops() -> None:
    names = {label.split("{")[0].split("@")[0] for label, _ in FUSABLE}
    assert {"relu", "Activation", "elemwise_add", "_mul_scalar", "clip", "sigmoid"} <= names
    assert len(names) > 60


@pytest.mark.parametrize("label,fused", FUSABLE, ids=[label for label, _ in FUSABLE])
def test_generated_step_matches_cpu_kernel(label: str, fused: FusedStep) -> None:
    head = step("_copy")
    x = RNG.uniform(-3, 3, (4, 33)).astype(np.float32)
    extras = [RNG.uniform(-3, 3, x.shape).astype(np.float32) for _ in range(fused.arity - 1)]
    check_chain(head, (fused,), [x, *extras], label)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_long_chain_with_binary_steps_and_positions(dtype: Any) -> None:
    head = step("elemwise_add")
    steps = (step("_mul_scalar", scalar="0.5"), step("Activation", act_type="tanh"),
             step("elemwise_sub", position=1), step("_rdiv_scalar", scalar="-2"),
             step("clip", a_min="-3", a_max="1e3"), step("elemwise_mul", position=0),
             step("_maximum_scalar", scalar="-inf"), step("relu"))
    inputs = [RNG.uniform(-2, 2, (3, 5, 7)).astype(dtype) for _ in range(4)]
    check_chain(head, steps, inputs, f"chain {np.dtype(dtype).name}")


@pytest.mark.parametrize("name,scalar", [("_plus_scalar", "nan"), ("_minimum_scalar", "-inf"),
                                         ("_maximum_scalar", "inf"), ("_mul_scalar", "-inf"),
                                         ("_minimum_scalar", "inf")])
def test_inf_and_nan_scalars_become_valid_literals(name: str, scalar: str) -> None:
    fused = step(name, scalar=scalar)
    source = fused_source((fused,), np.float32, [])
    assert "inf" not in source.operation.replace("_inf", "") and "nan" not in source.operation
    x = np.array([[-1.0, 0.0, 2.5, np.inf, -np.inf]], np.float32)
    check_chain(step("_copy"), (fused,), [x], f"{name}({scalar})")


def test_literals() -> None:
    assert c_literal(0.5, "float") == "0.5f"
    assert c_literal(0.1, "float") == f"{float(np.float32(0.1))!r}f"
    assert c_literal(-2.0, "float") == "(-2.0f)"
    assert c_literal(-2.0, "double") == "(-2.0)"
    assert c_literal(1e-30, "double") == "1e-30"
    assert c_literal(float("inf"), "float") == FLOAT_INF
    assert c_literal(float("-inf"), "double") == f"(-{DOUBLE_INF})"
    assert c_literal(float("nan"), "float") == FLOAT_NAN
    assert c_literal(True, "float") == "1" and c_literal(False, "int") == "0"
    assert c_literal(-3, "int") == "(-3)" and c_literal(np.int64(4), "float") == "4"
    with pytest.raises(EngineError, match="cannot write attribute value 'relu'"):
        c_literal("relu", "float")


def test_negative_literal_after_minus_stays_one_token() -> None:
    source = fused_source((step("_minus_scalar", scalar="-1.5"),), np.float32, [])
    assert "(a - (-1.5f))" in source.operation
    x = np.array([[1.0, -1.0]], np.float32)
    check_chain(step("_copy"), (step("_minus_scalar", scalar="-1.5"),), [x], "minus negative")


def test_source_shape_and_parameters() -> None:
    source = fused_source((step("elemwise_add", position=1), step("relu")), np.float32,
                          [np.dtype(np.float16)])
    assert source.in_params == "float16 e0" and source.out_params == "Y y"
    assert source.operation.splitlines() == [
        "float v = (float)y;",
        "{ const float a = (float)e0; const float b = v; v = (float)(Y)((a + b)); }",
        "{ const float a = v; v = (float)(Y)((a > 0 ? a : 0)); }",
        "y = (Y)v;",
    ]
    assert re.fullmatch(r"hybridserve_fused_[0-9a-f]{16}", source.name)
    assert compute_type(np.float16) == "float" and compute_type(np.float64) == "double"


def test_cache_key_follows_expressions_positions_and_dtypes() -> None:
    chain = (step("_mul_scalar", scalar="2"), step("elemwise_add"))
    base = fused_source(chain, np.float32, [np.dtype(np.float32)])
    assert fused_source(chain, np.float32, [np.dtype(np.float32)]) == base
    rebuilt = (step("_mul_scalar", scalar="2.0"), step("elemwise_add"))
    assert fused_source(rebuilt, np.float32, [np.dtype(np.float32)]).key == base.key
    different = [
        fused_source((step("_mul_scalar", scalar="3"), step("elemwise_add")), np.float32,
                     [np.dtype(np.float32)]),
        fused_source((step("_mul_scalar", scalar="2"), step("elemwise_add", position=1)),
                     np.float32, [np.dtype(np.float32)]),
        fused_source(chain, np.float64, [np.dtype(np.float32)]),
        fused_source(chain, np.float32, [np.dtype(np.float16)]),
    ]
    keys = {source.key for source in different} | {base.key}
    names = {source.name for source in different} | {base.name}
    assert len(keys) == 5 and len(names) == 5


def test_errors_name_the_problem() -> None:
    with pytest.raises(EngineError, match="reads 1 extra operand"):
        fused_source((step("elemwise_add"),), np.float32, [])
    with pytest.raises(EngineError, match="do not support dtype complex64"):
        fused_source((step("relu"),), np.complex64, [])
    with pytest.raises(EngineError, match="has no elementwise expression"):
        fused_source((step("Flatten"),), np.float32, [])
    with pytest.raises(ModelFormatError):
        step("clip")
