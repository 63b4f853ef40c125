"""The spin pool (`engine.cpu.spin_pool`) and the jobs made of kernels (`kernel_jobs`,
`strided_kernel`): every part runs once, on several threads while armed, and the results equal
the calls they replace."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from functools import partial
from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.cpu import blas_threads, kernel_jobs, spin_pool, usable_cores
from engine.kernels import gemm_kernel, strided_kernel
from engine.runtime import plan as plan_module

pytestmark = [
    pytest.mark.skipif(not spin_pool.available() or not gemm_kernel.available(),
                       reason="llvmlite or numba cannot compile for this CPU"),
    # The recording kernel calls pthread_self through ctypes: its task cannot be cached.
    pytest.mark.filterwarnings("ignore:Cannot cache compiled function"),
]

RNG = np.random.default_rng(11)
_pthread_self = ctypes.CDLL(None).pthread_self
_pthread_self.restype = ctypes.c_uint64
_pthread_self.argtypes = []
_thread_id = _pthread_self  # numba calls a ctypes function natively


def _record(threads, counts, work, first, last):  # pragma: no cover - runs compiled
    """For each index of the range, the native thread that ran it and how many times it ran;
    with ``work`` iterations of busy work per index."""
    for index in range(first, last):
        total = 0.0
        for step in range(work):
            total += np.sqrt(step + index)
        threads[index] = _thread_id()
        counts[index] += 1 + 0 * int(total > -1)


def _fill(scratch, out, first, last):  # pragma: no cover - runs compiled
    scratch[:] = first  # this part's own slice
    for index in range(first, last):
        out[index] = scratch[0]


_compiled: dict = {}


def compiled_kernels() -> dict:
    """This module's kernels, as `kernel_jobs` finds them by name."""
    if not _compiled:
        from numba import njit

        _compiled.update(record=njit(nogil=True)(_record), fill=njit(nogil=True)(_fill))
    return _compiled


RECORD = (__name__, "record")


def record_job(size: int, parts: int, work: int = 0) -> tuple:
    threads = np.zeros(size, np.uint64)
    counts = np.zeros(size, np.int64)
    job = kernel_jobs.bind(RECORD, (threads, counts, work), size, parts)
    assert job is not None
    return job, threads, counts


@pytest.mark.parametrize(("cores", "parts", "balanced"), [
    (2, 1, 1), (2, 2, 2), (2, 7, 8), (2, 8, 8), (3, 4, 6), (4, 3, 3)])
def test_balanced_parts_are_a_multiple_of_the_cores_past_them(
        monkeypatch: pytest.MonkeyPatch, cores: int, parts: int, balanced: int) -> None:
    """More parts than cores come in a number the cores divide (rounded up); fewer stay."""
    monkeypatch.setattr(spin_pool, "cores", lambda: cores)
    assert spin_pool.balanced(parts) == balanced


def test_a_job_runs_every_part_once_alone_and_armed() -> None:
    job, threads, counts = record_job(1000, 7)
    job()
    assert (counts == 1).all()
    assert set(threads) == {_pthread_self()}  # not armed: all on the calling thread
    with spin_pool.armed(2) as count:
        assert count == 2
        for _ in range(50):
            job()
    assert (counts == 51).all()


def test_armed_jobs_run_on_several_threads() -> None:
    job, threads, counts = record_job(64, 16, work=2000)
    seen: set[int] = set()
    # Until a worker takes a part, for seconds if need be: on a machine whose cores are busy
    # with other work, the woken worker may wait that long for one.
    deadline = time.monotonic() + 10
    with spin_pool.armed(2):
        while len(seen) < 2 and time.monotonic() < deadline:
            job()
            seen |= set(threads.tolist())
    assert len(seen) >= 2, "no part ran on a worker while armed"
    assert counts.min() == counts.max()


