"""`Model.compile`: the plans named by its targets compiled once, timed and reported; nothing
else, and nothing again (calls and memory measurements after it find their plans)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from engine.cpu import blas_threads, parallel
from engine.runtime import batch_split
from engine.runtime.compile import INTERPRETER, CompileFailed, CompileTarget
from engine.runtime.plan_cache import PlanCache
from engine.runtime.signature import Signature
from tests.conformance.fixtures import model_files
from tests.engine.runtime.helpers import compiled_rows


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every plan any model compiles from now on (spares and replicas too)."""
    return compiled_rows(monkeypatch)


def seed_mlp(**options: Any) -> engine.Model:
    return engine.load_model(*model_files("seed_mlp"), **options)


def shapes(rows: int) -> dict[str, tuple[int, ...]]:
    return {"data": (rows, 512)}


def test_compiles_exactly_the_named_plans_and_reports_each(compiles: list[int]) -> None:
    model = seed_mlp(batch_buckets=(4, 8))
    model.concurrent_runs = 2
    report = model.compile([CompileTarget("sample", shapes(1)),
                            CompileTarget("bucket 8", shapes(8), spare=True),
                            CompileTarget("largest", shapes(32), as_called=False)])
    # The sample pads to its bucket (4); bucket 8 with its spare; 32 rows exactly.
    assert compiles == [4, 8, 8, 32]
    assert sorted(dict(signature)["data"][0] for signature in model.plan_signatures()) == [
        4, 8, 32]
    assert [(plan.purposes, plan.inputs, plan.bucket, plan.copies) for plan in report.plans] == [
        (("sample",), shapes(4), 4, 1), (("bucket 8",), shapes(8), 8, 2),
        (("largest",), shapes(32), None, 1)]
    assert all(plan.dtypes == {"data": "float32"} and plan.seconds > 0 for plan in report.plans)
    assert report.seconds >= sum(plan.seconds for plan in report.plans)
    assert report.skipped == ()
    stats = {plan["inputs"]["data"][0]: plan for plan in model.stats()["plans"]}
    for plan in report.plans:
        rows = plan.inputs["data"][0]
        assert plan.planned_bytes == stats[rows]["planned_activation_bytes"] > 0
        assert plan.workspace_bytes == stats[rows]["workspace_bytes"]
    record = report.as_dict()
    assert record["plans"][0]["purposes"] == ["sample"] and record["plans"][0]["inputs"] == {
        "data": [4, 512]}
    assert "compiled 4 plan(s)" in report.summary() and "bucket 8 (data [8, 512]): 2" in \
        report.summary()


def test_what_was_compiled_compiles_nothing_again(compiles: list[int]) -> None:
    model = seed_mlp()
    first = model.compile([CompileTarget("sample", shapes(1)),
                           CompileTarget("largest", shapes(32), as_called=False)])
    assert compiles == [1, 32]
    again = model.compile([CompileTarget("sample again", shapes(1))])
    assert [(plan.copies, plan.seconds) for plan in again.plans] == [(0, 0.0)]
    data = np.zeros((1, 512), np.float32)
    model.infer({"data": data})  # the test run of a load: its plan is there
    largest = model.activation_bytes(shapes(32))  # measuring memory: so is this one
    assert compiles == [1, 32]
    assert largest == first.plans[1].planned_bytes + first.plans[1].workspace_bytes


def test_targets_naming_one_plan_share_its_entry() -> None:
    model = seed_mlp(batch_buckets=(1, 2))
    report = model.compile([CompileTarget("test inference", shapes(1)),
                            CompileTarget("batch bucket 1", shapes(1)),
                            CompileTarget("max_batch_size 2", shapes(2), as_called=False),
                            CompileTarget("batch bucket 2", shapes(2))])
    assert [(plan.purposes, plan.bucket, plan.copies) for plan in report.plans] == [
        (("test inference", "batch bucket 1"), 1, 1),
        (("max_batch_size 2", "batch bucket 2"), 2, 1)]


def test_converts_dtypes_as_a_call_would() -> None:
    model = seed_mlp()
    report = model.compile([CompileTarget("float64 call", shapes(1), {"data": np.float64}),
                            CompileTarget("float16 call", shapes(2), {"data": np.float16})])
    # float64 is converted to the input's float32; other dtypes of undeclared inputs stay.
    assert [plan.dtypes for plan in report.plans] == [{"data": "float32"}, {"data": "float16"}]


def test_a_target_the_model_cannot_take_fails_or_is_skipped(compiles: list[int]) -> None:
    model = seed_mlp()
    with pytest.raises(CompileFailed, match=r"compiling the plan for bucket 4 failed: input "
                                            r"'data' shape \[4, 7\] does not fit") as failure:
        model.compile([CompileTarget("bucket 4", {"data": (4, 7)})])
    assert failure.value.target.purpose == "bucket 4"
    report = model.compile([CompileTarget("largest", {"data": (4, 7)}, as_called=False,
                                          required=False)])
    assert report.plans == () and report.skipped[0][0] == "largest"
    assert "does not fit" in report.skipped[0][1]
    assert compiles == []


def test_a_plan_that_fails_to_compile_names_its_target(monkeypatch: pytest.MonkeyPatch) -> None:
    model = seed_mlp()
    compile_plan = PlanCache.compile

    def fail_at_8(cache: PlanCache, signature: Signature) -> Any:
        if signature.rows() == 8:
            raise MemoryError("no room for 8 rows")
        return compile_plan(cache, signature)

    monkeypatch.setattr(PlanCache, "compile", fail_at_8)
    with pytest.raises(CompileFailed, match="the plan for bucket 8 failed: no room for 8 rows"):
        model.compile([CompileTarget("sample", shapes(1)), CompileTarget("bucket 8", shapes(8))])
    assert [dict(signature)["data"][0] for signature in model.plan_signatures()] == [1]


def test_the_interpreter_compiles_nothing() -> None:
    report = seed_mlp(optimize=False).compile([CompileTarget("sample", shapes(1))])
    assert report.plans == () and report.skipped == (("sample", INTERPRETER),)


def test_a_call_cut_into_runs_of_rows_compiles_the_runs_plans(
        monkeypatch: pytest.MonkeyPatch, compiles: list[int]) -> None:
    blas = blas_threads.numpy_openblas()
    if blas is None or not batch_split.blas_controllable():
        pytest.skip("numpy's OpenBLAS thread count must be settable")
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    monkeypatch.setattr(batch_split, "MIN_PART_WORK", 0)
    before = blas.count()
    blas.set(2)
    try:
        model = engine.load_model(*model_files("lenet"), batch_buckets=(4, 8))
        report = model.compile([CompileTarget("batch bucket 8", {"data": (8, 1, 28, 28)})])
        # As `infer` runs 8 rows: two runs of 4, each in its own copy of the plan for 4.
        assert compiles == [4, 4]
        assert [(plan.inputs["data"][0], plan.copies) for plan in report.plans] == [(4, 2)]
        model.infer({"data": np.zeros((8, 1, 28, 28), np.float32)})
        assert compiles == [4, 4]
    finally:
        blas.set(before)
