"""A bf16 plan's steps as its runs call them, each with its Python objects out of cache (the
layer before evicted them): a direct product without a hand-off is its job alone, one with a
hand-off reads attributes only, a reader's pairing runs in its product's frame; each still
follows its hand-off as it changes between runs, the outputs bit for bit the same."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.cpu import parallel, steady_walk
from engine.kernels import bf16, bf16_handoff, conv_amx, gemm_kernel
from engine.kernels.workspace import Workspace

pytestmark = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX),
                                reason="needs AMX")


@pytest.fixture(autouse=True)
def steps_called() -> Any:
    """Every run calls its steps: these tests change a hand-off between runs, which a plan's
    steps only do as it binds, so a steady run's replay (`steady_walk`) would post the jobs
    recorded before the change rather than call the steps that follow it."""
    steady_walk.use(False)
    yield
    steady_walk.use(True)


def two_convolutions() -> Any:
    """A 3×3 convolution and ReLU whose output a second 3×3 reads as its grid."""
    first = sym.Convolution(sym.var("data"), num_filter=64, kernel=(3, 3), pad=(1, 1),
                            name="first")
    return sym.Convolution(sym.Activation(first, act_type="relu"), num_filter=32,
                           kernel=(3, 3), pad=(1, 1), name="second")


def bound(threads: int) -> tuple[Any, dict[str, np.ndarray]]:
    """The two convolutions' bf16 plan on ``threads`` threads, run once, and its feed."""
    symbol = two_convolutions()
    params = nets.random_params(symbol, (1, 64, 13, 19), seed=7)
    feed = {"data": np.random.default_rng(5).standard_normal((1, 64, 13, 19)).astype(
        np.float32)}
    before = parallel.threads()
    parallel.set_threads(threads)
    try:
        model = engine.load_model(symbol, params, optimize=True, precision="bf16")
        plan = model.plan_for(feed)
    finally:
        parallel.set_threads(before)
    plan.run(feed)
    return plan, feed


def products(plan: Any) -> list[Any]:
    """The direct products of the plan's steps, in order."""
    return [step.call.product for step in plan.steps
            if isinstance(getattr(step.call, "product", None), conv_amx.DirectProduct)]


class Unread:
    """A context no run may read (its reads are bind-time decisions)."""

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError("a run read the product's context")


@pytest.mark.parametrize("threads", [1, 2])
def test_the_writers_run_reads_no_context_and_follows_its_handoff(threads: int) -> None:
    """The first product lays its reader's grid: its runs read no context (whether it adds a
    residual is decided as it is made); withdrawn between runs, the hand-off's next run
    writes the float32 output and the reader pairs it, and taken again, lays it again, each
    run's output the first's bit for bit."""
    plan, feed = bound(threads)
    writer, reader = products(plan)
    assert type(writer) is conv_amx.HandingDirectProduct
    handoff = writer.handoff
    assert handoff.taken and handoff.laid
    want = np.array(plan.run(feed)[0], copy=True)
    writer.context = Unread()
    handoff.withdrawn = True
    handoff.note()
    assert not handoff.taken
    np.testing.assert_array_equal(plan.run(feed)[0], want)
    assert not handoff.laid
    handoff.withdrawn = False
    handoff.note()
    np.testing.assert_array_equal(plan.run(feed)[0], want)
    assert handoff.laid
    assert type(reader) is conv_amx.DirectProduct  # the plan's output: offered to no one


def test_a_product_without_a_handoff_runs_as_its_job() -> None:
    """The reader's product has no Python frame of its own: calling it is its job's call."""
    plan, _ = bound(1)
    reader = products(plan)[1]
    assert reader.handoff is None
    assert type(reader).__call__ is partial.__call__


def test_withdrawn_grid_offers_leave_plain_products() -> None:
    """A layer whose bias a pass adds after its products withdraws their offers: each then a
    plain product over the same job, writing float32 whatever its readers took."""
    plan, _ = bound(1)
    writer = products(plan)[0]
    call = bf16.PairedProduct(bf16._both, lambda: None, writer)
    calls = [call]
    conv_amx.withdraw_grid_offers(calls)
    plain = calls[0].product
    assert type(plain) is conv_amx.DirectProduct and plain.handoff is None
    assert plain.args == writer.args and plain.lays_ever == writer.lays_ever


def test_taken_follows_the_readers_bound_and_a_withdrawal() -> None:
    """``taken`` is kept as binding changes it: the words given, every reader counted, then
    withdrawn."""
    handoff = bf16_handoff.PairedHandoff(2, (16, 32), (32, 0), (1, 32, 4, 4), columns=True)
    workspace = Workspace(np, 0, precision="bf16")
    assert bf16_handoff.words_for(handoff, (16, 32), workspace) is not None
    bf16_handoff.take(handoff, lambda: None)
    assert not handoff.taken  # one reader of two
    bf16_handoff.take(handoff, lambda: None)
    assert handoff.taken
    handoff.withdrawn = True
    handoff.note()
    assert not handoff.taken


@pytest.mark.parametrize("laid", [True, False])
def test_a_readers_pairing_runs_in_its_products_frame(laid: bool) -> None:
    """A hand-off reader's pairing and its product are one call: the pairing skipped where
    the writer laid the words (its copy run instead, where it has one), then the product."""
    ran: list[str] = []
    handoff = bf16_handoff.PairedHandoff(1, (16, 32), (32, 0), (1, 32, 4, 4))
    pair = bf16_handoff.take(handoff, lambda: ran.append("pair"), lambda: ran.append("copy"))
    call = bf16.paired_product(pair, lambda: ran.append("product"))
    assert call.func is not bf16._both
    handoff.laid = laid
    call()
    assert ran == (["copy", "product"] if laid else ["pair", "product"])
    ran.clear()
    plain = bf16.paired_product(lambda: ran.append("pair"), lambda: ran.append("product"))
    plain()
    assert ran == ["pair", "product"] and plain.func is bf16._both