def test_jobs_from_several_threads_at_once_each_run_whole() -> None:
    """Callers on several threads share one pool: a job posted while another's is runs alone
    on its caller, and every part of every job runs exactly once."""
    jobs = [record_job(int(RNG.integers(1, 300)), int(RNG.integers(1, 9))) for _ in range(4)]
    errors: list[BaseException] = []

    def call(job) -> None:
        try:
            with spin_pool.armed(2):
                for _ in range(300):
                    job()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    callers = [threading.Thread(target=call, args=(job,)) for job, _, _ in jobs]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert not errors
    for _, _, counts in jobs:
        assert (counts == 300).all()


def test_armed_holds_blas_to_one_thread_and_gives_it_back() -> None:
    if blas_threads.numpy_openblas() is None:
        pytest.skip("numpy's BLAS is not its bundled OpenBLAS")
    before = blas_threads.threads()
    with spin_pool.armed(2) as count:
        assert count == min(2, spin_pool.cores())
        if count == 2:
            assert blas_threads.threads() == 1
    assert blas_threads.threads() == before


def test_an_armed_run_holds_its_caller_and_each_worker_to_cores_of_their_own() -> None:
    """While a run is armed its caller runs on the core it armed on alone, and every worker
    on another core, one each; disarmed, the caller may run anywhere again. Left free, the
    kernel woke a worker on the caller's core after an idle pause (or the caller on the
    worker's), and the two shared it for a run or two."""
    if spin_pool.cores() < 2 or "linux" not in sys.platform or not spin_pool.available():
        pytest.skip("cores are held on Linux, among two cores or more")
    job, _, _ = record_job(100, 4)
    everywhere = set(usable_cores.cpus())
    for _ in range(3):
        with spin_pool.armed(2):
            job()
            caller = os.sched_getaffinity(0)
            pool = spin_pool._pool()
            deadline = time.monotonic() + 60  # the worker notes its id once it runs
            while None in pool.native_ids and time.monotonic() < deadline:
                time.sleep(0.01)
            workers = [os.sched_getaffinity(thread) for thread in pool.native_ids]
        assert len(caller) == 1 and caller <= everywhere
        assert all(len(held) == 1 and held <= everywhere - caller for held in workers)
        assert len(set().union(*workers)) == len(workers)  # a core each
        assert os.sched_getaffinity(0) == everywhere
        time.sleep(0.1)  # an idle pause: the workers park, the caller may move


