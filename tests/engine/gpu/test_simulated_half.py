"""``precision="fp16"`` on the GPU path, on the CPU: fake CuPy, fake cuBLAS, fake cuDNN frontend.

What is checked here is the plumbing: the plan's graph in half between float32 inputs and
outputs, half buffers, cuDNN graphs with half tensors and float compute, cuBLAS GemmEx type codes
with float32 accumulation, generated kernels with half parameters, the casts inside the captured
CUDA graph; and the results against fp32 on a small CNN. The stand-ins compute with NumPy (the
convolution in float64, stored in half), so how fast and how exactly a real GPU's tensor cores
do it is left to the ``gpu`` tests and `bench/gpu.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
import engine.cuda.executor as executor_module
from bench import nets
from engine import sym
from engine.cuda import blas, fused
from engine.cuda.half import half_graph
from engine.device import get_device
from engine.graph.ir import Entry, Graph, make_node
from tests.conformance.fixtures import assert_close
from tests.engine.gpu import fake_cudnn

RUNS = executor_module.WARMUP_RUNS + 2
HALF, SINGLE = 2, 0  # cuBLAS's CUDA_R_16F and CUDA_R_32F
COMPUTE_32F = 68


def small_cnn(classes: int = 10) -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """Convolutions with BatchNorm (folded by the optimiser) and ReLU, a residual sum, a
    strided convolution, pooling, a dense layer and a softmax."""
    data = sym.var("data")

    def conv_bn(net: sym.Symbol, filters: int, name: str, stride: int = 1) -> sym.Symbol:
        net = sym.Convolution(net, num_filter=filters, kernel=(3, 3), pad=(1, 1),
                              stride=(stride, stride), no_bias=True, name=f"{name}_conv")
        return sym.BatchNorm(net, fix_gamma=False, name=f"{name}_bn")

    stem = sym.Activation(conv_bn(data, 16, "c1"), act_type="relu")
    branch = conv_bn(sym.Activation(conv_bn(stem, 16, "c2"), act_type="relu"), 16, "c3")
    net = sym.Activation(branch + stem, act_type="relu")
    net = sym.Activation(conv_bn(net, 32, "c4", stride=2), act_type="relu")
    net = sym.Pooling(net, kernel=(2, 2), stride=(2, 2), pool_type="avg")
    net = sym.FullyConnected(sym.Flatten(net), num_hidden=classes, name="fc")
    net = sym.softmax(net)
    params = nets.random_params(net, (1, 3, 16, 16), seed=4)
    for name, value in params.items():  # running variances must be positive
        if name.endswith("moving_var"):
            params[name] = np.abs(value) + 0.5
    return net, params


def outputs_after_capture(model: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The first output of the last of RUNS calls: eager runs, the capture, then replays."""
    for _ in range(RUNS):  # eager runs, the capture, then replays
        output = list(model.infer(feed).values())[0]
    return output


def test_an_fp16_plan_runs_in_half_between_float32_inputs_and_outputs(
        fake_cudnn_gpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    original_build = fake_cudnn.Graph.build

    def build(graph: Any, heuristics: list[str]) -> None:
        built.append(graph)
        original_build(graph, heuristics)

    monkeypatch.setattr(fake_cudnn.Graph, "build", build)
    symbol, params = small_cnn()
    feed = {"data": np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)}
    model = engine.load_model(symbol, params, device="gpu", precision="fp16")
    assert model.precision == "fp16"
    output = outputs_after_capture(model, feed)
    assert output.dtype == np.float32  # the declared dtype
    plan = model.plan_for(feed)
    stats = plan.execution_stats()
    assert stats["cuda_graph"] is True, stats["cuda_graph_error"]  # the casts are captured too

    # The input buffer stays float32; the first step casts it, the last casts the output back.
    assert plan._inputs["data"].dtype == np.float32
    assert (plan.steps[0].node.op, plan.steps[-1].node.op) == ("Cast", "Cast")
    assert plan.steps[0].node.params.dtype == np.float16
    assert plan.steps[-1].node.params.dtype == np.float32
    assert plan._heads[0].dtype == np.float32
    # Two more around the 2×2 average pooling, which sums its windows in float32.
    casts = [step.node for step in plan.steps if step.node.op == "Cast"]
    assert [node.params.dtype for node in casts] == [np.float16, np.float32, np.float16,
                                                     np.float32]
    # Every parameter is half (BatchNorm folded into the convolutions first, in float32).
    assert {np.asarray(v).dtype for v in plan.graph.constants.values()} == {np.dtype(np.float16)}
    assert "BatchNorm" not in {node.op for node in plan.graph.nodes}

    # cuDNN: half tensors, float intermediates and compute; no TF32 note excluded for half.
    assert stats["cudnn_convolutions"] == 4 and len(built) == 4
    for graph in built:
        assert graph.io_data_type == "HALF"
        assert (graph.intermediate_data_type, graph.compute_data_type) == ("FLOAT", "FLOAT")
        assert graph.conv["compute_data_type"] == "FLOAT"
        assert graph.conv["image"].data_type == graph.conv["weight"].data_type == "HALF"
        assert graph.excluded_notes == []

    # cuBLAS: the dense layer as GemmEx on half operands, float32 accumulation.
    cublas = blas._libraries[id(fake_cudnn_gpu)]
    assert cublas.types and set(cublas.types) == {(HALF, HALF, HALF, COMPUTE_32F)}

    # The generated elementwise kernels store half (and compute in float, `codegen`).
    keys = list(fused._KERNELS)
    assert keys and all(key[1] == np.dtype(np.float16).str for key in keys)
    for key in keys:
        assert all(dtype == np.dtype(np.float16).str for dtype in key[2])


