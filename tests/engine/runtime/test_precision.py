"""A model's precision (`load_model(..., precision=)`): the names, the fallback to fp32 on a
host without bf16 or without our int8 kernels (an int8 export's int8 kept), and bf16 plans
against the float32 reference interpreter and fp32 plans."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.cpu import compiled, host_features, spin_pool
from engine.kernels import bf16, gemm_bind, gemm_int8, gemm_kernel, int8_conv, shortcut_ride
from engine.runtime import precision

needs_bf16 = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.BF16),
                                reason="this CPU lacks AVX-512 BF16")
RNG = np.random.default_rng(3)


def small_cnn() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """Every product a bf16 plan binds: a 3×3 convolution (im2col; Winograd in fp32), a
    strided one, a 1×1 one (direct), a residual sum, and a dense layer."""
    data = sym.var("data")
    net = sym.Activation(sym.Convolution(data, num_filter=40, kernel=(3, 3), pad=(1, 1),
                                         name="c1"), act_type="relu")
    body = sym.Convolution(net, num_filter=40, kernel=(3, 3), pad=(1, 1), name="c2")
    net = sym.Activation(body + sym.Convolution(net, num_filter=40, kernel=(1, 1), name="c3"),
                         act_type="relu")
    net = sym.Convolution(net, num_filter=24, kernel=(3, 3), stride=(2, 2), pad=(1, 1),
                          name="c4")
    net = sym.FullyConnected(sym.Flatten(net), num_hidden=10, name="fc")
    return net, nets.random_params(net, (1, 5, 12, 12), seed=1)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_fp32_is_the_default_and_names_are_checked() -> None:
    symbol, params = small_cnn()
    assert engine.load_model(symbol, params).precision == "fp32"
    with pytest.raises(ValueError, match=r"precision 'half' is not one of fp32, bf16"):
        engine.load_model(symbol, params, precision="half")
    with pytest.raises(ValueError, match="precision 'fp16' is not available on the CPU"):
        engine.load_model(symbol, params, precision="fp16")


def test_the_gpu_runs_fp32_bf16_and_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_features, "bf16_dot_product", lambda: False)  # the host's CPU
    for name in ("fp32", "bf16", "fp16"):
        assert precision.resolve(name, "gpu") == name
    with pytest.raises(ValueError, match=r"precision 'int8' is not available on the "
                                         r"GPU \(it runs fp32, bf16, fp16\)"):
        precision.resolve("int8", "gpu")


def test_a_host_without_bf16_runs_fp32_and_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    monkeypatch.setattr(host_features, "bf16_dot_product", lambda: False)
    monkeypatch.setattr(precision, "_warned", set())
    symbol, params = small_cnn()
    feed = {"data": RNG.standard_normal((2, 5, 12, 12)).astype(np.float32)}
    with caplog.at_level(logging.WARNING, logger="engine.precision"):
        models = [engine.load_model(symbol, params, precision="bf16") for _ in range(2)]
    assert [model.precision for model in models] == ["fp32", "fp32"]
    assert models[0].requested_precision == "bf16"
    assert [record.getMessage() for record in caplog.records] == [
        "precision bf16 asked for, but this CPU lacks AVX-512 BF16: running in fp32"]
    fp32 = engine.load_model(symbol, params).infer(feed)["fc_output"]
    np.testing.assert_array_equal(models[0].infer(feed)["fc_output"], fp32)


def test_a_host_without_int8_kernels_runs_fp32_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(int8_conv, "supported_here", lambda: False)
    monkeypatch.setattr(gemm_int8, "available", lambda: False)
    monkeypatch.setattr(precision, "_warned", set())
    symbol, params = small_cnn()
    feed = {"data": RNG.standard_normal((2, 5, 12, 12)).astype(np.float32)}
    with caplog.at_level(logging.WARNING, logger="engine.precision"):
        models = [engine.load_model(symbol, params, precision="int8", calibration=feed)
                  for _ in range(2)]
    assert [model.precision for model in models] == ["fp32", "fp32"]
    assert models[0].requested_precision == "int8"
    assert models[0].run_graph is models[0].graph  # nothing quantized
    (message,) = [record.getMessage() for record in caplog.records]
    assert re.fullmatch(r"precision int8 asked for, but our int8 kernels cannot run on this "
                        r"CPU \((AVX-512 VNNI|the int8 GEMM's JIT \(llvmlite\))\): running in "
                        r"fp32", message), message
    fp32 = engine.load_model(symbol, params).infer(feed)["fc_output"]
    np.testing.assert_array_equal(models[0].infer(feed)["fc_output"], fp32)


def test_int8_falling_back_still_refuses_what_int8_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_conv, "supported_here", lambda: False)
    symbol, params = small_cnn()
    with pytest.raises(ValueError, match="precision int8 needs calibration inputs"):
        engine.load_model(symbol, params, precision="int8")
    with pytest.raises(ValueError, match="calibration input 'image' is not an input"):
        engine.load_model(symbol, params, precision="int8",
                          calibration={"image": np.zeros((1, 5, 12, 12), np.float32)})
    with pytest.raises(ValueError, match="num_bins must be odd"):
        engine.load_model(symbol, params, precision="int8",
                          calibration={"data": np.zeros((1, 5, 12, 12), np.float32)},
                          calibration_settings={"num_bins": 1000})


def test_an_int8_export_runs_int8_on_a_host_without_int8_kernels(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """MXNet's int8 export has no float32 layers to fall back to: it runs its int8 operators
    (on the NumPy path), as it does without the precision asked for."""
    from tests.engine.ops.quantized import fixtures

    monkeypatch.setattr(int8_conv, "supported_here", lambda: False)
    monkeypatch.setattr(precision, "_warned", set())
    name = "plain_symbol_naive"
    symbol, params = (str(path) for path in fixtures.paths(name))
    data = fixtures.io(name)["data"]
    with caplog.at_level(logging.WARNING, logger="engine.precision"):
        model = engine.load_model(symbol, params, precision="int8", calibration={"data": data})
    assert not caplog.records
    assert model.precision == model.requested_precision == "int8"
    assert model.run_graph is model.graph
    (got,) = model.infer({"data": data}).values()
    (as_exported,) = engine.load_model(symbol, params).infer({"data": data}).values()
    np.testing.assert_array_equal(got, as_exported)
    assert precision.resolve("int8", "cpu", int8_export=True) == "int8"
    assert precision.resolve("int8", "cpu") == "fp32"


def test_a_host_with_int8_kernels_runs_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_conv, "supported_here", lambda: True)
    assert precision.resolve("int8", "cpu") == "int8"
    assert precision.fp32_because("int8") is None


def test_the_fallback_names_what_the_host_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "available", lambda: False)
    monkeypatch.setattr(spin_pool, "available", lambda: True)
    monkeypatch.setattr(gemm_int8, "available", lambda: False)
    monkeypatch.setattr(host_features, "has", lambda flag: flag not in ("avx2", "avx512_vnni"))
    assert precision.fp32_because("int8") == ("our int8 kernels cannot run on this CPU "
                                              "(numba, AVX2 or AVX-512 VNNI)")
    monkeypatch.setattr(host_features, "has", lambda flag: flag != "avx512_vnni")
    assert precision.fp32_because("int8") == ("our int8 kernels cannot run on this CPU "
                                              "(numba, the int8 GEMM's JIT (llvmlite))")
    monkeypatch.setattr(host_features, "has", lambda flag: flag != "avx512_bf16")
    assert precision.fp32_because("int8") == ("our int8 kernels cannot run on this CPU "
                                              "(numba, the int8 GEMM's JIT (llvmlite))")
    assert precision.fp32_because("bf16") == "this CPU lacks AVX-512 BF16"
    assert precision.fp32_because("fp32") is None
    monkeypatch.setattr(host_features, "has", lambda flag: True)
    assert precision.fp32_because("bf16") is None


def bf16_products(model: engine.Model, feed: dict[str, np.ndarray]) -> int:
    """How many of the plan's nodes run bf16 products (a convolution may bind one per sample
    or per chunk of samples; a downsampling shortcut's runs in its stride-2 3×3's step,
    `shortcut_ride`)."""
    return len({id(step.node) for step in model.plan_for(feed).steps
                if isinstance(step.call, bf16.PairedProduct)
                or step.call is shortcut_ride.ridden_by_writer})


@needs_bf16
@pytest.mark.parametrize("kernel", ["amx where it applies", "avx512 bf16 only"])
@pytest.mark.parametrize("batch", [1, 3, 20])
def test_bf16_plans_stay_within_bf16_error_of_the_reference(
        kernel: str, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if kernel == "avx512 bf16 only":
        monkeypatch.setattr(gemm_bind, "AMX_MIN_ROWS", 1 << 30)
    symbol, params = small_cnn()
    model = engine.load_model(symbol, params, precision="bf16")
    feed = {"data": RNG.standard_normal((batch, 5, 12, 12)).astype(np.float32)}
    got = model.infer(feed)["fc_output"]
    want = model.reference(feed)["fc_output"]
    # bf16 keeps 8 bits of significand (relative rounding 2^-9 per operand); through four
    # layers the outputs drift by about 1% of their largest value at most, and by more than
    # float32 ever would (the products really ran in bf16).
    error = relative_error(got, want)
    assert 1e-4 < error < 2e-2
    fp32 = engine.load_model(symbol, params).infer(feed)["fc_output"]
    assert relative_error(fp32, want) < 1e-5
    # Four convolutions, and the dense layer where AMX takes it (20 rows): at fewer rows, or
    # on a host without AMX, its 8640 weights are too few for AVX-512 BF16 to pay
    # (`gemm_bind.BF16_MIN_WEIGHTS`).
    dense_in_bf16 = (kernel == "amx where it applies" and batch >= gemm_bind.AMX_MIN_ROWS
                     and gemm_kernel.available(gemm_kernel.AMX))
    assert bf16_products(model, feed) == 4 + dense_in_bf16


@needs_bf16
@pytest.mark.parametrize("tile_pays", [True, False])
def test_a_bf16_3x3_runs_bf16_products_where_the_bf16_tile_beats_float32s(
        tile_pays: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AMX, a stride-1 3×3 in a bf16 plan runs as bf16 products where the AVX-512
    BF16 tile is the faster (`gemm_kernel.bf16_tile_pays`), else as float32 Winograd; both
    within bf16's error of the reference, Winograd within float32's."""
    monkeypatch.setattr(gemm_bind, "AMX_MIN_ROWS", 1 << 30)
    monkeypatch.setattr(gemm_kernel, "bf16_tile_pays", lambda: tile_pays)
    net = sym.Convolution(sym.var("data"), num_filter=64, kernel=(3, 3), pad=(1, 1),
                          name="conv")
    params = nets.random_params(net, (1, 64, 28, 28), seed=3)
    model = engine.load_model(net, params, precision="bf16")
    feed = {"data": RNG.standard_normal((1, 64, 28, 28)).astype(np.float32)}
    got, want = model.infer(feed)["conv_output"], model.reference(feed)["conv_output"]
    assert (bf16_products(model, feed) == 1) is tile_pays
    error = relative_error(got, want)
    assert 1e-4 < error < 2e-2 if tile_pays else error < 1e-5


