"""Random graphs drawn from the registry: every optimisation agrees with the reference interpreter.

The ops are found by probing the registry, not listed by hand: every registered op is tried with
its default attributes (or those in `ATTRS`, for ops that have required ones) on float32 inputs
of `SHAPE`, and drawn when its shape and dtype inference match what its kernel computes and two
runs agree. Ops that need other inputs (index arrays, boxes, 4-D images, square matrices,
subgraphs...) fail the probe and are left out with the probe's error as the reason; `EXCLUDED`
names the few that pass it but must not be drawn. Graphs mix those ops with elementwise chains,
reshapes, concatenations, multi-output nodes and constant subgraphs (ops on the ``weight``
parameter), so folding, fusion and memory planning all meet them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ExecutionError
from engine.graph.ir import Entry, Graph, Node, make_node
from engine.ops.registry import REQUIRED, OpDef, all_ops
from engine.runtime.model import Model

SHAPE = (2, 3, 4)
FLOAT32 = np.dtype(np.float32)
OPTIMISATIONS: tuple[Any, ...] = (True, ["fuse_elementwise"], ["fold_constants", "plan_memory"])

# Attributes for ops whose schema has required ones, chosen to fit `SHAPE` inputs.
ATTRS: dict[str, dict[str, str]] = {
    "Activation": {"act_type": "softrelu"},
    "Cast": {"dtype": "float32"},
    "amp_cast": {"dtype": "float32"},
    "Concat": {"num_args": "2", "dim": "2"},
    "stack": {"num_args": "2", "axis": "1"},
    "_npi_concatenate": {"num_args": "2", "axis": "1"},
    "_npi_hstack": {"num_args": "2"},
    "_npi_vstack": {"num_args": "2"},
    "_npi_dstack": {"num_args": "2"},
    "add_n": {"num_args": "2"},
    "_npi_einsum": {"num_args": "2", "subscripts": "ijk,ijl->ikl"},
    "clip": {"a_min": "-0.5", "a_max": "0.75"},
    "expand_dims": {"axis": "1"},
    "repeat": {"repeats": "2", "axis": "1"},
    "tile": {"reps": "(1, 2)"},
    "reverse": {"axis": "1"},
    "_npi_flip": {"axis": "(0, 2)"},
    "slice": {"begin": "(0, 1)", "end": "(2, 3)"},
    "slice_axis": {"axis": "2", "begin": "1", "end": "3"},
    "SliceChannel": {"num_outputs": "2", "axis": "0"},
    "_split_v2": {"indices": "(1, 3)", "axis": "2"},
    "_npi_hsplit": {"indices": "(2,)", "axis": "1"},
    "_npi_dsplit": {"indices": "(1,)", "axis": "2"},
    "_np_reshape": {"newshape": "(4, 6)"},
    "_npx_reshape": {"newshape": "(-2, -1)"},
    "_np_moveaxis": {"source": "0", "destination": "2"},
    "_np_roll": {"shift": "2", "axis": "1"},
    "smooth_l1": {"scalar": "1.5"},
    "one_hot": {"depth": "3"},
    "_npi_tensordot_int_axes": {"axes": "0"},
    "_npi_tensordot": {"a_axes_summed": "(0, 1)", "b_axes_summed": "(0, 1)"},
    "_npi_pad": {"pad_width": "((0, 1), (1, 1), (2, 0))", "mode": "reflect"},
    "_npi_percentile": {"q_scalar": "30", "axis": "1"},
    "_npi_insert_scalar": {"int_ind": "1", "val": "2.5", "axis": "2"},
    "_npi_insert_slice": {"start": "0", "stop": "4", "step": "2", "val": "-1", "axis": "2"},
}

# Ops that pass the probe but are not drawn.
EXCLUDED: dict[str, str] = {
    "Dropout": "draws a new mask on every run in mode='always' (identity by default: no news)",
}


@dataclass(frozen=True)
class Drawable:
    """A registry op that runs on `SHAPE` inputs: its attributes and outputs."""

    name: str
    attrs: dict[str, str]
    arity: int
    outputs: tuple[tuple[tuple[int, ...], np.dtype], ...]
    elementwise: bool


def probe(op: OpDef, raw: dict[str, str]) -> Drawable | str:
    """The op as a `Drawable`, or why it cannot be drawn on float32 `SHAPE` inputs."""
    if any(param.default is REQUIRED and param.name not in raw for param in op.params):
        return "required attributes and no entry in ATTRS"
    try:
        attrs = op.parse_attrs(raw)
        arity = len(op.input_names(attrs))
        if arity not in (1, 2):
            return f"takes {arity} inputs"
        inputs = [np.linspace(-1.5, 2.0, np.prod(SHAPE), dtype=FLOAT32).reshape(SHAPE) * (k + 1)
                  for k in range(arity)]
        completed, shapes = op.infer_shape(attrs, [SHAPE] * arity)
        _, dtypes = op.infer_dtype(attrs, [FLOAT32] * arity)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            first = op.compute(np, attrs, [value.copy() for value in inputs])
            second = op.compute(np, attrs, [value.copy() for value in inputs])
    except Exception as error:  # the probe's verdict: the op needs other inputs
        return f"{type(error).__name__}: {error}"
    if any(tuple(shape or ()) != SHAPE for shape in completed):
        return f"wants inputs of shapes {completed} (a label or index input)"
    completing = _completes_otherwise(op, attrs, arity)
    if completing:
        return completing
    computed = [(value.shape, value.dtype) for value in first]
    if computed != [(tuple(shape or ()), np.dtype(dtype)) for shape, dtype in
                    zip(shapes, dtypes)]:
        return f"inference {list(zip(shapes, dtypes))} differs from the kernel's {computed}"
    if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, second)):
        return "nondeterministic (two runs differ)"
    return Drawable(op.name, raw, arity, tuple(computed), op.expression(attrs) is not None)


def _completes_otherwise(op: OpDef, attrs: Any, arity: int) -> str | None:
    """Why the op would give an input of unknown shape a shape other than `SHAPE` (a label
    input: SoftmaxOutput drops its last axis), or None. A graph drawn with ``data`` in that
    place would have the model infer ``data``'s shape from it and refuse the (2, 3, 4) input."""
    for position in range(arity):
        partial: list[tuple[int, ...] | None] = [SHAPE] * arity
        partial[position] = None
        try:
            completed, _ = op.infer_shape(attrs, partial)
        except Exception:  # cannot complete it: the model waits for the input's shape
            continue
        shape = completed[position]  # 0: a dimension still unknown, which any size fits
        if shape and (len(shape) != len(SHAPE)
                      or any(size and size != want for size, want in zip(shape, SHAPE))):
            return f"completes input {position} of unknown shape as {tuple(shape)}"
    return None


