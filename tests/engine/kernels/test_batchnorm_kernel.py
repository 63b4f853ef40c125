"""`batchnorm_kernel`: an inference BatchNorm and the clamp after it as one compiled pass, alone
and as spin-pool jobs, equal to NumPy's BatchNorm then clip; and in plans, a pre-activation
BatchNorm → ReLU → Convolution (ResNet v2's) against the reference interpreter in fp32 and bf16."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.cpu import spin_pool
from engine.kernels import batchnorm_kernel, bf16, bf16_handoff, gemm_kernel, jobs
from engine.kernels.workspace import Reader, Workspace
from engine.ops.registry import get_op

RNG = np.random.default_rng(36)
needs_bf16 = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.BF16),
                                reason="this CPU lacks AVX-512 BF16")


def statistics(channels: int) -> list[np.ndarray]:
    """gamma, beta, moving mean and variance (positive), float32."""
    return [RNG.standard_normal(channels).astype(np.float32) * 2,
            RNG.standard_normal(channels).astype(np.float32),
            RNG.standard_normal(channels).astype(np.float32),
            RNG.uniform(0.1, 3.0, channels).astype(np.float32)]


def numpy_batchnorm(data: np.ndarray, stats: list[np.ndarray], eps: float,
                    fix_gamma: bool) -> np.ndarray:
    batch_norm = get_op("BatchNorm")
    attrs = batch_norm.parse_attrs({"eps": str(eps), "fix_gamma": str(fix_gamma)})
    return batch_norm.kernel(np, attrs, data, *stats)


@pytest.mark.parametrize("shape", [(1, 13, 19, 21), (3, 7, 17, 13), (2, 4099), (1, 5, 3, 4, 70)])
@pytest.mark.parametrize("fix_gamma", [False, True])
def test_the_pass_equals_numpys_batchnorm_and_clip(shape: tuple[int, ...],
                                                   fix_gamma: bool) -> None:
    data = RNG.standard_normal(shape).astype(np.float32) * 3
    data.flat[::97] = np.nan
    stats = statistics(shape[1])
    want = numpy_batchnorm(data, stats, 1e-3, fix_gamma)
    out = np.empty_like(data)
    call = batchnorm_kernel.bind(data, *stats, 1e-3, fix_gamma, out)
    assert call is not None
    call()
    # The same float32 operations in the same order: equal, NaN where the data is NaN.
    np.testing.assert_array_equal(out, want)
    clamped = call.clamped(np.float32(0), np.float32(6))
    clamped()
    np.testing.assert_array_equal(out, np.clip(want, 0, 6))
    out[...] = 0
    job = clamped.as_job(None)
    assert job is not None
    job()  # not armed: every part on this thread
    np.testing.assert_array_equal(out, np.clip(want, 0, 6))
    out[...] = 0
    with spin_pool.armed(2):
        job()
    np.testing.assert_array_equal(out, np.clip(want, 0, 6))


def test_it_runs_in_place_and_refuses_what_it_cannot_take() -> None:
    data = RNG.standard_normal((2, 6, 40, 40)).astype(np.float32)
    stats = statistics(6)
    want = numpy_batchnorm(data, stats, 1e-5, False)
    call = batchnorm_kernel.bind(data, *stats, 1e-5, False, data)
    call()
    np.testing.assert_array_equal(data, want)
    out = np.empty_like(data)
    assert batchnorm_kernel.bind(data[:, :, ::2], *stats, 1e-5, False, out[:, :, ::2]) is None
    assert batchnorm_kernel.bind(data[:, :3], *[s[:3] for s in stats], 1e-5, False,
                                 out[:, :3]) is None  # not contiguous
    assert batchnorm_kernel.bind(data, *[s.astype(np.float64) for s in stats], 1e-5, False,
                                 out) is None
    assert batchnorm_kernel.bind(data[:, :, :5, :5].copy(), *stats, 1e-5, False,
                                 out[:, :, :5, :5].copy()) is None  # too small to pay
    overlapping = np.empty(data.size + 1, np.float32)
    assert batchnorm_kernel.bind(overlapping[1:].reshape(data.shape), *stats, 1e-5, False,
                                 overlapping[:-1].reshape(data.shape)) is None


def preactivation(channels: int, filters: int, stride: int, pad: int, kernel: int) -> sym.Symbol:
    """data + 1 → BatchNorm → ReLU → Convolution: the sum keeps BatchNorm off the input (as
    a residual sum does in ResNet v2), and nothing folds it into the convolution after it."""
    data = sym.var("data")
    net = sym.BatchNorm(data + 1, fix_gamma=False, eps=2e-5, name="bn")
    net = sym.Activation(net, act_type="relu", name="relu")
    return sym.Convolution(net, num_filter=filters, kernel=(kernel, kernel),
                           stride=(stride, stride), pad=(pad, pad), name="conv")


def one_relu_folded_pass(net: Any, params: dict[str, np.ndarray],
                         feed: dict[str, np.ndarray]) -> np.ndarray:
    """The reference interpreter's ``conv_output`` of ``net``, which the model's matches, its
    plan holding one BatchNorm pass whose clamp is the ReLU's."""
    model = engine.load_model(net, params)
    got, want = model.infer(feed)["conv_output"], model.reference(feed)["conv_output"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    passes = [call for call in plan_calls(model, feed)
              if isinstance(call, batchnorm_kernel.BatchNormCall)]
    assert len(passes) == 1 and passes[0].args[-2:] == (0, np.inf)  # the ReLU folded in
    return want


def plan_calls(model: engine.Model, feed: dict[str, np.ndarray]) -> list:
    return [jobs.source(step.call) for step in model.plan_for(feed).steps]


CASES = [(13, 37, 2, 1, 3), (7, 21, 1, 0, 1), (33, 64, 2, 0, 1), (64, 96, 1, 1, 3)]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(("channels", "filters", "stride", "pad", "kernel"), CASES)
def test_a_preactivation_runs_as_one_pass_and_matches_the_reference(
        batch: int, channels: int, filters: int, stride: int, pad: int, kernel: int) -> None:
    net = preactivation(channels, filters, stride, pad, kernel)
    shape = (batch, channels, 29, 31)
    params = nets.random_params(net, (1, *shape[1:]), seed=channels)
    params["bn_moving_var"] = RNG.uniform(0.2, 2.0, channels).astype(np.float32)
    params["bn_moving_mean"] = RNG.standard_normal(channels).astype(np.float32)
    feed = {"data": RNG.standard_normal(shape).astype(np.float32)}
    want = one_relu_folded_pass(net, params, feed)
    # The ReLU ran: negative normalised values were cut (the reference agrees only then).
    assert (want != 0).any()


@needs_bf16
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(("channels", "filters", "stride", "pad", "kernel"), CASES[2:])
def test_a_preactivation_in_bf16_stays_within_bf16_error(
        batch: int, channels: int, filters: int, stride: int, pad: int, kernel: int) -> None:
    net = preactivation(channels, filters, stride, pad, kernel)
    shape = (batch, channels, 29, 31)
    params = nets.random_params(net, (1, *shape[1:]), seed=channels)
    feed = {"data": RNG.standard_normal(shape).astype(np.float32)}
    reduced = engine.load_model(net, params, precision="bf16")
    got, want = reduced.infer(feed)["conv_output"], reduced.reference(feed)["conv_output"]
    # One bf16 product (2^-9 relative rounding per operand) over 33-576 terms: about 1% of
    # the largest output at most, and more than float32's error (the product ran in bf16).
    # A stride-1 3×3 stays Winograd in float32 where neither AMX nor a bf16 tile faster than
    # float32's runs it (`winograd_bind.bind`).
    error = float(np.abs(got - want).max() / np.abs(want).max())
    in_bf16 = ((kernel, stride) != (3, 1) or gemm_kernel.available(gemm_kernel.AMX)
               or gemm_kernel.bf16_tile_pays())
    assert error < 1e-2 and (error > 1e-5) == in_bf16
    assert any(isinstance(call, batchnorm_kernel.BatchNormCall)
               for call in plan_calls(reduced, feed))


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=needs_bf16)])
def test_resnet50_v2_matches_the_reference(precision: str) -> None:
    """ResNet-50 v2 at 64×64 (every stage, strided blocks included; stage 4 at 2×2), batch 1
    and 3."""
    symbol = nets.resnet50_v2(classes=10)
    params = nets.random_params(symbol, (1, 3, 64, 64), seed=5)
    model = engine.load_model(symbol, params, precision=precision)
    for batch in (1, 3):
        feed = {"data": RNG.standard_normal((batch, 3, 64, 64)).astype(np.float32)}
        name = model.output_names[0]
        got, want = model.infer(feed)[name], model.reference(feed)[name]
        error = float(np.abs(got - want).max() / np.abs(want).max())
        # fp32: reordered sums only; bf16: some 50 layers of bf16 products.
        assert error < (1e-4 if precision == "fp32" else 5e-2)
        fused = [call for call in plan_calls(model, feed)
                 if isinstance(call, batchnorm_kernel.BatchNormCall)]
        # The input's BatchNorm, one per block (16) and the last: every one of them.
        assert len(fused) == 18


