"""A bf16 1×1 product on AMX whose activation is small, paired by each part of its product
(`bf16.by_parts`, `bf16.PartPairedProduct`): every part pairs the whole activation into words
of its own and multiplies its share of the weight's rows by them; the output is the plain
pairing-then-product's bit for bit, whole, part by part, and in a plan."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.cpu import spin_pool
from engine.kernels import bf16, gemm_amx_handoff, gemm_bind, gemm_kernel
from engine.kernels.workspace import Workspace

pytestmark = pytest.mark.skipif(
    not gemm_kernel.available(gemm_kernel.AMX) or bf16._pair_task("each_part") is None,
    reason="needs AMX and the pairing pass")

TASK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


def product(filters: int, depth: int, pixels: int, workspace: Workspace,
            seed: int = 3) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """A bf16 ``out = weight @ activation`` bound as a 1×1 convolution's (pairing, then the AMX
    product), with its inputs and output."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((filters, depth)).astype(np.float32)
    weight.flags.writeable = False
    activation = rng.standard_normal((depth, pixels)).astype(np.float32)
    out = np.full((filters, pixels), np.nan, np.float32)
    call = gemm_bind._bf16_weight_product(weight, activation, out, workspace)
    assert isinstance(call, bf16.PairedProduct)
    return call, weight, activation, out


def run_part(job: Any, part: int, parts: int) -> None:
    """Part ``part`` of ``parts`` of a `spin_pool.Job`, called on this thread."""
    task, context = job.args[-3], job.args[-2]
    TASK(task)(context, part, parts)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("filters,depth,pixels", [(384, 64, 196), (96, 24, 49), (70, 33, 30)])
