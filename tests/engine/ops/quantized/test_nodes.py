"""Every node of MXNet's int8 exports, run alone on MXNet's own inputs to it, against the
outputs MXNet computed (oneDNN backend, MXNet 1.9.1).

Integer outputs must agree exactly: the engine repeats MXNet's float32 scale arithmetic and
oneDNN's rounding (ties to even, saturation), so a difference would be a real semantic gap.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tests.engine.ops.quantized import fixtures

QUANTIZED_PREFIXES = ("_contrib_", "_sg_mkldnn_")


def node_cases() -> list[tuple[str, int]]:
    return [(name, index) for name in fixtures.MODELS
            for index, node in enumerate(fixtures.graph(name).nodes)
            if node.op.startswith(QUANTIZED_PREFIXES)]


def node_inputs(name: str, index: int) -> list[np.ndarray]:
    graph = fixtures.graph(name)
    values = []
    for entry in graph.nodes[index].inputs:
        source = graph.nodes[entry.node]
        if source.is_variable:
            values.append(fixtures.params(name).get(source.name, fixtures.io(name)["data"]))
        else:
            values.append(fixtures.internals(name)[f"{source.name}:{entry.index}"])
    return values


def read_only_node_inputs(name: str, index: int) -> list[np.ndarray]:
    """`node_inputs` as read-only views, as a CPU plan binds constant weights."""
    views = [value.view() for value in node_inputs(name, index)]
    for view in views:
        view.flags.writeable = False
    return views


def bound_node(name: str, index: int) -> tuple[tuple[np.ndarray, ...],
                                              tuple[np.ndarray, ...], object]:
    """(what the node's NumPy kernel computes, empty outputs like it, the node's one call
    bound on its read-only inputs into those outputs)."""
    node = fixtures.graph(name).nodes[index]
    inputs = read_only_node_inputs(name, index)
    want = node.opdef.compute(np, node.params, inputs)
    want = want if isinstance(want, tuple) else (want,)
    out = tuple(np.empty_like(value) for value in want)
    (call,) = node.opdef.bind_calls(np, node.params, inputs, out)
    return want, out, call


@pytest.mark.parametrize(("name", "index"), node_cases())
def test_node_matches_mxnet(name: str, index: int) -> None:
    node = fixtures.graph(name).nodes[index]
    outputs = node.opdef.compute(np, node.params, node_inputs(name, index))
    for number, value in enumerate(outputs):
        expected = fixtures.internals(name)[f"{node.name}:{number}"]
        value = np.asarray(value)
        assert value.dtype == expected.dtype, (node.name, number)
        assert value.shape == expected.shape, (node.name, number)
        if np.issubdtype(expected.dtype, np.integer):
            np.testing.assert_array_equal(value, expected, err_msg=node.name)
        else:
            np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7, err_msg=node.name)


def test_the_fixtures_reach_every_exported_kind() -> None:
    """The per-node cases cover the ops and fused variants MXNet's quantize_net writes."""
    kinds = Counter()
    for name, index in node_cases():
        node = fixtures.graph(name).nodes[index]
        flags = tuple(sorted(key for key, value in node.attrs.items()
                             if key.startswith(("with_", "enable_")) and value.lower() == "true"))
        kinds[(node.op, flags)] += 1
    ops = {op for op, _ in kinds}
    assert ops >= {
        "_contrib_quantize_v2", "_contrib_dequantize", "_contrib_quantized_pooling",
        "_contrib_quantized_flatten", "_contrib_quantized_concat",
        "_contrib_quantized_batch_norm", "_contrib_quantized_elemwise_add",
        "_contrib_quantized_embedding", "_sg_mkldnn_conv", "_sg_mkldnn_fully_connected",
        "_sg_mkldnn_selfatt_qk", "_sg_mkldnn_selfatt_valatt", "_contrib_quantized_conv",
        "_contrib_quantized_fully_connected", "_contrib_requantize", "_contrib_quantized_act"}
    conv_flags = {flags for op, flags in kinds if op == "_sg_mkldnn_conv"}
    assert ("with_act", "with_bn") in conv_flags
    assert ("with_bn", "with_postsum_act", "with_sum") in conv_flags
    assert ("with_bn", "with_sum") in conv_flags
    uncalibrated = {node.op for name, index in node_cases()
                    for node in [fixtures.graph(name).nodes[index]]
                    if "min_calib_range" not in node.attrs}
    assert uncalibrated >= {"_contrib_quantize_v2", "_sg_mkldnn_conv",
                            "_sg_mkldnn_fully_connected", "_contrib_requantize"}