@pytest.mark.parametrize("batch", [1, 3])
def test_mxnets_batchnorm_with_relu_runs_as_the_same_pass(batch: int) -> None:
    """``_contrib_BatchNormWithReLU`` (MXNet's BatchNorm and ReLU in one op): one compiled
    pass clamping at zero, equal to the reference interpreter's BatchNorm then maximum."""
    data = sym.var("data")
    net = sym.Convolution(sym._contrib_BatchNormWithReLU(data + 1, fix_gamma=False, eps=1e-5,
                                                         name="bnr"),
                          num_filter=9, kernel=(3, 3), stride=(2, 2), pad=(1, 1), name="conv")
    shape = (batch, 11, 25, 27)
    params = nets.random_params(net, (1, *shape[1:]), seed=11)
    params["bnr_moving_mean"] = RNG.standard_normal(11).astype(np.float32)
    feed = {"data": RNG.standard_normal(shape).astype(np.float32)}
    one_relu_folded_pass(net, params, feed)


@pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX), reason="needs AMX")
@pytest.mark.parametrize("channels", [13, 64])
@pytest.mark.parametrize("fix_gamma", [False, True])
def test_a_taken_handoff_gets_the_bf16_pairs_of_the_pass(channels: int, fix_gamma: bool) -> None:
    """In a bf16 plan whose readers all take its hand-off, the pass writes the words pairing
    its clamped output would (bit for bit, NaN and an odd K's last row included), run alone
    or as a job, and leaves the float32 output alone; untaken, it writes the output."""
    data = RNG.standard_normal((1, channels, 17, 19)).astype(np.float32) * 3
    data.flat[::89] = np.nan
    stats = statistics(channels)
    want = np.clip(numpy_batchnorm(data, stats, 1e-3, fix_gamma), 0, 6)
    workspace = Workspace(np, 0, precision="bf16")
    out = np.full_like(data, 7.5)
    workspace.note_readers(out, (Reader("Convolution", None, 0),))
    call = batchnorm_kernel.bind(data, *stats, 1e-3, fix_gamma, out, workspace)
    call = call.clamped(np.float32(0), np.float32(6))
    handoff = call.args[9]
    assert isinstance(call, batchnorm_kernel.PairingBatchNormCall) and not handoff.taken
    job = call.as_job(workspace)
    job()
    np.testing.assert_array_equal(out, want)
    assert not handoff.laid
    paired = np.zeros(handoff.shape, np.float32)
    bf16.patch_pairing(want.reshape(channels, -1), 1, paired)()
    words = bf16_handoff.words_for(handoff, handoff.shape, workspace)
    bf16_handoff.take(handoff, lambda: None)
    out[...] = 7.5
    for run in (call, job):
        words[...] = 0
        with spin_pool.armed(2):
            run()
        assert handoff.laid
        np.testing.assert_array_equal(words.view(np.uint32), paired.view(np.uint32))
        assert (out == 7.5).all()
