"""``precision="bf16"`` on the GPU path, on the CPU: fake CuPy, fake cuBLAS, fake cuDNN frontend.

bf16 means what it means on the CPU: the Convolution and Dense products' operands rounded to
bf16, float32 sums, everything else float32. Checked here: the conversion kernel's rounding, the
cuBLAS type codes (``CUDA_R_16BF`` operands, a float32 result, float32 compute), the cuDNN
graphs' types, both operands rounded (against float32 products of rounded operands), a
parameter converted once per model, capture, and a small CNN against fp32. The stand-ins sum
in float64, so a GPU's float32 sums are not reproduced.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.cuda import blas
from engine.device import get_device
from engine.kernels import bf16 as host_bf16
from tests.engine.gpu import fake_cudnn, fake_cupy
from tests.engine.gpu.test_simulated_half import outputs_after_capture, small_cnn

BF16, SINGLE, COMPUTE_32F = 14, 0, 68


def _rounded(params: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {name: host_bf16.rounded(value) if name in names else value
            for name, value in params.items()}


def test_the_conversion_kernel_rounds_to_nearest_even_and_keeps_nans(fake_cudnn_gpu: Any) -> None:
    from engine.cuda.bf16 import to_bf16_kernel

    values = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5e-39, np.inf, -np.inf, np.nan,
                       3.4e38], np.float32)
    source = fake_cudnn_gpu.asarray(values)
    bits = fake_cudnn_gpu.empty(values.shape, np.uint16)
    to_bf16_kernel(fake_cudnn_gpu)(source, bits)
    got = host_bf16.widen(bits.get())
    # 1 + 2^-8 is a tie: to even (1.0); 1 + 3·2^-8 is a tie: to even (1 + 2^-6).
    np.testing.assert_array_equal(got[:3], [1.0, 1.0, 1 + 2 ** -6])
    assert got[3] == host_bf16.rounded(values[3:4])[0]
    assert got[4] == np.inf and got[5] == -np.inf and np.isnan(got[6])
    assert got[7] == host_bf16.rounded(values[7:8])[0]


@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn", "gemm"])
def test_a_bf16_convolution_rounds_both_operands_and_sums_in_float32(
        fake_cudnn_gpu: Any, cudnn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    original_build = fake_cudnn.Graph.build

    def build(graph: Any, heuristics: list[str]) -> None:
        built.append(graph)
        original_build(graph, heuristics)

    monkeypatch.setattr(fake_cudnn.Graph, "build", build)
    net = sym.Convolution(sym.var("data"), num_filter=8, kernel=(3, 3), pad=(1, 1), name="c")
    rng = np.random.default_rng(7)
    params = {"c_weight": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
              "c_bias": rng.standard_normal(8).astype(np.float32)}
    data = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    model = engine.load_model(net, params, device=get_device("gpu", cudnn=cudnn),
                              precision="bf16")
    got = outputs_after_capture(model, {"data": data})
    # The same convolution in float32 on operands rounded to bf16 (the bias is not rounded).
    want = list(engine.load_model(net, _rounded(params, ("c_weight",))).infer(
        {"data": host_bf16.rounded(data)}).values())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.dtype == np.float32
    stats = model.plan_for({"data": data}).execution_stats()
    assert stats["cuda_graph"] is True, stats["cuda_graph_error"]
    if cudnn:
        assert stats["cudnn_convolutions"] == 1 and len(built) == 1
        graph = built[0]
        assert graph.conv["image"].data_type == graph.conv["weight"].data_type == "BFLOAT16"
        assert graph.bias_tensor.data_type == "FLOAT"
        assert (graph.intermediate_data_type, graph.compute_data_type) == ("FLOAT", "FLOAT")
        assert graph.excluded_notes == []  # bf16 runs on tensor cores
    else:
        assert set(blas._libraries[id(fake_cudnn_gpu)].types) == {(BF16, BF16, SINGLE, COMPUTE_32F)}


def test_a_bf16_dense_layer_runs_a_bf16_gemm_with_a_float32_result(fake_cudnn_gpu: Any) -> None:
    net = sym.FullyConnected(sym.var("data"), num_hidden=6, name="fc")
    rng = np.random.default_rng(8)
    params = {"fc_weight": rng.standard_normal((6, 20)).astype(np.float32),
              "fc_bias": rng.standard_normal(6).astype(np.float32)}
    data = rng.standard_normal((3, 20)).astype(np.float32)
    got = outputs_after_capture(engine.load_model(net, params, device="gpu", precision="bf16"),
                   {"data": data})
    want = host_bf16.rounded(data).astype(np.float64) @ host_bf16.rounded(
        params["fc_weight"]).T.astype(np.float64) + params["fc_bias"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    unrounded = data.astype(np.float64) @ params["fc_weight"].T + params["fc_bias"]
    assert np.abs(got - unrounded).max() > 1e-4  # the rounding is really there
    assert set(blas._libraries[id(fake_cudnn_gpu)].types) == {(BF16, BF16, SINGLE, COMPUTE_32F)}


def test_bf16_agrees_with_fp32_on_a_small_cnn(fake_cudnn_gpu: Any) -> None:
    """Probabilities within 2e-2 of fp32's and the same class on at least 99% of 128 inputs;
    the parameters stay float32 (the products convert them)."""
    symbol, params = small_cnn()
    feed = {"data": np.random.default_rng(9).standard_normal((128, 3, 16, 16))
            .astype(np.float32)}
    want = outputs_after_capture(engine.load_model(symbol, params, device="gpu"), feed)
    model = engine.load_model(symbol, params, device="gpu", precision="bf16")
    got = outputs_after_capture(model, feed)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2)
    assert float(np.mean(got.argmax(axis=1) == want.argmax(axis=1))) >= 0.99
    plan = model.plan_for(feed)
    assert plan.execution_stats()["cudnn_convolutions"] == 4
    assert all(value.dtype == np.float32 for value in plan.graph.constants.values())


def test_a_parameter_is_converted_once_per_model(fake_cudnn_gpu: Any) -> None:
    symbol, params = small_cnn()
    model = engine.load_model(symbol, params, device="gpu", precision="bf16")
    launches = fake_cupy.ElementwiseKernel.launches
    model.infer({"data": np.zeros((1, 3, 16, 16), np.float32)})
    first = fake_cupy.ElementwiseKernel.launches - launches
    model.infer({"data": np.zeros((2, 3, 16, 16), np.float32)})
    second = fake_cupy.ElementwiseKernel.launches - launches - first
    # The second plan converts no weight: its launches are its own runs' alone, as the first
    # plan's were less its five weight conversions (four convolutions, the dense layer).
    assert first - second == 5


def test_a_grouped_convolution_stays_float32(fake_cudnn_gpu: Any) -> None:
    """As on the CPU, where depthwise convolutions are not bf16 products."""
    net = sym.Convolution(sym.var("data"), num_filter=8, num_group=4, kernel=(3, 3), pad=(1, 1),
                          no_bias=True, name="c")
    rng = np.random.default_rng(11)
    params = {"c_weight": rng.standard_normal((8, 1, 3, 3)).astype(np.float32)}
    feed = {"data": rng.standard_normal((2, 4, 9, 9)).astype(np.float32)}
    want = outputs_after_capture(engine.load_model(net, params, device="gpu"), feed)
    reduced = engine.load_model(net, params, device="gpu", precision="bf16")
    got = outputs_after_capture(reduced, feed)
    np.testing.assert_array_equal(got, want)
