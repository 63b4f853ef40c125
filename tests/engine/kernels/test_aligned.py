"""Plans and packed weights start on cache lines (`workspace.empty_aligned`), so a plan's speed
does not depend on where malloc happened to put its buffers; a plan's large arrays start on huge
pages."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

import engine
from engine import sym
from engine.kernels import gemm_kernel, workspace
from engine.kernels.workspace import ALIGN, address, empty_aligned

huge_pages_asked = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"),
                                      reason="no huge-page request on this system")


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


@huge_pages_asked
@pytest.mark.parametrize("floats", [workspace.HUGE_PAGE_FROM_BYTES // 4,
                                    workspace.HUGE_PAGE_BYTES // 4 + 3, 3 << 20])
def test_large_arrays_asked_for_huge_pages_start_on_one(floats: int) -> None:
    arrays = [empty_aligned(np, (floats,), np.float32, huge_pages=True) for _ in range(3)]
    gc.collect()  # each array alone keeps its memory mapped
    for index, array in enumerate(arrays):
        assert address(array) % workspace.HUGE_PAGE_BYTES == 0
        assert array.shape == (floats,) and array.dtype == np.float32
        assert array.flags.c_contiguous and array.flags.writeable
        array[...] = index
    for index, array in enumerate(arrays):  # the arrays do not overlap
        assert (array == index).all()


def test_small_arrays_asked_for_huge_pages_keep_numpys_memory() -> None:
    floats = workspace.HUGE_PAGE_FROM_BYTES // 4 - 1
    for _ in range(4):
        array = empty_aligned(np, (floats,), np.float32, huge_pages=True)
        assert address(array) % ALIGN == 0 and array.nbytes < workspace.HUGE_PAGE_BYTES
        # NumPy's memory: the array views an array owning its memory, not a mapping's
        assert array.base.base is None


@huge_pages_asked
def test_a_plans_large_input_starts_on_a_huge_page_and_runs() -> None:
    rows = workspace.HUGE_PAGE_FROM_BYTES // (4 * 17) + 1
    data = sym.var("data")
    net = sym.FullyConnected(data, num_hidden=33, name="fc1")
    weight = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32)
    params = {"fc1_weight": weight, "fc1_bias": np.ones(33, np.float32)}
    model = engine.load_model(net, params)
    feed = np.random.default_rng(1).standard_normal((rows, 17)).astype(np.float32)
    plan = model.plan_for({"data": feed})
    assert address(plan._inputs["data"]) % workspace.HUGE_PAGE_BYTES == 0
    (out,) = plan.run({"data": feed})
    np.testing.assert_allclose(out, feed @ weight.T + 1, rtol=1e-4, atol=1e-4)