def test_each_part_pairs_its_own_words_and_multiplies_its_rows(
        monkeypatch: pytest.MonkeyPatch, threads: int, filters: int, depth: int,
        pixels: int) -> None:
    """Run whole (one part), the job pairs once and multiplies every row; cut in its parts
    and each part run alone, a part writes only its own rows of the output, from words it
    paired itself (the first part's are the product's: left zero while only another part
    runs); either way the output is the plain call's, bit for bit."""
    monkeypatch.setattr(spin_pool, "threads", lambda: threads)
    workspace = Workspace(np, 0, precision="bf16")
    call, _, _, out = product(filters, depth, pixels, workspace)
    call()
    want = out.copy()
    pair, plain = call.args
    assert bf16.parts_pair(pair, plain)
    job = bf16.by_parts(pair, plain, workspace)
    parts = job.args[-1]
    assert parts == min(threads, -(-filters // 32))

    out[...] = np.nan
    run_part(job, 0, 1)
    np.testing.assert_array_equal(out, want)

    words = plain.operands[1]
    blocks = -(-filters // 32)
    for part in reversed(range(parts)):  # the last first: part 0's words still zero then
        out[...] = np.nan
        words[...] = 0
        run_part(job, part, parts)
        first, last = part * blocks // parts * 32, min(filters, (part + 1) * blocks // parts * 32)
        np.testing.assert_array_equal(out[first:last], want[first:last])
        assert np.isnan(out[:first]).all() and np.isnan(out[last:]).all()
        assert (words == 0).all() == (part != 0)


def test_the_job_armed_on_two_threads_writes_the_plain_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spin_pool, "threads", lambda: 2)
    workspace = Workspace(np, 0, precision="bf16")
    call, _, _, out = product(384, 64, 196, workspace)
    call()
    want = out.copy()
    parted = bf16.by_parts(*call.args, workspace)
    assert parted.args[-1] == 2
    for _ in range(20):
        out[...] = np.nan
        with spin_pool.armed(2):
            parted()
        np.testing.assert_array_equal(out, want)


def test_large_activations_products_by_columns_or_one_block_are_not_parted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Words past `PART_PAIRED_BYTES` (pairing on every part costs more than the crossing),
    a product walking column panels outside (its weight smaller than its words: parted, its
    output's rows would move between threads), a single block of 32 rows, or runs on one
    thread: the plain pairing job, then the product."""
    monkeypatch.setattr(spin_pool, "threads", lambda: 2)
    workspace = Workspace(np, 0, precision="bf16")
    assert bf16.parts_pair(*product(256, 64, 196, workspace)[0].args)
    assert not bf16.parts_pair(*product(1280, 64, 1024, workspace)[0].args)  # 128 KB words
    assert not bf16.parts_pair(*product(128, 64, 196, workspace)[0].args)  # by columns
    assert not bf16.parts_pair(*product(32, 64, 196, workspace)[0].args)
    monkeypatch.setattr(spin_pool, "threads", lambda: 1)
    assert not bf16.parts_pair(*product(256, 64, 196, workspace)[0].args)


def expanding(data: Any, reader: str) -> Any:
    """A 1×1 expansion of 24 channels into 96 with relu6, read by a depthwise 3×3
    (``depthwise``), or into 256 read by a direct 3×3 convolution (``grid``: the expansion
    writes that reader's grid of pairs); or (``residual``) a 1×1 product of 96
    into 96 channels adding its input, then read by a 1×1 projection."""
    if reader == "residual":
        widened = sym.Convolution(data, num_filter=96, kernel=(1, 1), name="widen")
        expand = sym.Convolution(widened, num_filter=96, kernel=(1, 1), name="expand") + widened
        return sym.Convolution(sym.clip(expand, a_min=0.0, a_max=6.0), num_filter=24,
                               kernel=(1, 1), name="project")
    filters = 256 if reader == "grid" else 96
    expand = sym.clip(sym.Convolution(data, num_filter=filters, kernel=(1, 1), name="expand"),
                      a_min=0.0, a_max=6.0)
    if reader == "grid":
        return sym.Convolution(expand, num_filter=32, kernel=(3, 3), pad=(1, 1), name="next")
    return sym.Convolution(expand, num_filter=96, num_group=96, kernel=(3, 3), pad=(1, 1),
                           name="dw")


def answers(symbol: Any, params: dict, feed: dict, precision: str,
            monkeypatch: pytest.MonkeyPatch, parted: bool = True) -> np.ndarray:
    """The plan's output, equal over 12 runs (on every core and on one thread, where the
    process has two cores), with `PartPairedProduct` steps or (``parted`` False) without."""
    with monkeypatch.context() as patched:
        if not parted:
            patched.setattr(bf16, "parts_pair", lambda pair, product: False)
        model = engine.load_model(symbol, params, optimize=True, precision=precision)
        outputs = [np.asarray(next(iter(model.infer(feed).values()))).copy()
                   for _ in range(12)]
    for output in outputs[1:]:
        np.testing.assert_array_equal(output, outputs[0])
    return outputs[0]


@pytest.mark.parametrize("reader,side", [("depthwise", 7), ("residual", 7), ("grid", 14)])
def test_a_plan_parts_its_small_expansion_and_answers_as_before(
        monkeypatch: pytest.MonkeyPatch, reader: str, side: int) -> None:
    """Bound in a bf16 plan at batch 1, a 1×1 product whose weight outweighs its small
    activation is parted, with its bias, clamp and residual (and where its reader takes its
    grid, lays it through the plain pairing), and the plan answers bit for bit what it
    answers without, near fp32."""
    monkeypatch.setattr(spin_pool, "threads", lambda: 2)
    made: list[Any] = []
    original = bf16.PartPairedProduct.__init__

    def counted(self: Any, *args: Any) -> None:
        original(self, *args)
        made.append(self)

    monkeypatch.setattr(bf16.PartPairedProduct, "__init__", counted)
    laid: list[bool] = []
    handing = gemm_amx_handoff.HandingProduct.__call__

    def watched(self: Any) -> None:
        handing(self)
        laid.append(self.handoff.laid)

    monkeypatch.setattr(gemm_amx_handoff.HandingProduct, "__call__", watched)
    symbol = expanding(sym.var("data"), reader)
    shape = (1, 24, side, side)
    params = nets.random_params(symbol, shape, seed=6)
    feed = {"data": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
    got = answers(symbol, params, feed, "bf16", monkeypatch)
    assert made, "no product was parted"
    assert any(laid) == (reader == "grid")
    np.testing.assert_array_equal(got, answers(symbol, params, feed, "bf16", monkeypatch,
                                               parted=False))
    reference = answers(symbol, params, feed, "fp32", monkeypatch)
    assert np.abs(got - reference).max() <= 0.03 * np.abs(reference).max()


@pytest.mark.parametrize("lays_ever", [True, False])
def test_a_handing_product_lays_its_readers_layout_through_the_plain_pairing(
        lays_ever: bool) -> None:
    """On runs where every reader took the hand-off (and the product adds no residual), the
    parted call pairs once and runs the handing product, which lays the layout; on the others
    its parts write the float32 output and the hand-off is marked not laid."""

    class Handoff:
        taken, laid = False, True

    class Handing:
        def __init__(self, plain: Any) -> None:
            self.plain, self.handoff, self.lays_ever, self.ran = plain, Handoff(), lays_ever, 0

        def __call__(self) -> None:
            self.ran += 1
            self.handoff.laid = True

    workspace = Workspace(np, 0, precision="bf16")
    call, _, _, out = product(384, 64, 196, workspace)
    pair, plain = call.args
    call()
    want = out.copy()
    handing = Handing(plain)
    paired = bf16.PartPairedProduct(call.func, pair, handing, workspace)
    for taken in (True, False, True):
        handing.handoff.taken = taken
        out[...] = np.nan
        ran = handing.ran
        paired()
        laying = taken and lays_ever
        assert handing.ran == ran + laying and handing.handoff.laid is laying
        if laying:
            assert np.isnan(out).all()
        else:
            np.testing.assert_array_equal(out, want)
