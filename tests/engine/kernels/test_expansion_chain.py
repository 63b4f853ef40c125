"""A 1×1 expansion and the depthwise layer reading it as one chained job, share by share of
channels (`engine.kernels.expansion_chain`)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import cache_sizes, host_features, spin_pool
from engine.kernels import (
    depthwise_vector,
    expansion_chain,
    gemm_bind,
    gemm_kernel,
    jobs,
    part_chain,
)

pytestmark = [
    pytest.mark.skipif(
        not gemm_kernel.available() or not spin_pool.available() or part_chain._task() is None
        or depthwise_vector._task(1) is None,
        reason="llvmlite cannot compile the GEMM, the pool, the chain or the depthwise kernel"),
    pytest.mark.skipif(host_features.has("avx512f"),
                       reason="an AVX-512 host keeps its expansions and depthwise steps apart"),
]


class ScratchWorkspace:
    def derived(self, constant, tag, make):
        return make(constant)

    def zeroed(self, shape, dtype, tag):
        return np.zeros(shape, dtype)


def block(rng, channels: int, depth: int, size: int, stride: int):
    """An inverted residual block's expansion (bias, clamp to [0, 6]) and its depthwise
    step (`jobs.pooled`, as a plan binds it), the expansion's input, its planes and the
    depthwise output."""
    workspace = ScratchWorkspace()
    weight = rng.standard_normal((channels, depth), dtype=np.float32)
    weight.flags.writeable = False
    right = rng.standard_normal((depth, size * size), dtype=np.float32)
    planes = np.full((channels, size * size), np.nan, np.float32)
    expansion = gemm_bind.weight_product(np, weight, right, planes, workspace)
    bias = rng.standard_normal(channels, dtype=np.float32)
    expansion = gemm_bind.clamped(gemm_bind.with_bias([expansion], bias_rows=bias), 0, 6)[0]
    filters = rng.standard_normal((channels, 1, 3, 3), dtype=np.float32)
    out_size = (size - 1) // stride + 1
    out = np.full((1, channels, out_size, out_size), np.nan, np.float32)
    call = depthwise_vector.bind(planes.reshape(1, channels, size, size), filters,
                                 rng.standard_normal(channels, dtype=np.float32), out,
                                 stride).clamped(0, 6)
    return expansion, jobs.pooled(call, workspace), right, planes, out


@pytest.mark.parametrize("channels,depth,size,stride,kind", [
    (192, 32, 28, 1, gemm_kernel.Product),  # MobileNet v2 at 28²
    (100, 24, 12, 2, gemm_kernel.Product),  # channels off whole row blocks: a short last one
    (576, 96, 14, 2, gemm_bind.Threaded),  # at 14², a product BLAS could run
    (960, 160, 7, 1, gemm_bind.Transposed),  # at 7²: transposed, its copy out a step too
    (200, 40, 7, 1, gemm_bind.Transposed),  # filters off whole panels
])
def test_the_chain_writes_the_two_steps_bytes(monkeypatch, channels, depth, size, stride,
                                              kind):
    """The chain writes the expansion's planes and the depthwise output to the bit as the
    two steps in turn do (a `Threaded` expansion as ours): on one thread, armed on two
    (twice: the claim word starts again at 0), and again after the input changes. Its
    shares are runs of whole row blocks (whole column panels, run transposed), at least
    `SHARES_PER_CORE` a core."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    rng = np.random.default_rng(channels + size)
    expansion, depthwise, right, planes, out = block(rng, channels, depth, size, stride)
    assert type(expansion) is kind
    chain = expansion_chain.chain(expansion, depthwise)
    assert isinstance(chain, part_chain.Chain) and chain.parts == 2
    shares = len(chain.alone)
    assert expansion_chain.SHARES_PER_CORE * 2 <= shares <= channels
    # (a plan runs a `Threaded` on ours: BLAS held to one thread, or the pool armed)
    ours = expansion.ours if kind is gemm_bind.Threaded else expansion
    for _ in range(2):
        ours()
        depthwise()
        want = planes.copy(), out.copy()
        assert not np.isnan(want[1]).any()
        for armed in (False, True, True):
            planes[...], out[...] = np.nan, np.nan
            if armed:
                with spin_pool.armed(2):
                    chain()
            else:
                chain()
            np.testing.assert_array_equal(planes, want[0])
            np.testing.assert_array_equal(out, want[1])
        right[...] = rng.standard_normal(right.shape, dtype=np.float32)


@pytest.mark.parametrize("channels,unit,plane,shares", [
    (576, 6, 784, [144] * 4),  # 14²: 441 KB of planes, `SHARES_PER_CORE` a core
    (144, 6, 12544, [12] * 12),  # 56²: 1.8 MB, 128 KB a share at most
    (96, 6, 50176, [6] * 16),  # 112²: a row block a share, more than 128 KB each
    (960, 16, 196, [240] * 4),  # 7², transposed: whole panels of 16 filters
    (100, 6, 576, [30, 30, 30, 10]),  # a short last share
    (7, 6, 100, [6, 1]),  # fewer units than shares wanted
])
def test_shares_are_runs_of_whole_units(channels, unit, plane, shares):
    runs = expansion_chain._shares(channels, unit, plane, 2)
    assert [last - first for first, last in runs] == shares
    assert runs[0][0] == 0 and all(
        last == first for (_, last), (first, _) in zip(runs, runs[1:]))


