"""ModelRepository: scanning, uploads, versions, polling between two instances, budgets."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine.serving.errors import (
    Conflict,
    InvalidModel,
    InvalidName,
    MemoryBudgetExceeded,
    ModelNotFound,
    ModelNotReady,
    VersionNotFound,
)
from engine.serving.loaded import VersionState
from engine.serving.manifest import MANIFEST_NAME, PARAMS_NAME, SYMBOL_NAME, write_manifest
from engine.serving.repository import ModelRepository
from tests.engine.serving.fakes import expected
from tests.engine.serving.helpers import (
    SEED_MLP_CONFIG,
    fake_loader,
    fake_symbol,
    run,
    seed_mlp,
    seed_mlp_io,
)


def fake_repo(root: Path, **options: Any) -> ModelRepository:
    return ModelRepository(root, loader=fake_loader, stale_tmp_age_s=0, **options)


def write_version(root: Path, name: str, version: int, symbol: bytes, params: bytes,
                  manifest: bool = True) -> Path:
    """Lay a version out by hand, as an operator copying files would."""
    version_dir = root / name / str(version)
    version_dir.mkdir(parents=True)
    (version_dir / SYMBOL_NAME).write_bytes(symbol)
    (version_dir / PARAMS_NAME).write_bytes(params)
    if manifest:
        write_manifest(version_dir)
    return version_dir


def test_upload_of_seed_mlp_serves_mxnet_outputs(tmp_path: Path) -> None:
    data, want = seed_mlp_io()

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        symbol, params = seed_mlp()
        assert await repo.add_version("mlp", symbol, params, config=SEED_MLP_CONFIG) == 1
        outputs = await repo.infer("mlp", {"data": data})
        np.testing.assert_allclose(outputs["seed_mlp_dense2_fwd_output"], want,
                                   rtol=1e-4, atol=1e-5)
        config = repo.get("mlp").config
        assert [(t.name, t.datatype, t.shape) for t in config.outputs or ()] == [
            ("seed_mlp_dense2_fwd_output", "FP32", (-1, 2))]
        assert sorted(p.name for p in (tmp_path / "mlp" / "1").iterdir()) == [
            MANIFEST_NAME, PARAMS_NAME, SYMBOL_NAME]
        assert json.loads((tmp_path / "mlp" / "config.json").read_text())["max_batch_size"] == 32
        usage = repo.get("mlp").memory()
        direct = engine.load_model(symbol, params)
        assert direct.param_bytes == 657928
        # and the weights' copies that plans derived (packed for the GEMM kernel)
        assert usage.param_bytes == direct.param_bytes + repo.get("mlp").model.derived_bytes
        assert usage.activation_bytes >= direct.activation_bytes({"data": (32, 512)}) > 0
        assert repo.memory_bytes() == usage.total
        assert [(row.name, row.version, row.state) for row in repo.index()] == [
            ("mlp", 1, VersionState.READY)]
        await repo.close()

    run(main())


def test_500_concurrent_rows_on_seed_mlp_match_direct_infer(tmp_path: Path) -> None:
    symbol, params = seed_mlp()
    direct = engine.load_model(symbol, params)
    data = np.random.default_rng(5).normal(size=(500, 512)).astype(np.float32)

    async def main() -> list[dict[str, np.ndarray]]:
        repo = ModelRepository(tmp_path)
        await repo.start()
        await repo.add_version("mlp", symbol, params, config=SEED_MLP_CONFIG)
        results = await asyncio.gather(*(repo.infer("mlp", {"data": data[i:i + 1]})
                                         for i in range(500)))
        stats = repo.get("mlp").batcher.stats
        assert stats.succeeded == 500
        assert stats.batches < 500  # some batches held more than one row
        await repo.close()
        return results

    for index, result in enumerate(run(main())):
        want = direct.infer({"data": data[index:index + 1]})["seed_mlp_dense2_fwd_output"]
        np.testing.assert_allclose(result["seed_mlp_dense2_fwd_output"], want,
                                   rtol=1e-5, atol=1e-6)


def test_missing_config_is_inferred_from_the_graph(tmp_path: Path) -> None:
    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        symbol, params = seed_mlp()
        await repo.add_version("mlp", symbol, params)
        config = repo.get("mlp").config
        assert [(t.name, t.datatype, t.shape) for t in config.inputs or ()] == [
            ("data", "FP32", (-1, 512))]
        assert [t.shape for t in config.outputs or ()] == [(-1, 2)]
        await repo.close()
        fakes = fake_repo(tmp_path)
        await fakes.start()
        await fakes.add_version("fake", fake_symbol(width=6), b"weights")
        config = fakes.get("fake").config
        assert [(t.name, t.datatype, t.shape) for t in config.inputs or ()] == [
            ("data", "FP32", (-1, 6))]
        assert [(t.name, t.shape) for t in config.outputs or ()] == [
            ("out", (-1, 3)), ("total", (-1,))]
        await fakes.close()

    run(main())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake", "mlp"]


def test_start_loads_hand_laid_versions_and_skips_incomplete_or_tampered(tmp_path: Path) -> None:
    write_version(tmp_path, "good", 1, fake_symbol(1), b"p")
    write_version(tmp_path, "copying", 1, fake_symbol(2), b"p", manifest=False)
    tampered = write_version(tmp_path, "tampered", 1, fake_symbol(3), b"p")
    (tampered / PARAMS_NAME).write_bytes(b"q")
    (tmp_path / ".tmp-leftover").mkdir()
    (tmp_path / "notes.txt").write_text("not a model")

    async def main() -> None:
        repo = fake_repo(tmp_path)
        await repo.start()
        states = {(row.name, row.version): row for row in repo.index()}
        assert states[("good", 1)].state is VersionState.READY
        assert states[("copying", 1)].state is VersionState.UNAVAILABLE
        assert "MANIFEST.json" in states[("copying", 1)].reason
        assert "sha256" in states[("tampered", 1)].reason
        with pytest.raises(ModelNotReady, match="sha256"):
            repo.get("tampered")
        with pytest.raises(ModelNotFound):
            repo.get("notes.txt")
        await repo.close()

    run(main())
    assert not (tmp_path / ".tmp-leftover").exists()


@pytest.mark.parametrize("policy, ready", [
    ({"latest": {"num_versions": 2}}, [2, 3]),
    ({"all": {}}, [1, 2, 3]),
    ({"specific": {"versions": [1, 3, 9]}}, [1, 3]),
    (None, [3]),
])
def test_version_policy_selects_versions(tmp_path: Path, policy: dict[str, Any] | None,
                                         ready: list[int]) -> None:
    for version in (1, 2, 3):
        write_version(tmp_path, "m", version, fake_symbol(version), b"p")
    if policy is not None:
        (tmp_path / "m" / "config.json").write_text(json.dumps({"version_policy": policy}))

    async def main() -> None:
        repo = fake_repo(tmp_path)
        await repo.start()
        assert [row.version for row in repo.index() if row.state is VersionState.READY] == ready
        assert repo.get("m").version == ready[-1]
        await repo.close()

    run(main())


def test_second_repository_converges_after_one_poll(tmp_path: Path) -> None:
    data = np.ones((1, 4), np.float32)

    async def main() -> None:
        writer, reader = fake_repo(tmp_path), fake_repo(tmp_path)
        await writer.start()
        await reader.start()
        await writer.add_version("m", fake_symbol(1), b"p")
        with pytest.raises(ModelNotFound):
            reader.get("m")
        await reader.poll()
        result = await reader.infer("m", {"data": data})
        np.testing.assert_allclose(result["out"], expected(writer.get("m").model, data)["out"])

        await writer.add_version("m", fake_symbol(2), b"p", version=1, replace=True)
        await reader.poll()
        assert reader.get("m").version == 1
        np.testing.assert_allclose((await reader.infer("m", {"data": data}))["out"],
                                   (await writer.infer("m", {"data": data}))["out"])

        await writer.add_version("m", fake_symbol(3), b"p")
        await reader.poll()
        assert [r.version for r in reader.index() if r.state is VersionState.READY] == [2]

        await writer.delete_model("m")
        await reader.poll()
        with pytest.raises(ModelNotFound):
            reader.get("m")
        await writer.close()
        await reader.close()

    run(main())


def test_failed_upload_leaves_previous_version_serving_and_nothing_behind(tmp_path: Path) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path)
        await repo.start()
        await repo.add_version("m", fake_symbol(1), b"p")
        with pytest.raises(InvalidModel, match="unknown op on purpose"):
            await repo.add_version("m", fake_symbol(broken=True), b"p")
        with pytest.raises(InvalidModel, match="config"):
            await repo.add_version("m", fake_symbol(2), b"p", config={"max_batch_size": -1})
        assert repo.get("m").version == 1
        await repo.close()

    run(main())
    assert sorted(os.listdir(tmp_path)) == ["m"]
    assert sorted(os.listdir(tmp_path / "m")) == ["1"]


def test_failed_load_on_poll_keeps_previous_version_serving(tmp_path: Path) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path)
        await repo.start()
        await repo.add_version("m", fake_symbol(1), b"p")
        write_version(tmp_path, "m", 2, fake_symbol(broken=True), b"p")
        await repo.poll()
        assert repo.get("m").version == 1
        rows = {row.version: row for row in repo.index()}
        assert rows[2].state is VersionState.UNAVAILABLE and "on purpose" in rows[2].reason
        with pytest.raises(ModelNotReady, match="on purpose"):
            repo.get("m", 2)
        with pytest.raises(InvalidModel):
            await repo.load("m")
        await repo.close()

    run(main())


def test_conflicts_names_and_deletion(tmp_path: Path) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path)
        await repo.start()
        await repo.add_version("m", fake_symbol(1), b"p", version=3)
        with pytest.raises(Conflict, match="version 3 already exists"):
            await repo.add_version("m", fake_symbol(2), b"p", version=3)
        assert await repo.add_version("m", fake_symbol(2), b"p") == 4
        for bad in ("..", ".", "a/b", "-x", "x" * 65, ""):
            with pytest.raises(InvalidName):
                await repo.add_version(bad, fake_symbol(), b"p")
        with pytest.raises(InvalidName):
            repo.get("m", 0)
        with pytest.raises(VersionNotFound):
            repo.get("m", 7)
        with pytest.raises(VersionNotFound):
            await repo.delete_version("m", 7)
        await repo.delete_version("m", 4)
        assert repo.get("m").version == 3
        await repo.delete_model("m")
        with pytest.raises(ModelNotFound):
            await repo.delete_model("m")
        await repo.close()

    run(main())
    assert os.listdir(tmp_path) == []


def test_explicit_unload_survives_polling_until_load(tmp_path: Path) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path)
        await repo.start()
        await repo.add_version("m", fake_symbol(1), b"p")
        await repo.unload("m")
        await repo.poll()
        with pytest.raises(ModelNotReady, match="unloaded"):
            repo.get("m")
        await repo.load("m")
        assert repo.get("m").version == 1
        await repo.add_version("m", fake_symbol(2), b"p")
        await repo.load("m", 1)  # an extra version beside the policy's latest
        assert sorted(r.version for r in repo.index() if r.state is VersionState.READY) == [1, 2]
        await repo.unload("m", 1)
        assert repo.get("m").version == 2
        await repo.close()

    run(main())


def test_memory_budget_refuses_loads_beyond_it(tmp_path: Path) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path, memory_budget_bytes=3000)
        await repo.start()
        # Pinned: neither may be unloaded to make room (test_control covers eviction).
        await repo.add_version("a", fake_symbol(1), b"p", config={"pinned": True})
        usage = repo.get("a").memory()
        assert usage.param_bytes == 64 * 3 * 4
        assert usage.activation_bytes == 32 * 16  # the fake's estimate at max_batch_size 32
        assert repo.memory_bytes() == usage.total
        await repo.add_version("b", fake_symbol(2), b"p", config={"pinned": True})
        with pytest.raises(MemoryBudgetExceeded, match="3000-byte memory budget"):
            await repo.add_version("c", fake_symbol(3), b"p")
        await repo.close()

    run(main())
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_background_polling_picks_up_another_writer(tmp_path: Path) -> None:
    async def main() -> None:
        reader = fake_repo(tmp_path, poll_interval_s=0.02)
        writer = fake_repo(tmp_path)
        await reader.start()
        await writer.start()
        await writer.add_version("m", fake_symbol(1), b"p")
        for _ in range(200):
            if any(row.state is VersionState.READY for row in reader.index()):
                break
            await asyncio.sleep(0.01)
        assert reader.get("m").version == 1
        await writer.close()
        await reader.close()

    run(main())


def test_cpu_batches_of_all_models_queue_for_the_cores_on_flushing_threads(
        tmp_path: Path) -> None:
    """One CPU batch at a time by default, each on every core (as `Model.infer` runs it in
    process), on compute threads that flush denormals."""
    import threading
    import time

    from engine.cpu import denormals
    from tests.engine.serving.fakes import FakeModel

    seen = {"running": 0, "most": 0, "flushing": []}
    lock = threading.Lock()

    class Recording(FakeModel):
        def infer(self, inputs: Any) -> dict[str, np.ndarray]:
            with lock:
                seen["running"] += 1
                seen["most"] = max(seen["most"], seen["running"])
            seen["flushing"].append(denormals.flushing_here())
            time.sleep(0.05)  # long enough for the other model's batch to arrive meanwhile
            try:
                return super().infer(inputs)
            finally:
                with lock:
                    seen["running"] -= 1

    def loader(symbol: Path, params: Path, *, device: str = "cpu") -> FakeModel:
        return Recording(fake_loader(symbol, params, device=device).width)

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader, stale_tmp_age_s=0)
        await repo.start()
        for name in ("a", "b"):
            await repo.add_version(name, fake_symbol(width=4), b"weights")
        seen.update(running=0, most=0, flushing=[])
        data = np.ones((1, 4), np.float32)
        await asyncio.gather(*(repo.infer(name, {"data": data})
                               for name in ("a", "b") for _ in range(3)))
        await repo.close()

    run(main())
    assert seen["most"] == 1
    assert seen["flushing"] and all(seen["flushing"]) == denormals.available()