def test_idle_workers_doze_then_park_off_the_cpu() -> None:
    job, _, _ = record_job(100, 4)
    with spin_pool.armed(2):
        job()
    time.sleep(spin_pool.GRACE_SECONDS * 5)  # past the spinning: dozing, nearly off the CPU
    start = time.process_time()
    time.sleep(0.2)
    assert time.process_time() - start < 0.05
    with spin_pool.armed(2):  # a run while they doze finds them
        job()
    pool = spin_pool._pool()
    deadline = time.monotonic() + 60  # a busy machine's sleeps overrun their 100 µs
    while pool.parked < len(pool.workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.parked == len(pool.workers)  # on the condition, off the CPU


def test_armed_workers_without_parts_nap_off_the_cpu_and_wake_for_a_job() -> None:
    """Inside an armed run, a worker that finds no part for `NAP_SECONDS` naps on a futex
    rather than spinning on: a run's steps on the caller alone (or a core taken by another
    process) cost no second core, and the next job posted wakes it."""
    if spin_pool.cores() < 2 or "linux" not in sys.platform:
        pytest.skip("naps are Linux's futex, among two cores or more")
    job, threads, _ = record_job(64, 16, work=2000)
    with spin_pool.armed(2):
        job()
        time.sleep(0.05)  # past the naps' patience: every worker naps
        start = time.process_time()
        time.sleep(0.3)
        # Spinning, a worker would burn about 0.3 s of CPU; napping, it wakes once a
        # millisecond (the nap's timeout) to look again.
        assert time.process_time() - start < 0.1
        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            job()
            seen |= set(threads.tolist())
    assert len(seen) >= 2, "no napping worker woke for a job"


@pytest.mark.parametrize("triple, naps", [("x86_64-unknown-linux-gnu", True),
                                           ("aarch64-unknown-linux-gnu", True),
                                           ("x86_64-apple-darwin", False),
                                           ("x86_64-pc-windows-msvc", False),
                                           ("riscv64-unknown-linux-gnu", False)])
def test_the_pool_builds_for_each_target_napping_only_on_a_known_linux_futex(
        triple: str, naps: bool) -> None:
    import llvmlite.binding as llvm

    from engine.cpu import spin_ir

    built = llvm.parse_assembly(str(spin_ir.module(triple)))
    built.verify()
    assert ("@syscall" in str(built)) == naps


def test_parts_are_capped_and_a_lone_part_runs_inline() -> None:
    job, _, counts = record_job(10, spin_pool.MAX_PARTS + 5)
    assert job.args[-1] == spin_pool.MAX_PARTS
    with spin_pool.armed(2):
        job()
    assert (counts == 1).all()
    single, _, counts = record_job(10, 1)
    with spin_pool.armed(2):
        single()
    assert (counts == 1).all()


def test_kernel_jobs_refuse_what_they_cannot_pass() -> None:
    threads = np.zeros(20, np.uint64)[::2]  # not contiguous
    assert kernel_jobs.bind(RECORD, (threads, np.zeros(10, np.int64), 0), 10, 2) is None
    assert kernel_jobs.bind(RECORD, (np.zeros(10, np.uint64), np.zeros(10, np.int64), "x"),
                            10, 2) is None


def test_per_part_scratch_is_one_slice_per_part() -> None:
    parts = 5
    scratch, out = np.zeros((parts, 3), np.int64), np.full(23, -1, np.int64)
    job = kernel_jobs.bind((__name__, "fill"), (scratch, out), 23, parts,
                           per_part=frozenset({0}))
    with spin_pool.armed(2):
        job()
    bounds = [part * 23 // parts for part in range(parts + 1)]
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        assert (out[start:stop] == start).all()


def strided_pairs() -> list:
    base = RNG.standard_normal((3, 40, 50)).astype(np.float32)
    padded = np.zeros((3, 44, 54), np.float32)
    return [
        (np.empty((50, 40), np.float32), base[0].T),  # a transpose
        (np.empty((3, 20, 25), np.float32), base[:, ::2, ::2]),  # stride 2 (im2col)
        (padded[:, 2:42, 2:52], base),  # into an interior
        (np.empty(6000, np.float32), base.reshape(-1)[:6000]),  # 1-D
        (np.empty((2, 3, 5, 1, 7, 40), np.float64),
         RNG.standard_normal((40, 7, 1, 5, 3, 2)).transpose(5, 4, 3, 2, 1, 0)),  # 6-D
    ]


@pytest.mark.parametrize("armed", [False, True])
def test_strided_copies_equal_numpy(armed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strided_kernel, "MIN_ELEMENTS", 1)
    for target, source in strided_pairs():
        job = strided_kernel.job(0, target, source, source)
        assert job is not None, (target.shape, source.strides)
        target[...] = np.nan
        with spin_pool.armed(2 if armed else 1):
            job()
        np.testing.assert_array_equal(target, source)


def test_rows_of_one_buffer_copy_into_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rows of every plane of one buffer: their spans interleave, their elements are
    apart, so the copy is a job (a band buffer's rows above, `banded_pool`)."""
    monkeypatch.setattr(strided_kernel, "MIN_ELEMENTS", 1)
    buffer = RNG.standard_normal((64, 17, 112)).astype(np.float32)
    want = buffer.copy()
    want[:, 0:2] = buffer[:, 15:17]
    job = strided_kernel.job(0, buffer[:, 0:2], buffer[:, 15:17], buffer[:, 15:17])
    assert job is not None
    job()
    np.testing.assert_array_equal(buffer, want)


def test_copies_not_taken() -> None:
    data = np.arange(40000, dtype=np.float32)
    def copy(target, source):
        return strided_kernel.job(0, target, source, source)

    assert copy(data[1:], data[:-1]) is None  # overlapping
    rows = data.reshape(100, 4, 100)
    assert copy(rows[:, 0:2], rows[:, 1:3]) is None  # the same rows of one buffer, shifted
    assert copy(np.empty(39999, np.float32), data[::-1][1:]) is None  # negative
    assert copy(np.empty(100, np.float32), data[:100]) is None  # too small
    assert copy(np.empty(40000, np.float64), data) is None  # a cast


def test_a_batch_of_products_is_one_job() -> None:
    a = RNG.standard_normal((16, 40, 30)).astype(np.float32)
    b = RNG.standard_normal((16, 30, 70)).astype(np.float32)
    frame = np.full((16, 41, 70), np.nan, np.float32)
    c = frame[:, :40]  # a step between products larger than one's size
    product = gemm_kernel.bind_packed_batch(gemm_kernel.pack_each(a), b, c)
    with spin_pool.armed(2):
        product()
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert np.isnan(frame[:, 40]).all()  # nothing written past each product


def resnet_block() -> sym.Symbol:
    data = sym.var("data")
    stem = sym.Activation(sym.Convolution(data, num_filter=64, kernel=(3, 3), pad=(1, 1),
                                          name="stem"), act_type="relu")
    body = sym.Convolution(stem, num_filter=64, kernel=(3, 3), pad=(1, 1), name="body")
    wide = sym.Convolution(stem, num_filter=64, kernel=(3, 3), stride=(2, 2), pad=(1, 1),
                           name="strided")
    depthwise = sym.clip(sym.Convolution(wide, num_filter=64, num_group=64, kernel=(3, 3),
                                         pad=(1, 1), name="depthwise"), a_min=0, a_max=6)
    pooled = sym.Pooling(sym.Activation(body + stem, act_type="relu"), kernel=(2, 2),
                         stride=(2, 2), pool_type="max")
    return sym.FullyConnected(sym.flatten(pooled + depthwise), num_hidden=10, name="dense")


def test_a_plan_spinning_over_two_threads_equals_the_reference() -> None:
    symbol = resnet_block()
    args, _, _ = symbol.infer_shape(data=(1, 64, 28, 28))
    params = {name: (RNG.standard_normal(shape) * 0.1).astype(np.float32)
              for name, shape in zip(symbol.list_arguments(), args) if name != "data"}
    plan = assert_agrees_armed_and_not(symbol, params, (1, 64, 28, 28), atol=1e-3)
    assert plan._spins  # it has jobs of several parts


def assert_agrees_armed_and_not(symbol, params: dict, shape: tuple, atol: float):
    """The optimised plan for ``shape`` (returned) agrees with the reference interpreter run
    on one thread and armed over two."""
    optimised = engine.load_model(symbol, params, optimize=True)
    reference = engine.load_model(symbol, params, optimize=False)
    feed = {"data": RNG.standard_normal(shape).astype(np.float32)}
    want = reference.infer(feed)
    for threads in (1, 2):
        with spin_pool.armed(threads):
            got = optimised.infer(feed)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=atol)
    return optimised.plan_for(feed)


def test_a_batch_1_dense_layer_is_our_product_on_every_core() -> None:
    data = sym.var("data")
    symbol = sym.Activation(sym.FullyConnected(data, num_hidden=256, name="dense"),
                            act_type="relu")
    params = {"dense_weight": RNG.standard_normal((256, 512)).astype(np.float32),
              "dense_bias": RNG.standard_normal(256).astype(np.float32)}
    plan = assert_agrees_armed_and_not(symbol, params, (1, 512), atol=1e-4)
    products = [step.call for step in plan.steps if isinstance(step.call, gemm_kernel.Product)]
    assert len(products) == len(plan.steps) == 1  # bias and ReLU applied as it stores
    assert products[0].args[-1] > 1  # cut into parts: one row, but many tiles


def test_a_plan_keeps_the_faster_way_and_notices_a_change() -> None:
    choice = spin_pool.Choice()

    def run(armed_seconds: float, alone_seconds: float, runs: int) -> float:
        """Share of ``runs`` the choice ran armed, each way taking the given time."""
        armed_runs = 0
        for _ in range(runs):
            armed = choice.armed()
            armed_runs += armed
            choice.record(armed, armed_seconds if armed else alone_seconds)
        return armed_runs / runs

    assert run(0.017, 0.029, 200) > 0.9  # two cores that work: armed
    # The second core gone (a shared machine's neighbour): within a few explorations the
    # runs stay on one thread, trying the other way now and then.
    run(0.030, 0.029, 4 * spin_pool.Choice.EXPLORE * spin_pool.Choice.SAMPLES)
    share = run(0.030, 0.029, 200)
    assert 0 < share < 0.1
    # And back: the first exploring run that wins is followed by more at once, so armed is
    # the way again within one exploration's wait and `SAMPLES` runs.
    wait = spin_pool.Choice.EXPLORE + spin_pool.Choice.SAMPLES
    run(0.017, 0.029, wait)
    assert run(0.017, 0.029, 200) > 0.95  # (one run in `EXPLORE` on one thread)


def test_first_samples_taken_under_contention_are_checked_again_early() -> None:
    choice = spin_pool.Choice()
    armed_runs = []
    for run in range(1, spin_pool.Choice.EXPLORE):
        settled = run > 7  # the first runs meet a machine still busy starting up
        armed = choice.armed()
        armed_runs.append(armed)
        choice.record(armed, (0.017 if settled else 0.045) if armed else
                      (0.024 if settled else 0.031))
    # Armed lost while the machine was busy (runs 9 to 15 on one thread); once it settles, the
    # exploration at run 16 finds it faster, its follow-up at run 17 makes it the way taken,
    # and no run after goes back to one thread to follow that up: armed from run 16 on, long
    # before the EXPLORE-th run would have looked again.
    assert not any(armed_runs[8:15]) and all(armed_runs[15:]), armed_runs


class FakeClock:
    """A clock the test moves: each run takes its own time, each pause its own."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def take_turns(choice: spin_pool.Choice, clock: FakeClock, turns: int, runs: int,
               armed_seconds: float, alone_seconds: float, cold_extra: float,
               pause: float = 0.5) -> list[str]:
    """Runs in turns as `bench/executor.py` gives them: a pause, then ``runs`` back to back,
    the first of them ``cold_extra`` slower either way (its data gone from the caches). Each
    turn as a string, "A" for an armed run, "o" for one on one thread."""
    rows = []
    for _ in range(turns):
        clock.now += pause
        row = ""
        for index in range(runs):
            armed = choice.armed()
            seconds = (armed_seconds if armed else alone_seconds) + (cold_extra if index == 0
                                                                      else 0.0)
            clock.now += seconds
            choice.record(armed, seconds)
            row += "A" if armed else "o"
        rows.append(row)
    return rows


def test_a_choice_made_among_busy_neighbours_is_tried_again_when_runs_come_in_turns() -> None:
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    for _ in range(70):  # start-up, back to back, neighbours loading: armed loses
        armed = choice.armed()
        seconds = 0.012 if armed else 0.0077
        clock.now += seconds
        choice.record(armed, seconds)
    # Then turns of two runs half a second apart, the machine quiet: armed wins. Counting
    # runs alone, the plan stayed on one thread until the 96th run (turn 13).
    rows = take_turns(choice, clock, 12, 2, 0.005, 0.008, 0.003)
    assert all(row == "AA" for row in rows[3:8]), rows
    # From then on one thread only for the explorations of runs far apart: one run of each
    # kind in EXPLORE / 4 at most.
    later = "".join(rows[3:])
    assert later.count("o") <= 2 * (len(later) // 2 // (spin_pool.Choice.EXPLORE // 4)), rows


def test_runs_after_an_idle_pause_are_weighed_against_each_other() -> None:
    """Three runs a turn, the first 30 ms slower either way: compared with the others, the
    slow first runs sent the plan to one thread for turns at a time where armed wins by
    a quarter."""
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    rows = take_turns(choice, clock, 24, 3, 0.060, 0.080, 0.030, pause=2.0)
    later = "".join(rows[4:])
    assert later.count("A") >= 0.85 * len(later), rows


def test_explorations_of_runs_far_apart_back_off_while_the_way_taken_keeps_winning() -> None:
    """Turns of five runs 2.5 s apart, armed a third faster throughout: trying one thread
    every `EXPLORE` / 4 runs of a kind put 33 of 250 runs on it; backing off, at most 6%.
    A slower armed way is still left within a turn (its own samples show it)."""
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    rows = take_turns(choice, clock, 60, 5, 0.020, 0.030, 0.010, pause=2.5)
    later = "".join(rows[10:])
    assert 0 < later.count("o") <= 0.06 * len(later), rows
    rows = take_turns(choice, clock, 12, 5, 0.040, 0.030, 0.010, pause=2.5)
    later = "".join(rows[2:])
    assert later.count("A") <= 0.1 * len(later), rows


def test_back_to_back_runs_explore_no_more_often_than_every_explore_runs() -> None:
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    rows = take_turns(choice, clock, 1, 40 * spin_pool.Choice.EXPLORE, 0.017, 0.029, 0.0)
    later = rows[0][2 * spin_pool.Choice.EXPLORE:]
    assert 0 < later.count("o") <= len(later) / spin_pool.Choice.EXPLORE + 1, later


def test_a_way_far_slower_is_tried_less_often_until_the_taken_way_slows_toward_it() -> None:
    """Armed at 9.9 ms, one thread at 19.5: one thread is tried every `EXPLORE` ·
    `WIDE_SPACING` runs, not every `EXPLORE`, back to back and in turns alike. Where the margin
    is narrow (17 against 21 ms) the spacing stays `EXPLORE`; and once the armed runs slow
    to 19 ms the margin narrows, and the choice goes to one thread (now 15 ms) within one
    ordinary spacing."""
    spacing = spin_pool.Choice.EXPLORE * spin_pool.Choice.WIDE_SPACING
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    stream = take_turns(choice, clock, 1, 12 * spacing, 0.0099, 0.0195, 0.0)[0]
    later = stream[2 * spacing:]
    assert 0 < later.count("o") <= len(later) / spacing + 1, later
    narrow = spin_pool.Choice(clock=clock)
    stream = take_turns(narrow, clock, 1, 12 * spacing, 0.017, 0.021, 0.0)[0]
    later = stream[2 * spacing:]
    assert later.count("o") >= len(later) / spin_pool.Choice.EXPLORE - 1, later
    turns = take_turns(choice, clock, 120, 7, 0.0099, 0.0195, 0.001, pause=1.0)
    later = "".join(turns[20:])
    assert later.count("o") <= len(later) / spacing + 2, turns
    # The armed way slows (the second vCPU lent elsewhere) and one thread speeds up.
    stream = take_turns(choice, clock, 1, 2 * spin_pool.Choice.EXPLORE + 8, 0.019, 0.015,
                        0.0)[0]
    assert stream.endswith("o" * 8), stream


def test_armed_runs_far_slower_than_one_threads_are_tried_at_the_ordinary_spacing() -> None:
    """A slow spell of armed runs (30 ms against one thread's 15: the other vCPU lent
    elsewhere) sends the plan to one thread; once armed runs take 8 ms again the plan is back
    on them within one `EXPLORE` spacing, not `WIDE_SPACING` of them."""
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    slow = take_turns(choice, clock, 1, 4 * spin_pool.Choice.EXPLORE + 4, 0.030, 0.015, 0.0)[0]
    assert slow[-spin_pool.Choice.EXPLORE:].count("o") >= spin_pool.Choice.EXPLORE - 1, slow
    stream = take_turns(choice, clock, 1, spin_pool.Choice.EXPLORE + 8, 0.008, 0.015, 0.0)[0]
    assert stream.endswith("A" * 8), stream


def run_stream(choice: spin_pool.Choice, clock: FakeClock, runs: int, armed_seconds: float,
               alone_seconds: float, burst: int = 0, armed_factor: float = 1.0,
               alone_factor: float = 1.0) -> str:
    """``runs`` back to back, the first ``burst`` of them slower by the factors (a burst of the
    host's noise): "A" for each armed run, "o" for each on one thread."""
    row = ""
    for index in range(runs):
        armed = choice.armed()
        seconds = armed_seconds if armed else alone_seconds
        if index < burst:
            seconds *= armed_factor if armed else alone_factor
        clock.now += seconds
        choice.record(armed, seconds)
        row += "A" if armed else "o"
    return row


@pytest.mark.parametrize("burst", [3, 5])
@pytest.mark.parametrize("alone_factor", [1.0, 1.5], ids=["armed-only", "both-ways"])
def test_a_burst_of_slow_runs_leaves_armed_the_way_where_it_is_clearly_faster(
        burst: int, alone_factor: float) -> None:
    """Armed 0.6x one thread, then a burst of runs with armed 2.5x slower (one thread too, or
    not): a median of three samples a way went one thread on the burst's second run and stayed
    there until the next exploration, 25 runs at 1.7x an armed one."""
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    run_stream(choice, clock, 100, 0.006, 0.010)
    rows = run_stream(choice, clock, 60, 0.006, 0.010, burst, 2.5, alone_factor)
    assert rows.count("o") <= 2, rows  # the explorations at runs 128 and 160 at most


def test_a_burst_inside_a_turn_leaves_the_next_turns_armed() -> None:
    """The executor benchmark's fp32 MobileNet v2 process: turns of ten runs 1.5 s apart, armed
    10 ms against 14 on one thread; three armed runs of one turn at 18-20 ms sent the plan to
    one thread for its last two turns."""
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    take_turns(choice, clock, 8, 10, 0.010, 0.014, 0.004, pause=1.5)
    clock.now += 1.5
    for index, burst_seconds in enumerate((0.0, 0.0, 0.0, 0.018, 0.020, 0.019, 0, 0, 0, 0)):
        armed = choice.armed()
        seconds = (burst_seconds or 0.010) if armed else 0.014
        clock.now += seconds + (0.004 if index == 0 else 0.0)
        choice.record(armed, seconds + (0.004 if index == 0 else 0.0))
    rows = take_turns(choice, clock, 3, 10, 0.010, 0.014, 0.004, pause=1.5)
    assert all(row.count("o") <= 1 for row in rows), rows  # an exploration a turn at most


def test_a_lasting_change_still_leaves_the_slower_way_within_kept_runs() -> None:
    """Armed from 0.6x one thread to the shared machine's 30 ms against 29: one thread from
    the `KEPT`-th run of the change on (a seventh slow sample in eight), before the next
    exploration would look."""
    clock = FakeClock()
    choice = spin_pool.Choice(clock=clock)
    run_stream(choice, clock, 100, 0.017, 0.029)
    rows = run_stream(choice, clock, 27, 0.030, 0.029)  # runs 101 to 127
    switch = spin_pool.Choice.KEPT[0] - 1
    assert rows[switch:] == "o" * (len(rows) - switch), rows


def test_a_plan_that_leaves_blas_alone_keeps_the_workers_spinning_between_runs() -> None:
    data = sym.var("data")
    symbol = sym.FullyConnected(data, num_hidden=256, name="dense")
    params = {"dense_weight": RNG.standard_normal((256, 512)).astype(np.float32),
              "dense_bias": RNG.standard_normal(256).astype(np.float32)}
    model = engine.load_model(symbol, params, optimize=True)
    feed = {"data": RNG.standard_normal((1, 512)).astype(np.float32)}
    model.infer(feed)
    plan = model.plan_for(feed)
    assert not plan._hold_blas  # our product only: BLAS never spreads work here
    if spin_pool.threads() < 2:
        pytest.skip("one core or one BLAS thread: nothing spins")
    state = spin_pool._pool().state
    patience = int(state[spin_pool.PATIENCE])
    # The workers give up 2 ms after the run; this thread, descheduled on a busy machine, may
    # look later than that (it failed CI once): no giving up until it has looked.
    state[spin_pool.PATIENCE] = 1 << 62
    try:
        got = model.infer(feed)["dense_output"]
        assert state[spin_pool.STICKY] == 1  # spinning on, without a run armed
    finally:
        state[spin_pool.PATIENCE] = patience
    np.testing.assert_allclose(got, feed["data"] @ params["dense_weight"].T
                               + params["dense_bias"], rtol=1e-4, atol=1e-4)
    deadline = time.monotonic() + 20 * spin_pool.GRACE_SECONDS + 1
    while state[spin_pool.STICKY] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state[spin_pool.STICKY] == 0  # lapsed once the workers ran out of patience


def test_quiet_for_blas_tells_apart_what_blas_may_spread() -> None:
    small = partial(np.dot, np.ones((1, 128), np.float32), np.ones((128, 2), np.float32),
                    np.empty((1, 2), np.float32))
    large = partial(np.dot, np.ones((64, 512), np.float32), np.ones((512, 256), np.float32),
                    np.empty((64, 256), np.float32))
    assert spin_pool.quiet_for_blas(small)
    assert not spin_pool.quiet_for_blas(large)
    assert spin_pool.quiet_for_blas(partial(np.add, np.ones(3), np.ones(3), np.empty(3)))
    assert not spin_pool.quiet_for_blas(partial(np.linalg.inv, np.eye(3)))  # unknown: held


def test_a_long_plan_that_leaves_blas_alone_goes_by_choice_after_its_first_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = sym.var("data")
    symbol = sym.FullyConnected(data, num_hidden=256, name="dense")
    params = {"dense_weight": RNG.standard_normal((256, 512)).astype(np.float32),
              "dense_bias": RNG.standard_normal(256).astype(np.float32)}
    feed = {"data": RNG.standard_normal((1, 512)).astype(np.float32)}
    if spin_pool.threads() < 2:
        pytest.skip("one core or one BLAS thread: nothing spins")
    # Runs of microseconds stay stuck; taken as long (the threshold at 0), the plan's runs
    # after its first `STUCK_TRIES` go by its `Choice`, and the workers are unstuck.
    for threshold, chosen_runs in ((1e9, 0), (0.0, 2)):
        monkeypatch.setattr(plan_module, "STUCK_SECONDS", threshold)
        plan = engine.load_model(symbol, params, optimize=True).plan_for(feed)
        assert not plan._hold_blas
        chosen = spy_on_choice(plan, monkeypatch)
        for _ in range(plan_module.STUCK_TRIES + 2):
            got = plan.run(feed)[0]
        assert len(chosen) == chosen_runs
        assert len(plan._stuck_times) == plan_module.STUCK_TRIES  # nothing kept per run after
        np.testing.assert_allclose(got, feed["data"] @ params["dense_weight"].T
                                   + params["dense_bias"], rtol=1e-4, atol=1e-4)


def spy_on_choice(plan: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A list that gains an entry for each run of ``plan`` its `Choice` decides."""
    chosen: list[bool] = []
    run_spinning = plan._run_spinning

    def spied(run_steps: Any, record: bool) -> None:
        chosen.append(True)
        run_spinning(run_steps, record)

    monkeypatch.setattr(plan, "_run_spinning", spied)
    return chosen


@pytest.mark.parametrize("armed", [False, True])
def test_strided_sums_of_a_transpose_equal_numpy(armed: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A transposed product's scratch added to a residual as it is copied into place (the
    rows gathered a column of the scratch at a time)."""
    monkeypatch.setattr(strided_kernel, "MIN_ELEMENTS", 1)
    scratch = RNG.standard_normal((49, 160)).astype(np.float32)
    residual = RNG.standard_normal((160, 49)).astype(np.float32)
    target = np.full((160, 49), np.nan, np.float32)
    job = strided_kernel.job(1, target, scratch.T, residual)
    assert job is not None
    with spin_pool.armed(2 if armed else 1):
        job()
    np.testing.assert_array_equal(target, scratch.T + residual)
