"""Ops MXNet 1.9.1 cannot run in a CPU graph (fft, ifft, count_sketch are GPU-only there,
_square_sum needs row-sparse storage, the legacy NDArray functions run only imperatively), and
float64 special functions: through the GPU path on the CuPy stand-in, against the CPU engine,
captured as CUDA graphs (except _npx_constraint_check, which raises from the host)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
import engine.cuda.executor as executor_module
from tests.engine.gpu import fake_cupy
from tests.engine.gpu.test_simulated_gpu import assert_captured_unless_blocked

RNG = np.random.default_rng(29)


def one_node(op: str, inputs: dict[str, np.ndarray], attrs: dict[str, str]) -> dict[str, Any]:
    """A one-node symbol document holding ``op`` over a variable per input, every output."""
    nodes: list[dict[str, Any]] = [{"op": "null", "name": name, "inputs": []} for name in inputs]
    nodes.append({"op": op, "name": "op", "attrs": attrs,
                  "inputs": [[k, 0, 0] for k in range(len(inputs))]})
    outputs = engine.ops.get_op(op).num_outputs(engine.ops.get_op(op).parse_attrs(attrs))
    return {"nodes": nodes, "arg_nodes": list(range(len(inputs))),
            "heads": [[len(inputs), k, 0] for k in range(outputs)]}


CASES = {
    "fft": ("_contrib_fft", {"data": RNG.normal(size=(3, 16)).astype(np.float32)}, {}),
    "ifft": ("_contrib_ifft", {"data": RNG.normal(size=(2, 3, 4, 10)).astype(np.float32)}, {}),
    "count_sketch": ("_contrib_count_sketch",
                     {"data": RNG.normal(size=(4, 6)).astype(np.float32),
                      "h": np.array([[0, 2, 2, 1, 4, 3]], np.float32),
                      "s": np.array([[1, -1, 1, -1, 1, 1]], np.float32)}, {"out_dim": "5"}),
    "square_sum": ("_square_sum", {"data": RNG.normal(size=(3, 4, 5)).astype(np.float32)},
                   {"axis": "(0, 2)", "keepdims": "True"}),
    "onehot": ("_onehot_encode", {"lhs": np.array([2, 0, 3], np.float32),
                                  "rhs": np.zeros((3, 4), np.float32)}, {}),
    "fill_element_0index": ("fill_element_0index",
                            {"lhs": RNG.normal(size=(3, 4)).astype(np.float32),
                             "mhs": np.array([5, 6, 7], np.float32),
                             "rhs": np.array([1, 3, 0], np.float32)}, {}),
    "gammaln": ("gammaln", {"data": RNG.uniform(-5, 30, (4, 6)).astype(np.float32)}, {}),
    "erfinv": ("erfinv", {"data": RNG.uniform(-1, 1, (4, 6)).astype(np.float32)}, {}),
    "pdf_dirichlet": ("random_pdf_dirichlet",
                      {"sample": RNG.dirichlet(np.ones(3), (2, 4)).astype(np.float32),
                       "alpha": RNG.uniform(0.5, 2, (2, 3)).astype(np.float32)}, {}),
    "constraint_check": ("_npx_constraint_check", {"input": np.ones((2, 2), bool)}, {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_path_matches_the_cpu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    op, feed, attrs = CASES[name]
    symbol = one_node(op, feed, attrs)
    expected = list(engine.load_model(symbol, device="cpu").infer(feed).values())
    fake_cupy.install(monkeypatch)
    model = engine.load_model(symbol, device="gpu")
    for _ in range(executor_module.WARMUP_RUNS + 2):  # warm-up, capture, replays
        outputs = list(model.infer(feed).values())
    for actual, reference in zip(outputs, expected, strict=True):
        assert type(actual) is np.ndarray and actual.dtype == reference.dtype
        np.testing.assert_allclose(actual, reference, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert_captured_unless_blocked(model.plan_for(feed))