def test_fp16_agrees_with_fp32_on_a_small_cnn(fake_cudnn_gpu: Any) -> None:
    """Probabilities within 1e-2 of fp32's (about ten half ulps at 1) and the same class on
    at least 99% of 128 inputs."""
    symbol, params = small_cnn()
    rng = np.random.default_rng(1)
    feed = {"data": rng.standard_normal((128, 3, 16, 16)).astype(np.float32)}
    single = engine.load_model(symbol, params, device="gpu")
    half = engine.load_model(symbol, params, device="gpu", precision="fp16")
    want, got = outputs_after_capture(single, feed), outputs_after_capture(half, feed)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2)
    agreement = float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))
    assert agreement >= 0.99, agreement
    cpu = engine.load_model(symbol, params).infer(feed)
    np.testing.assert_allclose(want, list(cpu.values())[0], rtol=1e-4, atol=1e-5)


def test_plans_of_one_model_convert_each_parameter_once(fake_cudnn_gpu: Any) -> None:
    symbol, params = small_cnn()
    model = engine.load_model(symbol, params, device="gpu", precision="fp16")
    first = {"data": np.zeros((1, 3, 16, 16), np.float32)}
    second = {"data": np.zeros((3, 3, 16, 16), np.float32)}
    model.infer(first), model.infer(second)
    constants = [model.plan_for(feed).graph.constants for feed in (first, second)]
    assert constants[0].keys() == constants[1].keys()
    for name in constants[0]:
        assert constants[0][name] is constants[1][name]


def test_an_fp32_only_op_runs_in_fp32_with_casts_around_it() -> None:
    """cuSOLVER has no half types: ``_linalg_inverse`` keeps float32 operands, and a parameter
    only it reads is not converted."""
    nodes = (make_node("null", "data"), make_node("null", "weight"),
             make_node("FullyConnected", "fc", {"num_hidden": "4", "no_bias": "True"},
                       (Entry(0), Entry(1))),
             make_node("Reshape", "square", {"shape": "(-1, 2, 2)"}, (Entry(2),)),
             make_node("_linalg_inverse", "inverse", {}, (Entry(3),)),
             make_node("null", "offset"),
             make_node("broadcast_add", "shifted", {}, (Entry(4), Entry(5))),
             make_node("null", "lonely"),
             make_node("_linalg_det", "det", {}, (Entry(7),)))
    graph = Graph(nodes, (Entry(6), Entry(8)), constants={
        "weight": np.ones((4, 3), np.float32), "offset": np.ones((1, 2, 2), np.float32),
        "lonely": np.eye(2, dtype=np.float32)})
    half = half_graph(graph, {"data": np.float32}, "fp16")
    by_name = {node.name: node for node in half.nodes}
    assert half.constants["weight"].dtype == np.float16
    assert half.constants["offset"].dtype == np.float16
    assert half.constants["lonely"].dtype == np.float32  # read by float32 ops only
    inverse_input = half.nodes[by_name["inverse"].inputs[0].node]
    assert inverse_input.op == "Cast" and inverse_input.params.dtype == np.float32
    after = half.nodes[by_name["shifted"].inputs[0].node]  # the inverse continues in half
    assert after.op == "Cast" and after.params.dtype == np.float16
    assert half.nodes[by_name["det"].inputs[0].node].name == "lonely"
    first, second = (half.nodes[entry.node] for entry in half.heads)
    assert first.op == "Cast" and first.params.dtype == np.float32
    assert second.name == "det"  # already float32: no cast


