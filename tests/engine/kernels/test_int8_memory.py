"""An int8 plan's packed weights and its layers' per-thread scratch on huge pages by the rule a
plan's own arrays follow (`int8_memory`, `workspace.ARENA_FROM_BYTES`), with the same bytes
out as the NumPy path, on one thread and on two."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from engine.cpu import spin_pool
from engine.kernels import gemm_int8, int8_conv, int8_memory
from engine.kernels.workspace import ALIGN, ARENA_FROM_BYTES, Workspace, address
from tests.engine.kernels.test_aligned import asked_for_huge_pages, huge_pages_marked
from tests.engine.ops.quantized.int8_models import numpy_path
from tests.engine.quantize.test_int8_model import residual_net

RNG = np.random.default_rng(52)


def _arenas_made(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The `HugePageArena`s `int8_memory` makes from now on, in a list."""
    made: list[Any] = []
    arena = int8_memory.HugePageArena

    def record(*args: Any) -> Any:
        made.append(arena(*args))
        return made[-1]

    monkeypatch.setattr(int8_memory, "HugePageArena", record)
    return made


def test_a_plans_weights_below_the_threshold_keep_numpys_memory(monkeypatch):
    made = _arenas_made(monkeypatch)
    memory = int8_memory.PlanMemory()
    memory.expect(ARENA_FROM_BYTES - 1)
    array = memory.empty((3, 5), np.int8)
    assert not memory.huge_pages and not made
    assert array.shape == (3, 5) and address(array) % ALIGN == 0


