"""Plans and packed weights start on cache lines (`workspace.empty_aligned`), so a plan's speed
does not depend on where malloc happened to put its buffers; every array a plan's runs read or
write that the workspace makes or keeps lies on memory asked for huge pages
(`workspace.HugePageArena`), small arrays packed together."""

from __future__ import annotations

import mmap
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.compiler import pack_weights
from engine.kernels import gemm_kernel, workspace
from engine.kernels.packed_weight import PackedWeight
from engine.kernels.workspace import ALIGN, HugePageArena, address, empty_aligned

# Where Linux has transparent huge pages, memory asked for them is marked "hg" in smaps.
huge_pages_marked = pytest.mark.skipif(
    not hasattr(mmap, "MADV_HUGEPAGE") or not Path("/proc/self/smaps").exists()
    or not Path("/sys/kernel/mm/transparent_hugepage").exists(),
    reason="no transparent huge pages here, or no smaps to read where they were asked for")


def asked_for_huge_pages(array: np.ndarray) -> bool:
    """Whether all of ``array``'s memory lies in mappings marked for huge pages (MADV_HUGEPAGE:
    "hg" among the mapping's VmFlags in /proc/self/smaps)."""
    start = address(array)
    end = start + max(array.nbytes, 1)
    covered = start
    mapping = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        bounds = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if bounds:
            mapping = (int(bounds[1], 16), int(bounds[2], 16))
        elif line.startswith("VmFlags:") and mapping is not None:
            low, high = mapping
            if low < end and high > start and "hg" not in line.split()[1:]:
                return False
            if low <= covered < high:
                covered = high
    return covered >= end


@pytest.mark.parametrize("shape", [0, 1, 3, (2, 3), (7, 5, 3), 1000])
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64])
def test_arrays_start_on_a_cache_line(shape: int | tuple, dtype: type) -> None:
    for _ in range(8):  # several allocations: malloc's offsets vary
        array = empty_aligned(np, shape, dtype)
        assert address(array) % ALIGN == 0 or array.size == 0  # an empty array has no memory
        assert array.shape == ((shape,) if isinstance(shape, int) else shape)
        assert array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable
        array[...] = 1
        assert (array == 1).all()


def test_a_plans_inputs_buffers_and_scratch_are_aligned() -> None:
    data = sym.var("data")
    net = sym.FullyConnected(sym.relu(sym.FullyConnected(data, num_hidden=33, name="fc1")),
                             num_hidden=5, name="fc2")
    params = {"fc1_weight": np.ones((33, 17), np.float32), "fc1_bias": np.zeros(33, np.float32),
              "fc2_weight": np.ones((5, 33), np.float32), "fc2_bias": np.zeros(5, np.float32)}
    model = engine.load_model(net, params)
    plan = model.plan_for({"data": np.zeros((3, 17), np.float32)})
    arrays = [array for array in (*plan._inputs.values(), plan.workspace.scratch) if array.size]
    assert arrays and all(address(array) % ALIGN == 0 for array in arrays)


@pytest.mark.skipif(not gemm_kernel.available(), reason="no JIT for the GEMM kernels here")
def test_packed_weights_are_aligned_and_hold_the_matrix() -> None:
    matrix = np.arange(37 * 11, dtype=np.float32).reshape(37, 11)
    for packed in (gemm_kernel.pack(matrix), gemm_kernel.pack_columns(matrix),
                   gemm_kernel.pack_each(np.stack([matrix, matrix]))):
        assert address(packed) % ALIGN == 0 and packed.flags.c_contiguous
    rows = gemm_kernel.pack(matrix)
    # Blocks of MR rows, each (K, MR): row r of the matrix is column r % MR of block r // MR.
    mr = rows.shape[2]
    np.testing.assert_array_equal(rows[1][:, 0], matrix[mr])


