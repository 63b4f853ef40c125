"""Random graphs from the registry: every optimisation agrees with the reference interpreter."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.graph.ir import Entry, Graph, make_node
from engine.runtime.model import Model

UNARY = ["relu", "tanh", "sigmoid", "abs", "negative", "square", "_copy", "BlockGrad",
         "_contrib_div_sqrt_dim", "_contrib_arange_like"]
SCALAR = [("_mul_scalar", "0.5"), ("_plus_scalar", "1"), ("_rminus_scalar", "2"),
          ("_maximum_scalar", "0")]
BINARY = ["elemwise_add", "elemwise_mul", "elemwise_sub", "_maximum", "broadcast_add",
          "reshape_like"]  # reshape_like of equal shapes: a view op between real ones
SHAPE = (2, 3, 4)


@st.composite
def random_graphs(draw: st.DrawFn) -> tuple[Graph, dict[str, np.ndarray]]:
    """Elementwise chains, branches, reshapes, concats and constant subgraphs."""
    nodes = [make_node("null", "data"), make_node("null", "weight")]
    values = [(Entry(0), SHAPE), (Entry(1), SHAPE)]
    for step in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["unary", "scalar", "binary", "reshape", "concat"]))
        index = draw(st.integers(0, len(values) - 1))
        entry, shape = values[index]
        name = f"n{step}"
        if kind == "unary":
            node = make_node(draw(st.sampled_from(UNARY)), name, {}, (entry,))
        elif kind == "scalar":
            op, scalar = draw(st.sampled_from(SCALAR))
            node = make_node(op, name, {"scalar": scalar}, (entry,))
        elif kind == "binary":
            partners = [value for value in values if value[1] == shape]
            other, _ = draw(st.sampled_from(partners))
            node = make_node(draw(st.sampled_from(BINARY)), name, {}, (entry, other))
        elif kind == "reshape":
            target = "(0, -1)" if len(shape) == 3 else "(0, 3, 4)"
            node = make_node("Reshape", name, {"shape": target}, (entry,))
            shape = (shape[0], 12) if len(shape) == 3 else (shape[0], 3, 4)
        else:
            partners = [value for value in values if value[1] == shape]
            other, _ = draw(st.sampled_from(partners))
            node = make_node("Concat", name, {"num_args": "2", "dim": "0"}, (entry, other))
            shape = (shape[0] * 2, *shape[1:])
        nodes.append(node)
        values.append((Entry(len(nodes) - 1), shape))
    heads = draw(st.lists(st.sampled_from(values[2:] or values), min_size=1, max_size=2))
    graph = Graph(tuple(nodes), tuple(entry for entry, _ in heads))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return graph, {"weight": rng.normal(size=SHAPE).astype(np.float32)}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.integers(0, 2**16))
def test_optimized_matches_reference(case: tuple[Graph, dict], seed: int) -> None:
    graph, params = case
    data = np.random.default_rng(seed).normal(size=SHAPE).astype(np.float32)
    original = data.copy()
    reference = Model(graph, params, optimize=False).infer({"data": data})
    for optimize in (True, ["fuse_elementwise"], ["fold_constants", "plan_memory"]):
        model = Model(graph, params, optimize=optimize)
        for _ in range(2):  # a second run reuses the plan's buffers
            outputs = model.infer({"data": data})
            for name, expected in reference.items():
                np.testing.assert_allclose(outputs[name], expected, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} with optimize={optimize}")
        np.testing.assert_array_equal(data, original)  # inputs are never written
