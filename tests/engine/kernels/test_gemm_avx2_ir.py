"""The AVX2 tile's parts (`engine.kernels.gemm_avx2_ir`): A packed, read at constant offsets,
and any other A, through the general loop, B's panels copied or read where they lie, give
float64's product."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.kernels import gemm_avx2_ir, gemm_kernel

AVX2 = ("haswell", "+avx,+avx2,+fma,+sse4.2")
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def kernels() -> dict:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    host = llvm.get_host_cpu_features()
    if not all(host.get(name[1:]) for name in AVX2[1].split(",")):
        pytest.skip("this CPU lacks AVX2 with FMA")
    compiled = gemm_kernel._compile(*AVX2)
    assert compiled is not None and compiled["tile"] == gemm_kernel.AVX2_TILE
    return compiled


def layouts(a: np.ndarray, rows: int) -> dict[str, tuple[np.ndarray, int, int, int]]:
    """``a`` (M × K) as the kernel may read it: (the array kept alive, row step, row stride,
    column stride), in floats."""
    m, k = a.shape
    blocks = -(-m // rows)
    padded = np.zeros((blocks * rows, k), np.float32)
    padded[:m] = a
    packed = np.ascontiguousarray(padded.reshape(blocks, rows, k).transpose(0, 2, 1))
    # Unit row stride, column stride MR: a packed block's strides, met by a matrix of MR rows
    # stored transposed as well.
    across = np.ascontiguousarray(a.T)
    return {"rows contiguous": (a, k, k, 1), "packed": (packed, k, 1, rows),
            "transposed": (across, 1, 1, m)}


# Rows: under a tile, a tile, three row blocks (B read where it lies), and enough row blocks
# that a part copies B's panels (`PANEL_MIN_ROW_BLOCKS`).
ROWS = (5, 6, 13, 6 * gemm_avx2_ir.PANEL_MIN_ROW_BLOCKS + 1)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n, k", [(16, 9), (37, 50), (3, 1), (17, 200),
                                  (21, gemm_avx2_ir.PANEL_MAX_DEPTH),
                                  (21, gemm_avx2_ir.PANEL_MAX_DEPTH + 1)])
@pytest.mark.parametrize("columns_outside", (False, True))
def test_each_layout_of_a_gives_the_product(kernels: dict, m: int, n: int, k: int,
                                             columns_outside: bool) -> None:
    shape = kernels["tile"]
    part = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        kernels["part"])
    a = RNG.standard_normal((m, k), dtype=np.float32)
    b = RNG.standard_normal((k, n), dtype=np.float32)
    for name, (array, row_step, lda, acs) in layouts(a, shape.rows).items():
        c = np.full((m, n), np.nan, np.float32)
        zeros = np.zeros(max(m, n) + 64, np.float32)
        context = gemm_kernel._context(shape, array.ctypes.data, row_step, lda, acs,
                                       b.ctypes.data, 1, n, c, k, columns_outside,
                                       zeros.ctypes.data)
        # A job of four parts, some starting mid-panel, run here last first: a part's first
        # panel is never the one the part before left in the copy.
        for index in reversed(range(4)):
            part(context.ctypes.data, index, 4)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4,
                                   atol=1e-5 * np.sqrt(k), err_msg=name)
