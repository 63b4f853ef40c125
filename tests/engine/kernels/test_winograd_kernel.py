"""Winograd's compiled transforms (`engine.kernels.winograd_kernel`) agree with the reference
interpreter, carry a fused chain's bias, residual and clamp, and stand aside where they lose."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import sym
from engine.cpu import compiled, host_features, spin_pool
from engine.kernels import jobs, winograd_bind, winograd_kernel
from engine.kernels.workspace import Workspace
from tests.conformance.fixtures import assert_close, model_files, model_io_sets, model_meta
from tests.engine.runtime.helpers import load_pair, run_allocation, step_funcs

RNG = np.random.default_rng(11)
CHANNELS = 4

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba not installed")


@pytest.fixture(autouse=True, params=[2, 4], ids=["F2", "F4"])
def tile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Winograd, compiled, forced on for the small shapes of these tests, as F(2×2, 3×3) and
    as F(4×4, 3×3): the output tile's side."""
    monkeypatch.setattr(winograd_bind, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd_bind, "MIN_TILES", 1)
    monkeypatch.setattr(winograd_bind, "F4_MIN_TILES", 1 if request.param == 4 else 1 << 30)
    return request.param


def funcs(model, shape: tuple) -> list:
    plan = model.plan_for({"data": np.zeros(shape, np.float32)})
    return step_funcs(plan)


def assert_agrees(optimized, reference, shape: tuple, name: str, nan: bool = False,
                  tile: int = 2) -> None:
    for _ in range(2):  # a second run: nothing left over from the first
        x = RNG.normal(scale=2, size=shape).astype(np.float32)
        if nan:
            x[0, 1, 2, 3] = np.nan
        want = reference.infer({"data": x})[name]
        assert np.isnan(want).any() == nan
        got = optimized.infer({"data": x})[name]
        if tile == 4:
            # F(4×4)'s transforms mix every cell of a 6×6 input tile into every output of the
            # tile: a NaN reaches the whole 4×4 tiles around it, not only its 3×3 neighbours
            # (F(2×2)'s sparser transforms keep exactly those). Elsewhere the outputs agree.
            assert np.isnan(got[np.isnan(want)]).all()
            spread = np.isnan(got) & ~np.isnan(want)
            assert not spread[1:].any() and spread.sum() < 8 * 8 * shape[1], spread.sum()
            want = np.where(spread, np.nan, want)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(want)))


def conv(net, filters: int, pad: int, name: str, no_bias: bool = False):
    return sym.Convolution(net, kernel=(3, 3), pad=(pad, pad), num_filter=filters,
                           no_bias=no_bias, name=name)


@pytest.mark.parametrize("spatial", [(12, 10), (9, 7), (3, 4)], ids=["even", "odd", "tiny"])
@pytest.mark.parametrize("pad", [0, 1, 2])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("no_bias", [False, True])
def test_compiled_winograd_matches_reference(spatial: tuple, pad: int, batch: int,
                                             no_bias: bool) -> None:
    net = conv(sym.var("data"), CHANNELS + 1, pad, "conv", no_bias)
    shape = (batch, CHANNELS, *spatial)
    optimized, reference = load_pair(net, shape, RNG)
    assert winograd_kernel.convolve in funcs(optimized, shape)
    assert_agrees(optimized, reference, shape, "conv_output")


@pytest.mark.parametrize("chunk_tiles", [30, 60])
def test_samples_in_several_chunks(monkeypatch: pytest.MonkeyPatch, chunk_tiles: int) -> None:
    # 12×10 outputs are 30 tiles a sample: one sample at a time, or two (2, 2 and a short 1).
    monkeypatch.setattr(winograd_bind, "CHUNK_TILES", chunk_tiles)
    net = sym.Activation(conv(sym.var("data"), CHANNELS, 1, "conv"), act_type="relu",
                         name="relu")
    shape = (5, CHANNELS, 12, 10)
    optimized, reference = load_pair(net, shape, RNG)
    assert_agrees(optimized, reference, shape, "relu_output")


@pytest.mark.parametrize("activation", ["relu", "clip"])
def test_clamp_applied_as_the_output_transform_writes(activation: str, tile: int) -> None:
    first = conv(sym.var("data"), CHANNELS, 1, "conv")
    net = (sym.Activation(first, act_type="relu", name="out") if activation == "relu"
           else sym.clip(first, a_min=-0.5, a_max=1.5, name="out"))
    shape = (2, CHANNELS, 9, 8)
    optimized, reference = load_pair(net, shape, RNG)
    called = funcs(optimized, shape)
    assert called == [winograd_kernel.convolve]  # no pass of its own for the clamp
    assert_agrees(optimized, reference, shape, "out_output", nan=True, tile=tile)