def test_pairs_that_cannot_chain_stay_apart(monkeypatch):
    """No chain where the depthwise output overwrites the expansion's input (a buffer the
    plan reuses), where it reads other planes than the expansion writes, where the
    expansion's input would not stay in L2, on one core, or on an AVX-512 host."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    rng = np.random.default_rng(3)
    expansion, depthwise, right, planes, out = block(rng, 48, 24, 14, 1)
    assert expansion_chain.chain(expansion, depthwise) is not None
    # the depthwise layer writing over the expansion's input
    _, over_input, _, _, _ = block(rng, 48, 24, 14, 1)
    source = jobs.source(over_input)
    overwriting = depthwise_vector.bind(
        planes.reshape(1, 48, 14, 14), source.args[1].reshape(48, 1, 3, 3), source.args[2],
        right.reshape(-1)[:48 * 7 * 7].reshape(1, 48, 7, 7), 2)
    assert expansion_chain.chain(expansion, jobs.pooled(overwriting, ScratchWorkspace())) \
        is None
    # the depthwise layer reading another block's planes
    assert expansion_chain.chain(expansion, over_input) is None
    # the expansion's input past the L2's share
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: 2 * right.nbytes - 8)
    assert expansion_chain.chain(expansion, depthwise) is None
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: 2 * right.nbytes)
    assert expansion_chain.chain(expansion, depthwise) is not None
    monkeypatch.setattr(spin_pool, "cores", lambda: 1)
    assert expansion_chain.chain(expansion, depthwise) is None
    # an AVX-512 host keeps its plans as they were measured there
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    has = host_features.has
    monkeypatch.setattr(host_features, "has", lambda flag: flag == "avx512f" or has(flag))
    assert not expansion_chain.applies()
    assert expansion_chain.chain(expansion, depthwise) is None


@pytest.mark.parametrize("l2,refused", [(1 << 20, 0), (2 * 100_000, 1)])
def test_a_mobilenet_v2_plan_chains_its_blocks_to_the_same_bytes(monkeypatch, l2, refused):
    """A MobileNet v2 plan (64 × 64) runs each block's expansion and depthwise layer as one
    step: the memory plan keeps the depthwise output off the expansion's input where that
    input is at most `right_bytes` (with a 200 KB L2, all but the first block's 32 × 32²,
    128 KB), and a block whose depthwise output takes that input's buffer stays apart. Its
    scores are those of the plan without chains to the bit, on one thread and armed over
    two, and the reference interpreter's within float32 sums' rounding."""
    import engine
    from bench import nets

    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: l2)
    symbol = nets.mobilenet_v2()
    params = nets.random_params(symbol, (1, 3, 64, 64), seed=7)
    feed = {"data": np.random.default_rng(7).standard_normal((1, 3, 64, 64),
                                                            dtype=np.float32)}
    want = engine.load_model(symbol, params, optimize=False).infer(feed)
    chained = engine.load_model(symbol, params, optimize=True)
    steps = chained.plan_for(feed).steps
    pairs = [step.call for step in steps if isinstance(step.call, expansion_chain.Pair)]
    real = expansion_chain.chain
    monkeypatch.setattr(expansion_chain, "chain", lambda expansion, depthwise: None)
    apart = engine.load_model(symbol, params, optimize=True)
    unchained = apart.plan_for(feed).steps
    monkeypatch.setattr(expansion_chain, "chain", real)
    assert len(unchained) == len(steps) + len(pairs)
    depthwise = [(before.call, step.call) for before, step in zip(unchained, unchained[1:])
                 if type(jobs.source(step.call)).__name__ == "VectorDepthwiseCall"]
    assert len(depthwise) == 17 and len(pairs) == 17 - refused
    for expansion, step in depthwise[:refused]:  # the first block, over 32 × 32²
        assert real(expansion, step) is None
        right = getattr(expansion, "ours", expansion).operands[1]
        assert right.nbytes == 32 * 32 * 32 * 4
        assert np.may_share_memory(right, jobs.source(step).args[3])
    for threads in (1, 2, 2):
        with spin_pool.armed(threads):
            got, alone = chained.infer(feed), apart.infer(feed)
        for name in want:
            np.testing.assert_array_equal(got[name], alone[name])
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4,
                                       atol=1e-4 * np.abs(want[name]).max())


def test_a_pair_runs_its_chain_armed_and_its_two_steps_on_one_thread(monkeypatch):
    """`expansion_chain.pair`: on one thread the two steps in turn (a chain's share costs
    its calls' setup), armed the chain (made at the first armed run), the same bytes."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    rng = np.random.default_rng(9)
    expansion, depthwise, right, planes, out = block(rng, 192, 32, 28, 1)
    expansion()
    depthwise()
    want = out.copy()
    pair = expansion_chain.pair(expansion, depthwise)
    assert pair.leaves_blas_alone
    out[...] = np.nan
    pair()
    assert pair.run._job is None
    np.testing.assert_array_equal(out, want)
    out[...] = np.nan
    with spin_pool.armed(2):
        pair()
    assert isinstance(pair.run._job, part_chain.Chain)
    np.testing.assert_array_equal(out, want)