needs_amx = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX),
                               reason="this CPU or kernel lacks AMX-BF16")


@needs_amx
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("spatial", [(23, 29), (19, 45)])  # output rows of 15 and 23
@pytest.mark.parametrize("stride", [1, 2])
def test_a_strided_stem_pairs_its_patches_within_bf16_error(
        batch: int, spatial: tuple[int, int], stride: int) -> None:
    """A stem like ResNet's (7×7, padded) over 3 channels into 20 filters, neither a multiple
    of 16: its patches are paired straight from the padded input (stride 2 reads every other
    float) and the AMX product runs on them; the result keeps within bf16's error of the
    float32 reference."""
    data = sym.var("data")
    net = sym.Convolution(data, num_filter=20, kernel=(7, 7), stride=(stride, stride),
                          pad=(3, 3), name="stem")
    params = nets.random_params(net, (1, 3, *spatial), seed=4)
    feed = {"data": RNG.standard_normal((batch, 3, *spatial)).astype(np.float32)}
    model = engine.load_model(net, params, precision="bf16")
    assert bf16_products(model, feed) == 1
    got, want = model.infer(feed)["stem_output"], model.reference(feed)["stem_output"]
    # One product over K = 147 of bf16-rounded operands: about 2^-9 relative per term.
    assert 1e-5 < relative_error(got, want) < 1e-2


