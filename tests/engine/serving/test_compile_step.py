"""The compile step of a load (`compile_at_load`): the plans of the test run, the batch buckets
and the memory measurement compiled once, by name, timed and recorded in the checks; the test
run, the warm-up and measuring memory then compile nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.runtime.plan_cache import PlanCache
from engine.runtime.signature import Signature
from engine.serving.config import ModelConfig
from engine.serving.errors import InvalidModel
from engine.serving.loaded import LoadedVersion
from engine.serving.repository import ModelRepository
from engine.serving.validate import Validated, checks_of, default_loader, load_and_validate
from tests.conformance.fixtures import model_files
from tests.engine.gpu import fake_cupy
from tests.engine.runtime.helpers import compiled_rows
from tests.engine.serving.fakes import FakeModel
from tests.engine.serving.helpers import SEED_MLP_CONFIG, run, seed_mlp


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every plan compiled from now on (spares and replicas too)."""
    return compiled_rows(monkeypatch)


def validate(name: str, config: ModelConfig, device: str = "cpu") -> Validated:
    symbol, params = model_files(name)
    return load_and_validate(
        Path("unused"), config, device=device, where=f"upload of {name}",
        loader=lambda _s, _p, *, device: default_loader(symbol, params, device=device))


def record(validated: Validated) -> dict[str, Any]:
    checks = checks_of(validated.model)
    assert checks is not None
    return checks.as_dict()["compile"]


def rows_of(plans: list[dict[str, Any]], name: str = "data") -> list[int]:
    return [plan["inputs"][name][0] for plan in plans]


def test_a_cpu_load_compiles_the_test_run_powers_of_two_and_the_largest_batch(
        compiles: list[int]) -> None:
    validated = validate("seed_mlp", ModelConfig(max_batch_size=16))
    compiled = record(validated)
    assert compiled["ran"] is True and compiled["skipped"] == []
    assert [(plan["purposes"], plan["bucket"], plan["copies"]) for plan in compiled["plans"]] == [
        (["test inference", "batch 1"], None, 1), (["batch 2"], None, 1),
        (["batch 4"], None, 1), (["batch 8"], None, 1),
        (["batch 16", "max_batch_size 16"], None, 1)]
    assert rows_of(compiled["plans"]) == [1, 2, 4, 8, 16]
    assert all(plan["seconds"] > 0 and plan["planned_bytes"] > 0 for plan in compiled["plans"])
    assert compiled["seconds"] >= sum(plan["seconds"] for plan in compiled["plans"])
    # Everything the load compiled, the compile step did: the test run compiled nothing.
    assert compiles == [1, 2, 4, 8, 16]
    assert validated.config.batch_buckets is None  # the CPU's default: no buckets


def test_a_cpu_load_with_warmup_samples_compiles_what_they_run_instead(
        compiles: list[int]) -> None:
    config = ModelConfig.model_validate({"max_batch_size": 16, "model_warmup": [
        {"name": "six rows", "batch_size": 6}]})
    compiled = record(validate("seed_mlp", config))
    # The compile step: the test run and the memory measurement; the sample ran batch 6.
    assert rows_of(compiled["plans"]) == [1, 16]
    assert compiles == [1, 16, 6]


def test_measuring_memory_compiles_nothing_new(compiles: list[int]) -> None:
    validated = validate("seed_mlp", ModelConfig(max_batch_size=16))
    compiled = compiles[:]
    version = LoadedVersion("mlp", 1, validated.model, validated.config,
                            batcher=None,  # type: ignore[arg-type]
                            manifest_digest=None, config_digest=None)
    usage = version.memory()
    assert compiles == compiled
    largest = record(validated)["plans"][1]
    assert usage.activation_bytes >= largest["planned_bytes"] + largest["workspace_bytes"]