def test_an_fp16_model_runs_an_fp32_only_op_on_the_stand_in(fake_cudnn_gpu: Any) -> None:
    data = sym.var("data")
    net = sym.FullyConnected(data, num_hidden=4, no_bias=True, name="fc")
    net = sym._linalg_inverse(sym.broadcast_add(sym.reshape(net, shape=(-1, 2, 2)),
                                                sym.var("shift")))
    params = {"fc_weight": np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32),
              "shift": 3 * np.eye(2, dtype=np.float32)[None]}
    feed = {"data": np.random.default_rng(3).standard_normal((5, 3)).astype(np.float32) * 0.3}
    want = engine.load_model(net, params).infer(feed)
    got = engine.load_model(net, params, device="gpu", precision="fp16").infer(feed)
    (name, value), = got.items()
    assert value.dtype == np.float32
    np.testing.assert_allclose(value, want[name], rtol=1e-2, atol=1e-2)


def test_fp16_without_cudnn_runs_the_gemm_fallback_in_half(fake_cudnn_gpu: Any) -> None:
    symbol, params = small_cnn()
    feed = {"data": np.random.default_rng(6).standard_normal((8, 3, 16, 16)).astype(np.float32)}
    want = list(engine.load_model(symbol, params).infer(feed).values())[0]
    model = engine.load_model(symbol, params, device=get_device("gpu", cudnn=False),
                              precision="fp16")
    got = outputs_after_capture(model, feed)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2)
    assert model.plan_for(feed).execution_stats()["cuda_graph"] is True
    cublas = blas._libraries[id(fake_cudnn_gpu)]
    assert set(cublas.types) == {(HALF, HALF, HALF, COMPUTE_32F)}  # im2col GEMMs and dense


def test_a_model_exported_in_mixed_precision_runs_in_fp16(fake_cudnn_gpu: Any) -> None:
    """MXNet's float16 CNN (half convolution weights, float32 BatchNorm statistics and input):
    the float32 parameters are converted too, and the output matches MXNet's float32 run."""
    folder = Path(__file__).parents[2] / "fixtures" / "mxnet" / "params"
    model = engine.load_model(folder / "cnn_fp16-symbol.json", folder / "cnn_fp16-0000.params",
                              device="gpu", precision="fp16")
    with np.load(folder / "cnn_fp16_io.npz") as data:
        feed, reference = {"data": data["data"]}, data["out0_float32_reference"]
    got = outputs_after_capture(model, feed)
    assert_close(got, reference, {"rtol": 1e-2, "atol": 1e-2}, "cnn_fp16 in fp16")
    constants = model.plan_for(feed).graph.constants.values()
    assert {np.asarray(value).dtype for value in constants} == {np.dtype(np.float16)}


def test_a_windowed_average_pooling_sums_in_float32_and_a_global_one_in_half() -> None:
    nodes = (make_node("null", "data"),
             make_node("Pooling", "window", {"kernel": "(3, 3)", "pool_type": "avg"},
                       (Entry(0),)),
             make_node("Pooling", "window_max", {"kernel": "(3, 3)", "pool_type": "max"},
                       (Entry(1),)),
             make_node("Pooling", "everything", {"global_pool": "True", "pool_type": "avg",
                                                 "kernel": "(1, 1)"}, (Entry(2),)))
    half = half_graph(Graph(nodes, (Entry(3),)), {"data": np.float32}, "fp16")
    by_name = {node.name: node for node in half.nodes}
    reads = {name: half.nodes[by_name[name].inputs[0].node] for name in
             ("window", "window_max", "everything")}
    assert reads["window"].name == "data"  # the float32 input, not its half cast
    cast = reads["window_max"]
    assert cast.op == "Cast" and cast.params.dtype == np.float16
    assert reads["everything"].name == "window_max"