def test_a_bound_convolution_prepares_its_int8_weights_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With read-only (constant) weights, as a CPU plan binds them, BatchNorm is folded and the
    weights quantized once; every run still gives MXNet's values."""
    from engine.ops.quantized import fused

    name = "resnet18_v1_naive"
    index = next(index for index, node in enumerate(fixtures.graph(name).nodes)
                 if node.op == "_sg_mkldnn_conv" and node.params.with_sum)
    node = fixtures.graph(name).nodes[index]
    inputs = read_only_node_inputs(name, index)
    expected = [fixtures.internals(name)[f"{node.name}:{k}"] for k in range(3)]
    out = tuple(np.empty_like(value) for value in expected)
    calls = []
    real = fused.weight_scales
    monkeypatch.setattr(fused, "weight_scales", lambda *args: calls.append(1) or real(*args))
    (call,) = node.opdef.bind_calls(np, node.params, inputs, out)
    for _ in range(2):
        call()
        for value, reference in zip(out, expected, strict=True):
            np.testing.assert_array_equal(value, reference)
    assert len(calls) == 1


def fc_cases() -> list[tuple[str, int]]:
    return [(name, index) for name, index in node_cases()
            if fixtures.graph(name).nodes[index].op == "_sg_mkldnn_fully_connected"]


@pytest.mark.parametrize(("name", "index"), fc_cases())
def test_a_bound_fully_connected_layer_gives_its_kernels_bytes_on_the_int8_gemm(
        name: str, index: int) -> None:
    """Bound with read-only weights, as a CPU plan binds them, a fully connected layer runs
    its product on the int8 GEMM's kernel (where the host has one) and writes what its
    NumPy kernel computes, byte for byte, run after run (float, int8/uint8 and int32
    outputs: every kind MXNet exported)."""
    from engine.kernels import gemm_int8
    from engine.ops.quantized import integer

    want, out, call = bound_node(name, index)
    before = integer.PATHS["int8_gemm"]
    for _ in range(2):
        for part in out:
            part[...] = 0
        call()
        for got, expected in zip(out, want, strict=True):
            np.testing.assert_array_equal(got, expected)
    assert integer.PATHS["int8_gemm"] - before == (2 if gemm_int8.available() else 0)


@pytest.mark.parametrize(("name", "index"), fc_cases())
def test_a_bound_fully_connected_layer_at_batch_1_gives_its_kernels_bytes(
        name: str, index: int) -> None:
    """One row (a classifier at batch 1, the one-row tile, the bias added by the GEMM's
    kernel): each row of MXNet's batch on its own gives what the NumPy kernel computes for
    it, byte for byte."""
    node = fixtures.graph(name).nodes[index]
    inputs = read_only_node_inputs(name, index)
    for row in range(len(inputs[0])):
        alone = [inputs[0][row:row + 1], *inputs[1:]]
        want = node.opdef.compute(np, node.params, alone)
        want = want if isinstance(want, tuple) else (want,)
        out = tuple(np.empty_like(value) for value in want)
        (call,) = node.opdef.bind_calls(np, node.params, alone, out)
        call()
        for got, expected in zip(out, want, strict=True):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("name", "index"), fc_cases())
def test_a_bound_fully_connected_layers_product_is_a_pool_job_over_the_cores(
        monkeypatch: pytest.MonkeyPatch, name: str, index: int) -> None:
    """Its product is `gemm_int8.product_job`'s job (bound once, at the first run), and on
    two threads it writes its NumPy kernel's bytes too."""
    from engine.cpu import spin_pool
    from engine.kernels import gemm_int8

    if not (gemm_int8.available() and spin_pool.available()):
        pytest.skip("needs AVX-512 VNNI and the spin pool")
    jobs = []
    real = gemm_int8.product_job
    monkeypatch.setattr(gemm_int8, "product_job",
                        lambda *args, **kwargs: jobs.append(real(*args, **kwargs)) or jobs[-1])
    want, out, call = bound_node(name, index)
    for threads in (1, 2, 2):
        for part in out:
            part[...] = 0
        with spin_pool.armed(threads):
            call()
        for got, expected in zip(out, want, strict=True):
            np.testing.assert_array_equal(got, expected)
    assert len(jobs) == 1