@cache
def registry_ops() -> tuple[dict[str, Drawable], dict[str, str]]:
    """(drawable ops by name, every other op's reason), over each registered op once."""
    drawable, reasons = {}, dict(EXCLUDED)
    for op in {op.name: op for op in all_ops().values()}.values():
        if op.name in EXCLUDED:
            continue
        verdict = probe(op, ATTRS.get(op.name, {}))
        if isinstance(verdict, Drawable):
            drawable[op.name] = verdict
        else:
            reasons[op.name] = verdict
    return drawable, reasons


@cache
def _elementwise(arity: int) -> list[str]:
    """Drawable elementwise ops with ``arity`` inputs (fusion can chain them)."""
    return sorted(name for name, op in registry_ops()[0].items()
                  if op.elementwise and op.arity == arity)


Value = tuple[Entry, tuple[int, ...], np.dtype]


@st.composite
def random_graphs(draw: st.DrawFn) -> tuple[Graph, dict[str, np.ndarray]]:
    """Registry ops on `SHAPE` values, elementwise chains on any float value, reshapes, concats
    and constant subgraphs; every output of a multi-output node becomes a value."""
    nodes = [make_node("null", "data"), make_node("null", "weight")]
    values: list[Value] = [(Entry(0), SHAPE, FLOAT32), (Entry(1), SHAPE, FLOAT32)]
    for step in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["registry", "registry", "unary", "binary", "reshape",
                                     "concat"]))
        floats = [value for value in values if value[2] == FLOAT32 and value[1]]
        if kind == "registry":
            node, outputs = _registry_node(draw, f"n{step}", floats)
        else:
            node, outputs = _chain_node(draw, f"n{step}", kind, floats)
        nodes.append(node)
        values += [(Entry(len(nodes) - 1, k), shape, dtype)
                   for k, (shape, dtype) in enumerate(outputs)]
    heads = draw(st.lists(st.sampled_from(values[2:] or values), min_size=1, max_size=3))
    graph = Graph(tuple(nodes), tuple(entry for entry, _, _ in heads))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return graph, {"weight": rng.normal(size=SHAPE).astype(np.float32)}


Outputs = tuple[tuple[tuple[int, ...], np.dtype], ...]


def _registry_node(draw: st.DrawFn, name: str, floats: list[Value]) -> tuple[Node, Outputs]:
    """Any drawable op, its inputs float32 values of `SHAPE` (``data`` and ``weight`` are)."""
    ops = registry_ops()[0]
    op = ops[draw(st.sampled_from(sorted(ops)))]
    full = [value for value in floats if value[1] == SHAPE]
    inputs = tuple(draw(st.sampled_from(full))[0] for _ in range(op.arity))
    return make_node(op.name, name, op.attrs, inputs), op.outputs


