"""One job whose parts each run steps of their own in order (`engine.kernels.part_chain`)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import spin_pool
from engine.kernels import gemm_kernel, part_chain, strided_kernel

RNG = np.random.default_rng(11)
SHARES = 4

pytestmark = pytest.mark.skipif(not spin_pool.available() or part_chain._task() is None,
                                reason="no spin pool or JIT on this machine")


def copy(target: np.ndarray, source: np.ndarray) -> spin_pool.Job:
    job = strided_kernel.job(0, target, source, source)
    assert job is not None
    return job


def two_step_shares(source: np.ndarray, middle: np.ndarray, out: np.ndarray) -> list[list]:
    """Per share: its rows of ``source`` into ``middle`` (transposed), then back into
    ``out``: the second step reads what the first wrote."""
    return [[copy(middle[share].T, source[share]), copy(out[share], middle[share].T)]
            for share in range(SHARES)]


def test_each_share_runs_its_steps_in_order_armed_or_alone() -> None:
    source = RNG.standard_normal((SHARES, 96, 96)).astype(np.float32)
    middle = np.empty_like(source)
    armed_out, alone_out = np.full_like(source, np.nan), np.full_like(source, np.nan)
    armed_shares = two_step_shares(source, middle, armed_out)
    chain = part_chain.chain([armed_shares, armed_shares],
                             two_step_shares(source, middle, alone_out), parts=2)
    assert chain is not None and chain.parts == 2
    chain()  # unarmed: one part, the second table
    np.testing.assert_array_equal(alone_out, source)
    assert np.isnan(armed_out).all()
    with spin_pool.armed(2):
        for _ in range(3):
            armed_out[...] = np.nan
            chain()
            np.testing.assert_array_equal(armed_out, source)


@pytest.mark.parametrize("parts", [1, 3, SHARES])
def test_any_parts_up_to_the_shares_cover_every_share(parts: int) -> None:
    source = RNG.standard_normal((SHARES, 96, 96)).astype(np.float32)
    middle = np.empty_like(source)
    out = np.full_like(source, np.nan)
    shares = two_step_shares(source, middle, out)
    chain = part_chain.chain([shares] * parts, shares, parts)
    with spin_pool.armed(2):
        for _ in range(3):  # the claim word goes back to 0 after each run
            out[...] = np.nan
            chain()
            np.testing.assert_array_equal(out, source)


def test_parts_claim_shares_from_their_own_tables() -> None:
    """Armed, each share runs once, from the table of the part that claimed it: every
    part's table writes its own output, and together the outputs hold every share once."""
    source = RNG.standard_normal((SHARES, 96, 96)).astype(np.float32)
    outs = [np.zeros_like(source) for _ in range(2)]
    middles = [np.empty_like(source) for _ in range(2)]
    tables = [two_step_shares(source, middle, out) for middle, out in zip(middles, outs)]
    alone = two_step_shares(source, np.empty_like(source), np.zeros_like(source))
    chain = part_chain.chain(tables, alone, parts=2)
    with spin_pool.armed(2):
        for _ in range(5):
            for out in outs:
                out[...] = 0
            chain()
            written = [(out != 0).any(axis=(1, 2)) for out in outs]
            # each share written by one table alone, whole
            np.testing.assert_array_equal(written[0] ^ written[1], True)
            np.testing.assert_array_equal(sum(outs), source)


def test_what_cannot_chain_is_refused() -> None:
    source = RNG.standard_normal((SHARES, 96, 96)).astype(np.float32)
    out = np.empty_like(source)
    shares = [[copy(out[share], source[share])] for share in range(SHARES)]
    assert part_chain.chain([shares] * 2, shares, 2) is not None
    # more parts than shares
    assert part_chain.chain([shares] * (SHARES + 1), shares, SHARES + 1) is None
    assert part_chain.chain([], shares, 0) is None
    assert part_chain.chain([shares], shares, 2) is None  # a part without its table
    assert part_chain.chain([shares, shares[:-1]], shares, 2) is None  # tables of unequal shares
    uneven = [*shares[:-1], shares[-1] * 2]
    assert part_chain.chain([uneven] * 2, uneven, 2) is None  # shares of unequal steps
    plain = [[lambda: None] for _ in range(SHARES)]
    assert part_chain.chain([plain] * 2, plain, 2) is None  # a step that is no job
    assert part_chain.chain([[]], [], 1) is None


@pytest.mark.skipif(not gemm_kernel.available(), reason="no GEMM kernel on this machine")
def test_an_epilogue_reaches_every_product_both_ways() -> None:
    """A bias per row and a clamp given to the chain are added by each share's product, in
    the table run armed and in the one run alone."""
    weight = RNG.standard_normal((24, 40)).astype(np.float32)
    bias = RNG.standard_normal(24).astype(np.float32)
    columns = RNG.standard_normal((SHARES, 40, 64)).astype(np.float32)
    out = np.full((24, SHARES * 64), np.nan, np.float32)
    packed = gemm_kernel.pack(weight)
    shares = [[gemm_kernel.bind_packed(packed, columns[share],
                                       out[:, share * 64:(share + 1) * 64])]
              for share in range(SHARES)]
    chain = part_chain.chain([shares, shares], shares, 2).with_epilogue(bias_rows=bias,
                                                                         low=0.0)
    assert len(chain.products()) == 3 * SHARES
    assert chain.writes_within(out)
    want = np.maximum(weight @ np.concatenate(list(columns), axis=1) + bias[:, None], 0)
    chain()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    out[...] = np.nan
    with spin_pool.armed(2):
        chain()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
