"""On a GPU: ``precision="fp16"`` and ``"bf16"`` against fp32 on the device (real cuDNN,
cuBLAS and NVRTC).

Marked ``gpu``: skipped (with the reason) where CuPy or a CUDA device is missing. The same
plumbing is checked on the CPU by `test_simulated_half` and `test_simulated_bf16`; here the
device's own arithmetic decides the tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest

import engine
from tests.conformance.fixtures import model_files, model_io_sets
from tests.engine.gpu.test_simulated_half import small_cnn

pytestmark = pytest.mark.gpu
RUNS = 4  # the warm-up runs, the capture and two replays


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", ["lenet", "resblock", "concurrent_cnn", "seed_mlp"])
def test_model_on_gpu_is_close_to_fp32_and_captured(name: str, precision: str) -> None:
    inputs, _ = model_io_sets(name)[0]
    single = engine.load_model(*model_files(name), device="gpu")
    half = engine.load_model(*model_files(name), device="gpu", precision=precision)
    for _ in range(RUNS):
        got, want = half.infer(inputs), single.infer(inputs)
    for key, value in got.items():
        assert value.dtype == want[key].dtype
        scale = float(np.abs(want[key]).max()) or 1.0
        np.testing.assert_allclose(value, want[key], rtol=0, atol=2e-2 * scale, err_msg=key)
    stats = half.plan_for(inputs).execution_stats()
    assert stats["cuda_graph"] is True, stats["cuda_graph_error"]
    assert not stats.get("cudnn_declined"), stats["cudnn_declined"]


@pytest.mark.parametrize("precision,tolerance", [("fp16", 1e-2), ("bf16", 2e-2)])
def test_picks_fp32s_class_on_at_least_99_percent_of_256_inputs(precision: str,
                                                                tolerance: float) -> None:
    symbol, params = small_cnn()
    feed = {"data": np.random.default_rng(5).standard_normal((256, 3, 16, 16))
            .astype(np.float32)}
    single = engine.load_model(symbol, params, device="gpu")
    half = engine.load_model(symbol, params, device="gpu", precision=precision)
    for _ in range(RUNS):
        got, want = (list(model.infer(feed).values())[0] for model in (half, single))
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
    assert float(np.mean(got.argmax(axis=1) == want.argmax(axis=1))) >= 0.99