@needs_bf16
@pytest.mark.parametrize(("channels", "filters"), [(8, 64), (16, 16), (24, 24)])
def test_thin_products_stay_float32_unless_the_bf16_tile_pays(channels: int,
                                                               filters: int) -> None:
    """A 1×1 convolution over fewer than 16 channels gains nothing from bf16; over fewer
    than 32 (as MobileNet's 16 or 24) into fewer filters than an AMX tile's 32 rows neither
    on an AMX host (`gemm_bind.amx_pays`): it runs in float32, exactly as an fp32 plan does.
    Without AMX, the AVX-512 BF16 tile takes it from 16 channels
    (`gemm_bind.BF16_TILE_MIN_DEPTH`), within bf16's error."""
    data = sym.var("data")
    net = sym.Convolution(data, num_filter=filters, kernel=(1, 1), name="thin")
    params = nets.random_params(net, (1, channels, 8, 8))
    feed = {"data": RNG.standard_normal((1, channels, 8, 8)).astype(np.float32)}
    reduced = engine.load_model(net, params, precision="bf16")
    got = reduced.infer(feed)["thin_output"]
    want = engine.load_model(net, params).infer(feed)["thin_output"]
    if channels >= gemm_bind.BF16_TILE_MIN_DEPTH and not gemm_kernel.available(gemm_kernel.AMX):
        assert bf16_products(reduced, feed) == 1
        assert 0 < relative_error(got, want) < 1e-2
        return
    assert bf16_products(reduced, feed) == 0
    np.testing.assert_array_equal(got, want)


