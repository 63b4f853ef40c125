"""A plan's steady runs replayed as the jobs its steps post (`engine.cpu.steady_walk`)."""

from __future__ import annotations

import threading
from functools import partial

import numpy as np
import pytest

import engine
from bench import nets
from engine.cpu import spin_pool, steady_walk
from engine.graph.ir import make_node
from engine.kernels import int8_conv
from engine.ops.quantized import integer, ranges
from engine.runtime.plan import Step
from tests.engine.ops.quantized import fixtures

pytestmark = pytest.mark.skipif(not spin_pool.available(), reason="needs the spin pool")

SHAPE = (1, 3, 224, 224)


def mobilenet_plan(precision: str) -> tuple[engine.Model, list[dict[str, np.ndarray]]]:
    """MobileNet v2 in ``precision`` and three different inputs (every kind of step the
    replay meets: hand-offs, depthwise jobs, int8 range writes, NumPy's pooling)."""
    symbol = nets.mobilenet_v2()
    rng = np.random.default_rng(7)
    extra = {"calibration": {"data": rng.standard_normal((2, *SHAPE[1:]), dtype=np.float32)}} \
        if precision == "int8" else {}
    model = engine.load_model(symbol, nets.random_params(symbol, SHAPE), precision=precision,
                              **extra)
    return model, [{"data": rng.standard_normal(SHAPE, dtype=np.float32)} for _ in range(3)]


def python_outputs(plan: engine.runtime.plan.Plan, feeds: list[dict]) -> list[list]:
    """Each feed's outputs with every step called (no replay)."""
    steady_walk.use(False)
    try:
        return [plan.run(feed) for feed in feeds]
    finally:
        steady_walk.use(True)


def records(plan: engine.runtime.plan.Plan) -> list[steady_walk._Record]:
    return list(plan._steady._records.values())


def steady_record(plan: engine.runtime.plan.Plan, feed: dict) -> steady_walk._Record:
    """The plan's first steady record, run for (a way of running needs two runs, and the
    first runs go armed and on one thread in turn: `spin_pool.Choice`)."""
    for _ in range(16):
        plan.run(feed)
        made = [record for record in records(plan) if record.steady]
        if made:
            return made[0]
    raise AssertionError("no way of running settled in 16 runs")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_replayed_runs_give_the_bytes_of_runs_calling_every_step(precision: str) -> None:
    model, feeds = mobilenet_plan(precision)
    plan = model.plan_for(feeds[0])
    wanted = python_outputs(plan, feeds)
    for run in range(9):
        got = plan.run(feeds[run % 3])
        for mine, theirs in zip(got, wanted[run % 3], strict=True):
            np.testing.assert_array_equal(mine, theirs)
    replayed = sum(record.replays for record in records(plan))
    assert replayed >= 5  # two runs record, the rest replay (a way of running at a time)
    replays_jobs = [segment for record in records(plan) for segment in record.segments
                    if isinstance(segment, spin_pool.Job)]
    assert replays_jobs, "no stretch of steps was replayed natively"


@pytest.mark.skipif(not int8_conv.supported_here(), reason="needs the int8 kernels")
def test_a_calibrated_int8_mobilenet_replays_every_step_in_one_call() -> None:
    """Its quantize, fused layers, global average and dequantize all post jobs alone, range
    writes included: one native call a run."""
    model, feeds = mobilenet_plan("int8")
    plan = model.plan_for(feeds[0])
    record = steady_record(plan, feeds[0])
    assert len(record.segments) == 1 and isinstance(record.segments[0], spin_pool.Job)


def test_a_replay_runs_the_steps_it_cannot_replay_as_they_are() -> None:
    model, feeds = mobilenet_plan("bf16")
    plan = model.plan_for(feeds[0])
    record = steady_record(plan, feeds[0])
    called = [segment for segment in record.segments if not isinstance(segment, spin_pool.Job)]
    pooling = next(step for step in plan.steps if step.node.op == "Pooling")
    assert not steady_walk.replayable(pooling.call)  # NumPy's mean: called, not replayed
    assert any(segment.args[0] == (pooling,) for segment in called)