def test_buckets_compile_at_load_with_the_failing_bucket_named(
        compiles: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    config = ModelConfig(max_batch_size=8, batch_buckets=(2, 8))
    compiled = record(validate("seed_mlp", config))
    assert [(plan["purposes"], plan["bucket"]) for plan in compiled["plans"]] == [
        (["test inference", "batch bucket 2"], 2),
        (["batch bucket 8", "max_batch_size 8"], 8)]
    assert sorted(compiles) == [2, 8]
    compile_plan = PlanCache.compile

    def fail_at_8(cache: PlanCache, signature: Signature) -> Any:
        if signature.rows() == 8:
            raise MemoryError("out of memory")
        return compile_plan(cache, signature)

    monkeypatch.setattr(PlanCache, "compile", fail_at_8)
    with pytest.raises(InvalidModel, match=r"^upload of seed_mlp: compiling the plan for batch "
                                           r"bucket 8 failed: out of memory$"):
        validate("seed_mlp", config)


def test_the_test_runs_plan_failing_is_the_test_inference_failing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(cache: PlanCache, signature: Signature) -> Any:
        raise MemoryError("out of memory")

    monkeypatch.setattr(PlanCache, "compile", fail)
    with pytest.raises(InvalidModel, match=r"^upload of seed_mlp: test inference on synthetic "
                                           r"input \(data \(1, 512\) float32\) failed: out of "
                                           r"memory$"):
        validate("seed_mlp", ModelConfig())


def test_the_record_uses_the_clients_names() -> None:
    config = ModelConfig(max_batch_size=4, inputs=[{"name": "pixels", "source": "data"}])
    compiled = record(validate("lenet", config))
    assert [plan["inputs"] for plan in compiled["plans"]] == [
        {"pixels": [1, 1, 28, 28]}, {"pixels": [2, 1, 28, 28]}, {"pixels": [4, 1, 28, 28]}]
    assert compiled["plans"][0]["dtypes"] == {"pixels": "float32"}


def test_a_largest_batch_the_model_cannot_take_is_skipped_not_refused() -> None:
    from engine import sym

    net = sym.FullyConnected(sym.Reshape(sym.var("data"), shape=(1, -1)), num_hidden=2,
                             name="fc")
    params = {"fc_weight": np.zeros((2, 6), np.float32), "fc_bias": np.zeros(2, np.float32)}

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        import engine

        return engine.load_model(net, params, device=device, keep_batch=True)

    validated = load_and_validate(Path("unused"), ModelConfig(), loader=loader, device="cpu",
                                  where="upload")
    compiled = record(validated)
    assert validated.config.max_batch_size == 1  # it takes one row only
    assert rows_of(compiled["plans"]) == [1]
    assert compiled["plans"][0]["purposes"] == ["test inference", "batch 1", "max_batch_size 1"]


def test_a_model_without_a_compile_step_says_so() -> None:
    validated = load_and_validate(Path("unused"), ModelConfig(), device="cpu", where="upload",
                                  loader=lambda _s, _p, *, device: FakeModel())
    assert record(validated) == {"ran": False, "reason": "the model has no compile step: its "
                                 "plans, if any, compile when first run"}


def test_a_gpu_load_compiles_every_bucket_with_its_spare(
        compiles: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cupy.install(monkeypatch)
    validated = validate("seed_mlp", ModelConfig(max_batch_size=4), device="gpu")
    compiled = record(validated)
    assert [(plan["purposes"], plan["bucket"], plan["copies"]) for plan in compiled["plans"]] == [
        (["test inference", "batch bucket 1"], 1, 2), (["batch bucket 2"], 2, 2),
        (["batch bucket 4", "max_batch_size 4"], 4, 2)]
    # The test run and the warm-up runs (CUDA graph capture) compiled nothing more.
    assert compiles == [1, 1, 2, 2, 4, 4]


def test_a_repository_load_compiles_once_and_measures_without_compiling(
        tmp_path: Path, compiles: list[int]) -> None:
    async def main() -> None:
        repo = ModelRepository(tmp_path, memory_budget_bytes=1 << 30)
        await repo.start()
        try:
            symbol, params = seed_mlp()
            await repo.add_version("mlp", symbol, params, config=SEED_MLP_CONFIG)
            version = repo.get("mlp")
            compiled = checks_of(version.model).as_dict()["compile"]
            # Each plan compiled by the compile step only: not by the test run, not when the
            # upload's memory was measured against the budget, nor now.
            assert sorted(compiles) == sorted(rows_of(compiled["plans"])) == [1, 2, 4, 8, 16, 32]
            version.memory()
            assert len(compiles) == 6
        finally:
            await repo.close()

    run(main())