@needs_amx
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(("channels", "filters"), [(16, 96), (24, 144), (20, 40)])
def test_a_short_k_product_of_a_tile_of_rows_runs_on_amx_within_bf16_error(
        batch: int, channels: int, filters: int) -> None:
    """MobileNet v2's expand layers (1×1 over 16 or 24 channels into 96 or 144 filters, and
    an odd K of 20): K below 32 is padded with zero pairs, and the AMX product keeps within
    bf16's error of the float32 reference, clamped as the ReLU6 after it."""
    data = sym.var("data")
    net = sym.clip(sym.Convolution(data, num_filter=filters, kernel=(1, 1), name="expand"),
                   a_min=0.0, a_max=6.0, name="relu6")
    params = nets.random_params(net, (1, channels, 14, 14), seed=7)
    feed = {"data": RNG.standard_normal((batch, channels, 14, 14)).astype(np.float32)}
    model = engine.load_model(net, params, precision="bf16")
    assert bf16_products(model, feed) == 1
    got, want = model.infer(feed)["relu6_output"], model.reference(feed)["relu6_output"]
    assert 1e-5 < relative_error(got, want) < 1e-2
    assert got.min() >= 0.0 and got.max() <= 6.0


@needs_bf16
def test_a_dense_layer_at_batch_1_runs_bf16_only_for_a_large_weight() -> None:
    data = sym.var("data")
    net = sym.FullyConnected(sym.FullyConnected(data, num_hidden=1000, name="large"),
                             num_hidden=200, name="small")
    params = nets.random_params(net, (1, 512))
    feed = {"data": RNG.standard_normal((1, 512)).astype(np.float32)}
    model = engine.load_model(net, params, precision="bf16")
    calls = [step.call for step in model.plan_for(feed).steps]
    assert [isinstance(call, bf16.PairedProduct) for call in calls] == [True, False]
    got, want = model.infer(feed)["small_output"], model.reference(feed)["small_output"]
    assert 1e-5 < relative_error(got, want) < 1e-2


@needs_bf16
def test_a_resnet18_picks_the_fp32_class_in_bf16() -> None:
    """Top-1 agreement of bf16 with fp32 on a random-weight ResNet-18 (112×112 inputs, so that
    the test runs in seconds; bench/executor.py checks 256 at 224×224). At 64×64 this random
    network's two best classes come within 4e-5 of the largest logit on some inputs, where
    any rounding picks either."""
    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, 112, 112))
    images = np.random.default_rng(36).standard_normal((96, 3, 112, 112)).astype(np.float32)
    fp32 = engine.load_model(symbol, params)
    reduced = engine.load_model(symbol, params, precision="bf16")
    agree = []
    for start in range(0, len(images), 32):
        feed = {"data": images[start:start + 32]}
        want, got = fp32.infer(feed)["output_output"], reduced.infer(feed)["output_output"]
        assert relative_error(got, want) < 3e-2
        agree.extend(np.argmax(got, axis=1) == np.argmax(want, axis=1))
    assert np.mean(agree) >= 0.99
    # On AMX, or where the AVX-512 BF16 tile is faster than float32's, every product but the
    # thinnest; elsewhere the stride-1 3×3s stay Winograd in float32 (`winograd_bind.bind`),
    # leaving the stem, the stride-2 3×3s, the downsampling shortcuts and the classifier.
    products = bf16_products(reduced, feed)
    if gemm_kernel.available(gemm_kernel.AMX) or gemm_kernel.bf16_tile_pays():
        assert products >= 20
    else:
        assert products == 8