def test_a_walk_makes_every_way_record_anew_and_the_same_steps_stay_steady(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spin_pool.Choice, "armed", lambda self: True)  # one way of running
    model, feeds = mobilenet_plan("fp32")
    plan = model.plan_for(feeds[0])
    record = steady_record(plan, feeds[0])
    plan.run(feeds[0])
    plan.run(feeds[0])
    assert record.replays == 2
    plan.walk(feeds[0])  # the steps called outside a run: no record kept
    assert records(plan) == []
    plan.run(feeds[0])
    assert [r.steady for r in records(plan)] == [False]  # recorded, not replayed
    plan.steps[:] = list(plan.steps)  # the same steps
    plan.run(feeds[0])
    plan.run(feeds[0])
    assert [(r.steady, r.replays) for r in records(plan)] == [(True, 1)]


def test_a_way_posting_other_jobs_drops_every_ways_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs another way's record names may belong to objects the change let go."""
    monkeypatch.setattr(spin_pool.Choice, "armed", lambda self: True)
    way = {"value": 0}
    monkeypatch.setattr(steady_walk, "_SWITCHES", [*steady_walk._SWITCHES, lambda: way["value"]])
    model, feeds = mobilenet_plan("fp32")
    plan = model.plan_for(feeds[0])
    wanted = python_outputs(plan, feeds[:1])[0]
    for value in (0, 1):
        way["value"] = value
        for _ in range(3):
            plan.run(feeds[0])
    assert [r.steady for r in records(plan)] == [True, True]
    index, step = next((index, step) for index, step in enumerate(plan.steps)
                       if isinstance(step.call, partial) and spin_pool.runs_jobs(step.call.func))
    plan.steps[index] = Step(partial(step.call.func, *step.call.args), step.node)  # a new call
    got = plan.run(feeds[0])
    assert [r.steady for r in records(plan)] == [False]  # way 0's record dropped too
    for mine, theirs in zip(got, wanted, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_every_check_every_replays_a_run_records_and_must_match(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steady_walk, "CHECK_EVERY", 2)
    monkeypatch.setattr(spin_pool.Choice, "armed", lambda self: True)  # one way of running
    model, feeds = mobilenet_plan("fp32")
    plan = model.plan_for(feeds[0])
    for _ in range(3):  # the first runs make their steps' jobs: a record steady by the third
        plan.run(feeds[0])
    made: list[steady_walk._Record] = []
    recorded = steady_walk._recorded

    def counting(*args: object) -> steady_walk._Record | None:
        made.append(recorded(*args))
        return made[-1]

    monkeypatch.setattr(steady_walk, "_recorded", counting)
    for _ in range(9):
        plan.run(feeds[0])
    assert len(made) == 3  # two replays, then a run that records: three times over
    assert all(record.steady and record.replays == 2 for record in made[:-1])


def test_replayed_int8_runs_count_the_paths_their_steps_took() -> None:
    model, feeds = mobilenet_plan("int8")
    plan = model.plan_for(feeds[0])
    counts = []
    for _ in range(12):  # armed and on one thread in turn at first (`spin_pool.Choice`)
        before = integer.PATHS.copy()
        plan.run(feeds[0])
        counts.append(integer.PATHS - before)
    assert sum(record.replays for record in records(plan)) >= 2
    assert counts[0]["int8_fused_conv"] > 0
    assert all(count == counts[0] for count in counts[1:])


def test_turning_int8_paths_off_records_a_way_of_its_own() -> None:
    model, feeds = mobilenet_plan("int8")
    plan = model.plan_for(feeds[0])
    for _ in range(4):
        plan.run(feeds[0])
    integer.use_fast_path(False)
    try:
        wanted = python_outputs(plan, feeds[:1])[0]
        for _ in range(4):
            for mine, theirs in zip(plan.run(feeds[0]), wanted, strict=True):
                np.testing.assert_array_equal(mine, theirs)
    finally:
        integer.use_fast_path(True)
    assert len(records(plan)) >= 2


def test_callers_on_several_threads_each_replay_their_own_record() -> None:
    """A plan's runs from two threads at once, each a way of running of its own (an int8
    layer's jobs are its thread's; where the threads take turns each run decides anew and
    its layers are called, not replayed): every output is the one every step gives, and
    no run replays a record the other thread's run may have left dangling (it crashed)."""
    model, feeds = mobilenet_plan("int8")
    plan = model.plan_for(feeds[0])
    wanted = python_outputs(plan, feeds)
    failures: list[str] = []

    def caller(offset: int) -> None:
        for run in range(12):
            index = (run + offset) % 3
            for mine, theirs in zip(plan.run(feeds[index]), wanted[index], strict=True):
                if not np.array_equal(mine, theirs):
                    failures.append(f"caller {offset}, run {run}")

    threads = [threading.Thread(target=caller, args=(offset,)) for offset in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_run_another_thread_records_drops_this_threads_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose steps are called on another thread may replace what this thread's
    record names (an int8 layer rebinds every thread's jobs): this thread's records go, and
    its next runs record anew, their outputs those every step gives."""
    monkeypatch.setattr(spin_pool.Choice, "armed", lambda self: True)
    model, feeds = mobilenet_plan("fp32")
    plan = model.plan_for(feeds[0])
    wanted = python_outputs(plan, feeds[:1])[0]
    steady_record(plan, feeds[0])
    mine = threading.get_ident()
    assert {key[1] for key in plan._steady._records} == {mine}
    other = threading.Thread(target=plan.run, args=(feeds[0],))
    other.start()
    other.join()
    assert {key[1] for key in plan._steady._records} == {other.ident}
    got = plan.run(feeds[0])
    assert {key[1] for key in plan._steady._records} == {mine}
    assert not any(record.steady for record in records(plan))
    for mine_out, theirs in zip(got, wanted, strict=True):
        np.testing.assert_array_equal(mine_out, theirs)


def test_ranges_taken_from_the_data_are_not_constant() -> None:
    calibrated = make_node("_contrib_quantize_v2", "q", {"min_calib_range": "-1",
                                                        "max_calib_range": "1"})
    from_data = make_node("_contrib_requantize", "r", {})
    assert ranges.constant_in([calibrated])
    assert not ranges.constant_in([calibrated, from_data])
    assert not ranges.constant_in([make_node("_contrib_quantize", "q", {})])


@pytest.mark.parametrize("name, replayed", [("resnet18_v1_uncalibrated", False),
                                            ("resnet18_v1_naive", True)])
def test_an_mxnet_int8_export_replays_its_convolutions_only_where_calibrated(
        name: str, replayed: bool) -> None:
    """Uncalibrated, each quantize takes its range from the data at hand: every run decides
    its layers anew, and replays none of them."""
    symbol, params = fixtures.paths(name)
    model = engine.load_model(str(symbol), str(params))
    data = fixtures.io(name)["data"]
    feeds = [{"data": data * scale} for scale in (1.0, 4.0, 0.25)]
    plan = model.plan_for(feeds[0])
    assert plan.workspace.constant_ranges == replayed
    wanted = python_outputs(plan, feeds)
    for run in range(6):
        np.testing.assert_array_equal(plan.run(feeds[run % 3])[0], wanted[run % 3][0])
    convolutions = [step for step in plan.steps if step.node.op == "_sg_mkldnn_conv"]
    assert convolutions
    assert any(steady_walk.replayable(step.call) for step in convolutions) == replayed


def test_the_job_log_keeps_each_threads_jobs_and_a_sequence_runs_them() -> None:
    source = np.arange(4, dtype=np.float32)
    first, second = np.zeros(4, np.float32), np.zeros(4, np.float32)
    copies = spin_pool.byte_copy(first, source), spin_pool.byte_copy(second, first)
    elsewhere = spin_pool.byte_copy(np.zeros(4, np.float32), source)
    with spin_pool.JobLog() as log:
        start = log.position()
        for copy in copies:
            copy()
        other = threading.Thread(target=elsewhere)
        other.start()
        other.join()
        logged, = log.between([start, log.position()])
    assert logged.shape == (2, 3)  # the other thread's copy is not this thread's
    assert [int(row[1]) for row in logged] == [copy.args[2] for copy in copies]  # contexts
    first[:], second[:] = 0, 0
    spin_pool.sequence(logged)()
    np.testing.assert_array_equal(second, source)


def test_only_jobs_and_calls_of_jobs_in_turn_are_replayable() -> None:
    source, target = np.ones(2, np.float32), np.zeros(2, np.float32)
    job = spin_pool.byte_copy(target, source)
    assert steady_walk.replayable(job)
    assert not steady_walk.replayable(partial(np.copyto, target, source))
    in_turn = steady_walk.in_turn(lambda first, second: (first(), second()))
    assert steady_walk.replayable(partial(in_turn, job, job))
    assert not steady_walk.replayable(partial(in_turn, job, partial(np.copyto, target, source)))
    assert steady_walk.all_replayable(job, None)