@huge_pages_marked
@pytest.mark.parametrize("rows", [3, workspace.ARENA_CHUNK_BYTES // (4 * 17) + 1])
def test_a_plans_input_lies_on_huge_pages_where_the_plan_is_large_and_runs(rows: int) -> None:
    data = sym.var("data")
    net = sym.FullyConnected(data, num_hidden=33, name="fc1")
    weight = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32)
    params = {"fc1_weight": weight, "fc1_bias": np.ones(33, np.float32)}
    model = engine.load_model(net, params)
    feed = np.random.default_rng(1).standard_normal((rows, 17)).astype(np.float32)
    plan = model.plan_for({"data": feed})
    assert address(plan._inputs["data"]) % ALIGN == 0
    # 3 rows: a plan of a few hundred bytes keeps NumPy's memory (`ARENA_FROM_BYTES`)
    assert (plan.workspace.arena is not None) == (rows > 3)
    if rows > 3:
        assert asked_for_huge_pages(plan._inputs["data"])
    (out,) = plan.run({"data": feed})
    np.testing.assert_allclose(out, feed @ weight.T + 1, rtol=1e-4, atol=1e-4)


@huge_pages_marked
def test_an_arena_packs_small_arrays_apart_on_huge_pages() -> None:
    arena = HugePageArena()
    shapes = [(3,), (0,), (5, 7), (1000,), (64, 33), (1,), (4096,)]
    dtypes = [np.uint8, np.float32, np.float16, np.float64, np.float32, np.int8, np.float32]
    arrays = [arena.empty(shape, dtype) for shape, dtype in zip(shapes, dtypes)]
    for index, (array, shape, dtype) in enumerate(zip(arrays, shapes, dtypes)):
        assert array.shape == shape and array.dtype == dtype
        assert array.flags.c_contiguous and array.flags.writeable
        assert address(array) % ALIGN == 0 and asked_for_huge_pages(array)
        array[...] = index
    for index, array in enumerate(arrays):  # none overlaps another
        assert (array == index).all()
    starts = [address(array) for array in arrays]
    # One after another in one mapping: together on the same huge pages.
    assert starts == sorted(starts)
    assert starts[-1] + arrays[-1].nbytes - starts[0] <= workspace.ARENA_CHUNK_BYTES


@huge_pages_marked
def test_an_arena_maps_a_large_array_apart_where_its_chunk_has_no_room() -> None:
    chunk = workspace.ARENA_CHUNK_BYTES
    arena = HugePageArena()
    first = arena.empty(100, np.float32)
    filler = arena.empty(chunk * 3 // 8, np.uint8)
    large = arena.empty(chunk * 3 // 4, np.uint8)  # more than the chunk has left
    after = arena.empty(100, np.float32)
    assert address(large) % workspace.HUGE_PAGE_BYTES == 0 and asked_for_huge_pages(large)
    assert address(filler) == address(first) + workspace.aligned(first.nbytes)
    assert address(after) == address(filler) + workspace.aligned(filler.nbytes)
    # Large, but with room for it: carved too, to the chunk's last byte.
    used = address(after) + workspace.aligned(after.nbytes) - address(first)
    rest = arena.empty(chunk - used, np.uint8)
    assert 2 * rest.nbytes >= chunk
    assert address(rest) == address(after) + workspace.aligned(after.nbytes)
    # The chunk full: the next array starts another.
    again = arena.empty(ALIGN, np.uint8)
    assert asked_for_huge_pages(again) and not (
        address(first) <= address(again) < address(rest) + rest.nbytes)
    for index, array in enumerate((first, filler, large, after, rest, again)):
        array[...] = index
    for index, array in enumerate((first, filler, large, after, rest, again)):
        assert (array == index).all()
    # Three mappings, each noted once, each holding the arrays made in it.
    assert len(arena.spans) == 3
    for array in (first, filler, large, after, rest, again):
        start, end = address(array), address(array) + array.nbytes
        assert sum(low <= start and end <= low + size for low, size in arena.spans) == 1


@huge_pages_marked
def test_an_arena_carves_the_rest_of_a_large_arrays_last_huge_page() -> None:
    arena = HugePageArena()
    large = arena.empty(workspace.HUGE_PAGE_BYTES + 1, np.uint8)  # two huge pages mapped
    small = arena.empty(1000, np.float32)
    assert address(large) % workspace.HUGE_PAGE_BYTES == 0
    assert address(small) == address(large) + workspace.aligned(large.nbytes)
    assert asked_for_huge_pages(small)
    large[...], small[...] = 7, 3
    assert (large == 7).all() and (small == 3).all()


def test_an_arenas_copy_holds_the_values_and_their_writeability() -> None:
    arena = HugePageArena()
    source = np.arange(35, dtype=np.float32).reshape(5, 7)[:, ::2]  # not contiguous
    source.flags.writeable = False
    copy = arena.copy(source)
    np.testing.assert_array_equal(copy, source)
    assert copy.flags.c_contiguous and not copy.flags.writeable
    assert address(copy) % ALIGN == 0


@huge_pages_marked
@pytest.mark.skipif(not gemm_kernel.available(), reason="no JIT for the GEMM kernels here")
def _conv_pool_dense(size: int, hidden: int) -> tuple[Any, dict[str, np.ndarray]]:
    """A 3×3 convolution over 8 channels of ``size``², a 4×4 pooling and a dense layer of
    ``hidden`` units, with seeded weights."""
    data = sym.var("data")
    net = sym.Convolution(data, num_filter=32, kernel=(3, 3), pad=(1, 1), name="conv")
    net = sym.Pooling(sym.relu(net), kernel=(4, 4), stride=(4, 4), pool_type="max")
    net = sym.FullyConnected(net, num_hidden=hidden, name="fc")
    rng = np.random.default_rng(3)
    return net, {"conv_weight": rng.standard_normal((32, 8, 3, 3)).astype(np.float32),
                 "conv_bias": rng.standard_normal(32).astype(np.float32),
                 "fc_weight": rng.standard_normal(
                     (hidden, 32 * (size // 4) ** 2)).astype(np.float32),
                 "fc_bias": rng.standard_normal(hidden).astype(np.float32)}


def _plan_arrays(size: int, hidden: int) -> tuple[list[np.ndarray], ...]:
    """A plan of `_conv_pool_dense` at batch 2, checked against the reference interpreter:
    (the arrays it keeps, the values derived from its weights, its packed dense weights)."""
    net, params = _conv_pool_dense(size, hidden)
    model = engine.load_model(net, params)
    feed = {"data": np.random.default_rng(4).standard_normal(
        (2, 8, size, size)).astype(np.float32)}
    (out,) = model.infer(feed).values()
    reference = engine.load_model(net, params, optimize=False).infer(feed)
    np.testing.assert_allclose(out, next(iter(reference.values())), rtol=1e-4, atol=1e-4)
    plan = model.plan_for(feed)
    space = plan.workspace
    kept = [*plan._inputs.values(), *plan._heads, space.scratch, *space._filled.values()]
    derived = [value for constant, value in space._derived.values()
               if isinstance(value, np.ndarray) and not np.may_share_memory(value, constant)]
    packed = [value.panels for value in plan.graph.constants.values()
              if isinstance(value, PackedWeight)]
    assert derived and packed and space._filled  # the model has each kind
    return kept, derived, packed


def test_every_array_a_plan_keeps_lies_on_huge_pages() -> None:
    """A plan of a few MB (its conv output 2.4 MB, its dense weight 2.4 MB): its inputs,
    buffers, scratch, padded inputs, the values derived from its weights and the dense layer's
    packed weight all lie on memory asked for huge pages, small arrays too."""
    kept, derived, packed = _plan_arrays(96, 32)
    for array in [*kept, *derived, *packed]:
        assert address(array) % ALIGN == 0 and asked_for_huge_pages(array), array.shape


def test_a_small_plan_keeps_numpys_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan and packed weights far below a huge page make no arena (an arena's huge page
    would be 2 MB of memory each: `workspace.ARENA_FROM_BYTES`) and stay aligned. (Whether
    NumPy's memory lies on huge pages is malloc's: it reuses what NumPy asked huge pages for.)"""
    made = []
    monkeypatch.setattr(workspace, "HugePageArena", lambda *args: made.append(args))
    monkeypatch.setattr(pack_weights, "HugePageArena", lambda *args: made.append(args))
    kept, derived, packed = _plan_arrays(8, 16)
    assert not made
    for array in [*kept, *derived, *packed]:
        assert address(array) % ALIGN == 0, array.shape