@pytest.mark.parametrize("clamp", [True, False])
def test_residual_block_end_in_the_output_transform(clamp: bool, tile: int) -> None:
    # ResNet's block end: conv + bias, + the block's input, ReLU.
    data = sym.var("data")
    net = sym.elemwise_add(conv(data, CHANNELS, 1, "conv"), data, name="add")
    net = sym.Activation(net, act_type="relu", name="out") if clamp else net
    shape = (3, CHANNELS, 7, 9)
    optimized, reference = load_pair(net, shape, RNG)
    called = funcs(optimized, shape)
    assert called.count(winograd_kernel.convolve) == 1
    assert np.add not in called and np.maximum not in called
    assert_agrees(optimized, reference, shape, "out_output" if clamp else "add_output",
                  nan=True, tile=tile)


def test_two_layers_share_the_scratch() -> None:
    first = sym.Activation(conv(sym.var("data"), CHANNELS + 3, 1, "first"), act_type="relu")
    net = sym.Activation(conv(first, CHANNELS, 1, "second"), act_type="relu", name="relu")
    shape = (2, CHANNELS, 11, 12)
    optimized, reference = load_pair(net, shape, RNG)
    assert funcs(optimized, shape).count(winograd_kernel.convolve) == 2
    assert_agrees(optimized, reference, shape, "relu_output")


def test_compiled_winograd_allocates_nothing_per_run() -> None:
    net = sym.Activation(conv(sym.var("data"), 16, 1, "conv"), act_type="relu", name="relu")
    shape = (2, 16, 64, 64)
    optimized, _ = load_pair(net, shape, RNG)
    feed = {"data": RNG.normal(size=shape).astype(np.float32)}
    plan = optimized.plan_for(feed)
    peak, _ = run_allocation(plan, feed, 10)
    assert peak < 64 * 1024, f"a run allocated up to {peak} bytes"


def test_narrow_layers_run_compiled_with_the_block_end(tile: int) -> None:
    # 7 columns padded by 1 are 4 F(2×2) tiles across, as in ResNet's last stage: compiled
    # too (NumPy's transforms would be 44 passes and the residual sum one more), the block's
    # residual and ReLU added as the output transform writes.
    data = sym.var("data")
    net = sym.elemwise_add(conv(data, CHANNELS, 1, "conv"), data, name="add")
    net = sym.Activation(net, act_type="relu", name="out")
    shape = (1, CHANNELS, 7, 7)
    optimized, reference = load_pair(net, shape, RNG)
    called = funcs(optimized, shape)
    assert called.count(winograd_kernel.convolve) == 1
    assert not {np.add, np.subtract, np.maximum} & set(called)
    assert_agrees(optimized, reference, shape, "out_output", tile=tile)


def test_without_numba_the_numpy_transforms_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(winograd_bind.compiled, "available", lambda: False)
    net = conv(sym.var("data"), CHANNELS, 1, "conv")
    shape = (2, CHANNELS, 10, 10)
    optimized, reference = load_pair(net, shape, RNG)
    assert winograd_kernel.convolve not in funcs(optimized, shape)
    assert_agrees(optimized, reference, shape, "conv_output")


@pytest.mark.parametrize("layer", [(64, 56, 1), (128, 28, 4)], ids=str)
def test_resnet_layers_bind_compiled_within_their_scratch(layer: tuple) -> None:
    channels, size, batch = layer
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    data = np.zeros((batch, channels, size, size), np.float32)
    weight = np.zeros((channels, channels, 3, 3), np.float32)
    weight.flags.writeable = False
    out = np.empty_like(data)
    need = winograd_bind.scratch_bytes(data.shape, channels, geometry, 4)
    workspace = Workspace(np, need)
    calls = winograd_bind.bind(np, data, weight, None, out, geometry, workspace)
    assert [call.func for call in calls] == [winograd_kernel.convolve]
    tiles = calls[0].args[4]
    products = calls[0].args[6]
    # Both regions lie inside the scratch, apart; the products' rows are padded apart.
    scratch = workspace.scratch
    for region in (tiles, products):
        assert np.shares_memory(region, scratch)
        assert region.ctypes.data + region.nbytes <= scratch.ctypes.data + scratch.nbytes
    assert not np.shares_memory(tiles, products)
    assert products.shape[1] % 1024 != 0