@huge_pages_marked
def test_a_plans_weights_of_a_huge_page_or_more_come_from_one_arena(monkeypatch):
    made = _arenas_made(monkeypatch)
    memory = int8_memory.PlanMemory()
    memory.expect(ARENA_FROM_BYTES // 2)
    memory.expect(ARENA_FROM_BYTES // 2)  # the layers' bytes add up
    assert memory.spans == []  # nothing mapped yet
    first, second = memory.empty((100, 64), np.int8), memory.empty(7, np.int32)
    assert memory.huge_pages and len(made) == 1
    for array in (first, second):
        assert address(array) % ALIGN == 0 and asked_for_huge_pages(array)
        # in its arena's one mapping, which `bench/footprint.py` counts as the plan's weights
        (start, size), = memory.spans
        assert start <= address(array) and address(array) + array.nbytes <= start + size


@huge_pages_marked
def test_a_plan_on_huge_pages_packs_its_int8_weights_on_them_however_few(monkeypatch):
    made = _arenas_made(monkeypatch)
    space = Workspace(np, 0, huge_pages=True)
    memory = int8_memory.of(space)
    assert int8_memory.of(space) is memory  # one a plan
    assert memory.huge_pages and asked_for_huge_pages(memory.empty(10, np.int8))
    assert len(made) == 1
    alone = int8_memory.of(Workspace(np, 0, huge_pages=False))
    assert not alone.huge_pages and int8_memory.of(None) is not int8_memory.of(None)


@huge_pages_marked
def test_a_threads_scratch_keeps_huge_and_numpy_buffers_apart():
    scratch = int8_memory.Scratch()
    plain = scratch.take("sums", 10, np.int32)
    huge = scratch.take("sums", 10, np.int32, huge_pages=True)
    assert not np.may_share_memory(plain, huge) and asked_for_huge_pages(huge)
    # taken again at the size or below: the same buffer; above it: grown, on huge pages
    assert address(scratch.take("sums", 8, np.int32, huge_pages=True)) == address(huge)
    grown = scratch.take("sums", 4096, np.int32, huge_pages=True)
    assert grown.size == 4096 and asked_for_huge_pages(grown)
    assert address(scratch.take("sums", 10, np.int32)) == address(plain)


@pytest.mark.skipif(not gemm_int8.available(), reason="needs AVX-512 VNNI and llvmlite's JIT")
@pytest.mark.parametrize("amx", [False, *([True] if gemm_int8.amx_available() else [])])
def test_weights_packed_into_a_callers_memory_equal_numpys_packing(amx):
    matrix = RNG.integers(-128, 128, (150, 70)).astype(np.int8)
    given: list[np.ndarray] = []

    def empty(shape: Any, dtype: Any) -> np.ndarray:
        given.append(np.full(shape, 99, dtype))  # garbage where nothing is written
        return given[-1]

    mine, numpys = gemm_int8.PackedWeights(matrix, amx, empty), gemm_int8.PackedWeights(
        matrix, amx)
    assert [id(a) for a in given] == [id(mine.packed), id(mine.no_offsets),
                                      id(mine.signed_offsets)]
    for name in ("packed", "no_offsets", "signed_offsets"):
        np.testing.assert_array_equal(getattr(mine, name), getattr(numpys, name))
    rows = RNG.integers(0, 256, (40, 150)).astype(np.uint8)
    np.testing.assert_array_equal(gemm_int8.multiply(rows, mine),
                                  rows.astype(np.int32) @ matrix.astype(np.int32))


@pytest.fixture(scope="module")
def residual_model():
    symbol, params = residual_net()
    calibration = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    images = {"data": RNG.standard_normal((3, 3, 16, 16)).astype(np.float32)}
    with numpy_path():
        exact = engine.load_model(symbol, params, precision="int8",
                                  calibration={"data": calibration}).infer(images)["fc2_output"]
    return symbol, params, calibration, images, exact


def _packings(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """The arrays plans' `PlanMemory` hands out from now on, in a list."""
    handed: list[np.ndarray] = []
    empty = int8_memory.PlanMemory.empty

    def record(self: int8_memory.PlanMemory, shape: Any, dtype: Any) -> np.ndarray:
        handed.append(empty(self, shape, dtype))
        return handed[-1]

    monkeypatch.setattr(int8_memory.PlanMemory, "empty", record)
    return handed


def _outputs_both_ways(model: engine.Model, images: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The logits of the model's plan run as `Plan.run` runs it, then its steps armed over
    two threads."""
    plan = model.plan_for(images)
    (one,) = plan.run(images)
    # `Plan.run` lets the quantize read the caller's images where they lie: steps called
    # outside a run read the plan's own input buffers, so they are filled here
    for name, array in images.items():
        plan._inputs[name][...] = array
    with spin_pool.armed(2):
        for step in plan.steps:
            step.call()
    return [one, plan._heads[0].copy()]


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
@huge_pages_marked
def test_an_int8_plans_weights_and_scratch_lie_on_huge_pages_past_the_threshold(
        monkeypatch, residual_model):
    """The residual net's weights are a few KB: with the threshold below them, every layer's
    packed weights (convolutions and dense layers) and its scratch come from huge pages, and
    the logits stay the NumPy path's bit for bit."""
    symbol, params, calibration, images, exact = residual_model
    monkeypatch.setattr(int8_memory, "ARENA_FROM_BYTES", 1)
    handed = _packings(monkeypatch)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    for got in _outputs_both_ways(model, images):
        np.testing.assert_array_equal(got, exact)
    # five convolutions and two dense layers, three arrays each
    assert len(handed) >= 7 * 3
    assert all(asked_for_huge_pages(array) for array in handed)
    taken = int8_memory.scratch().buffers
    assert any(huge for _, huge in taken)
    assert all(asked_for_huge_pages(buffer) for (_, huge), buffer in taken.items() if huge)


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
def test_a_small_int8_plan_keeps_numpys_memory(monkeypatch, residual_model):
    symbol, params, calibration, images, exact = residual_model
    made = _arenas_made(monkeypatch)
    handed = _packings(monkeypatch)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    for got in _outputs_both_ways(model, images):
        np.testing.assert_array_equal(got, exact)
    assert handed and not made
    assert all(address(array) % ALIGN == 0 for array in handed)