def _chain_node(draw: st.DrawFn, name: str, kind: str, floats: list[Value]
                ) -> tuple[Node, Outputs]:
    """An elementwise op (fusion's material), a flattening reshape (a view) or a concat, on
    a float value of any shape."""
    entry, shape, _ = draw(st.sampled_from(floats))
    same = [value[0] for value in floats if value[1] == shape]
    if kind == "reshape":
        return (make_node("Reshape", name, {"shape": "(-1,)"}, (entry,)),
                (((int(np.prod(shape)),), FLOAT32),))
    if kind == "concat":
        node = make_node("Concat", name, {"num_args": "2", "dim": "0"},
                         (entry, draw(st.sampled_from(same))))
        return node, (((shape[0] * 2, *shape[1:]), FLOAT32),)
    arity = 1 if kind == "unary" else 2
    op = registry_ops()[0][draw(st.sampled_from(_elementwise(arity)))]
    operands = (entry,) if arity == 1 else (entry, draw(st.sampled_from(same)))
    # Comparisons give bool in NumPy mode: the probe's dtype, at any shape.
    return make_node(op.name, name, op.attrs, operands), ((shape, op.outputs[0][1]),)


def assert_optimisations_agree(graph: Graph, params: dict[str, np.ndarray],
                               data: np.ndarray) -> None:
    """Each optimisation gives the reference's outputs, twice, and never writes the input; where
    the reference fails (an SVD of NaNs), each optimisation fails the same way or, having
    dropped the failing node as dead, succeeds."""
    original = data.copy()
    with np.errstate(all="ignore"):
        try:
            reference = Model(graph, params, optimize=False).infer({"data": data})
        except ExecutionError as error:
            for optimize in OPTIMISATIONS:
                try:
                    Model(graph, params, optimize=optimize).infer({"data": data})
                except ExecutionError as failure:
                    assert type(failure.__cause__) is type(error.__cause__)
            return
        for optimize in OPTIMISATIONS:
            model = Model(graph, params, optimize=optimize)
            for _ in range(2):  # a second run reuses the plan's buffers
                outputs = model.infer({"data": data})
                for name, expected in reference.items():
                    np.testing.assert_allclose(outputs[name], expected, rtol=1e-5, atol=1e-6,
                                               err_msg=f"{name} with optimize={optimize}")
    np.testing.assert_array_equal(data, original)  # inputs are never written


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.integers(0, 2**16))
def test_optimized_matches_reference(case: tuple[Graph, dict], seed: int) -> None:
    graph, params = case
    data = np.random.default_rng(seed).normal(size=SHAPE).astype(np.float32)
    assert_optimisations_agree(graph, params, data)


@pytest.mark.parametrize("name", sorted(registry_ops()[0]))
def test_each_drawable_op_survives_every_optimisation(name: str) -> None:
    # Every op at least once, whatever hypothesis draws: on the input and (a constant) on the
    # weight, each output read by an elementwise op that fusion can append.
    op = registry_ops()[0][name]
    nodes = [make_node("null", "data"), make_node("null", "weight")]
    for source, label in ((Entry(0), "live"), (Entry(1), "const")):
        nodes.append(make_node(name, label, op.attrs, (source,) * op.arity))
    heads = []
    for node in (2, 3):
        for k, (_, dtype) in enumerate(op.outputs):
            if dtype == FLOAT32:
                nodes.append(make_node("_mul_scalar", f"scale{node}_{k}", {"scalar": "0.5"},
                                       (Entry(node, k),)))
                heads.append(Entry(len(nodes) - 1))
            else:
                heads.append(Entry(node, k))
    weight = np.random.default_rng(1).normal(size=SHAPE).astype(np.float32)
    data = np.random.default_rng(2).normal(size=SHAPE).astype(np.float32)
    assert_optimisations_agree(Graph(tuple(nodes), tuple(heads)), {"weight": weight}, data)


def test_the_generator_draws_from_most_of_the_registry() -> None:
    drawable, reasons = registry_ops()
    assert len(drawable) >= 250, f"only {len(drawable)} ops drawable"
    assert set(ATTRS) <= set(drawable) | set(reasons) and set(EXCLUDED) <= set(reasons)
    assert not set(ATTRS) & {name for name, reason in reasons.items()
                             if reason.startswith("required")}
    assert all(reasons.values())
    # Multi-output and new-op families are among them.
    assert {"SliceChannel", "_npi_svd", "_linalg_gelqf", "_npi_norm", "topk"} <= set(drawable)