@pytest.mark.parametrize(("cells", "avx512", "row"), [(4096, False, 4112), (12544, False, 12560),
                                                     (6272, False, 6288), (100, False, 112),
                                                     (4096, True, 4096), (100, True, 100)])
def test_avx2_hosts_lay_the_tiles_rows_an_odd_number_of_lines_apart(
        monkeypatch: pytest.MonkeyPatch, cells: int, avx512: bool, row: int) -> None:
    monkeypatch.setattr(host_features, "has", lambda flag: avx512 and flag == "avx512f")
    assert winograd_bind.tiles_row(cells) == row


@pytest.mark.parametrize("avx512", [False, True], ids=["avx2", "avx512"])
def test_a_layer_on_either_tiles_layout_matches_reference(monkeypatch: pytest.MonkeyPatch,
                                                          avx512: bool, tile: int) -> None:
    monkeypatch.setattr(host_features, "has", lambda flag: avx512 and flag == "avx512f")
    net = conv(sym.var("data"), 16, 1, "conv")
    shape = (1, 16, 16, 16)  # the tiles' rows 16 · 64 or 16 · 16 cells: whole KiBs unpadded
    bound = []
    bind = winograd_bind._bind_compiled
    monkeypatch.setattr(winograd_bind, "_bind_compiled",
                        lambda *args: bound.append(bind(*args)) or bound[-1])
    optimized, reference = load_pair(net, shape, RNG)
    assert winograd_kernel.convolve in funcs(optimized, shape)
    tiles = bound[-1].args[4]
    lines = tiles.shape[1] // 16
    assert tiles.shape[1] % 16 == 0 and (lines % 2 == 1) != avx512
    assert_agrees(optimized, reference, shape, "conv_output", tile=tile)


@pytest.mark.parametrize("threads", [1, 2])
def test_mxnets_own_resnet_block_export_matches_mxnet(tile: int, threads: int) -> None:
    # MXNet's model zoo BasicBlockV1 at 64 channels (32×32 and 16×16), exported by MXNet 1.9.1
    # with its outputs: both variants, alone and armed over two threads (the jobs' way).
    name = "mxnet_resnet_v1_wide"
    model = engine.load_model(*model_files(name), optimize=True)
    for inputs, expected in model_io_sets(name):
        with spin_pool.armed(threads):
            actual = next(iter(model.infer(inputs).values()))
        assert_close(actual, expected[0], model_meta(name)["tolerance"], name)
        calls = [jobs.source(step.call) for step in model.plan_for(inputs).steps]
        products = {len(call.args[4]) for call in calls
                    if getattr(call, "func", None) is winograd_kernel.convolve}
        assert products == {(tile + 2) ** 2}  # the two blocks' four 3×3 layers, one variant


def test_u_is_held_once_as_our_gemm_reads_it_and_a_whole_call_still_runs(tile: int) -> None:
    """Where our GEMM runs the products, the model derives U packed for it and in no other
    form (its derived bytes are that array's), and the layer's call run whole, as where no
    job is made, unpacks it and writes what the job writes."""
    from engine.kernels import gemm_kernel

    if not winograd_kernel.products_packed(np.float32):
        pytest.skip("our GEMM cannot compile for this CPU")
    net = sym.Activation(conv(sym.var("data"), 16, 1, "conv"), act_type="relu", name="relu")
    shape = (2, 16, 12, 12)
    optimized, reference = load_pair(net, shape, RNG)
    feed = {"data": RNG.normal(size=shape).astype(np.float32)}
    plan = optimized.plan_for(feed)
    (call,) = [jobs.source(step.call) for step in plan.steps
               if getattr(jobs.source(step.call), "func", None) is winograd_kernel.convolve]
    weights = call.args[5]
    xis = (tile + 2) ** 2
    rows = gemm_kernel.tile().rows
    assert weights.shape == (xis, -(-16 // rows), 16, rows)
    assert optimized.derived_bytes == weights.nbytes
    want = optimized.infer(feed)["relu_output"]
    np.testing.assert_allclose(want, reference.infer(feed)["relu_output"], rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())
    out = call.args[9]
    out[...] = np.nan
    call()  # whole: `convolve` with U unpacked
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
