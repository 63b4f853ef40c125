"""Plans and packed weights start on cache lines (`workspace.empty_aligned`), so a plan's speed
does not depend on where malloc happened to put its buffers."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import sym
from engine.kernels import gemm_kernel
from engine.kernels.workspace import ALIGN, address, empty_aligned


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
