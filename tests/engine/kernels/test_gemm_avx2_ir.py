"""The AVX2 tile's parts (`engine.kernels.gemm_avx2_ir`): A packed, read at constant offsets,
and any other A, through the general loop, B's panels copied or read where they lie, give
float64's product."""

from __future__ import annotations

import ctypes
import hashlib

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


@pytest.mark.parametrize("m", (13, 6 * gemm_avx2_ir.PANEL_MIN_ROW_BLOCKS + 1))
@pytest.mark.parametrize("columns_outside", (False, True))
@pytest.mark.parametrize("parts", (1, 3, 7))
def test_whole_tiles_in_a_row_each_add_their_own_biases_and_residual(
        kernels: dict, m: int, columns_outside: bool, parts: int) -> None:
    """A part runs its whole tiles down a panel or along a row block in one call, each tile's
    operands moved on: every tile's C, biases and residual are its own, edges and parts that
    start or end inside a line of whole tiles included."""
    shape = kernels["tile"]
    part = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        kernels["part"])
    n, k = 3 * shape.columns + 5, 16
    a = RNG.standard_normal((m, k), dtype=np.float32)
    b = RNG.standard_normal((k, n), dtype=np.float32)
    rows_bias = RNG.standard_normal(m + shape.rows, dtype=np.float32)
    columns_bias = RNG.standard_normal(n + shape.columns, dtype=np.float32)
    residual = RNG.standard_normal((m, n), dtype=np.float32)
    array, row_step, lda, acs = layouts(a, shape.rows)["packed"]
    c = np.full((m, n), np.nan, np.float32)
    context = gemm_kernel._context(shape, array.ctypes.data, row_step, lda, acs, b.ctypes.data,
                                   1, n, c, k, columns_outside, rows_bias.ctypes.data)
    fields = gemm_kernel.CONTEXT_FIELDS
    context[fields["columns_bias"]] = columns_bias.ctypes.data
    context[fields["residual"]] = residual.ctypes.data
    context[fields["low"]:fields["high"] + 1].view(np.float64)[:] = -1.0, 2.0
    for index in reversed(range(parts)):
        part(context.ctypes.data, index, parts)
    expected = (a.astype(np.float64) @ b.astype(np.float64) + rows_bias[:m, None]
                + columns_bias[None, :n] + residual)
    np.testing.assert_allclose(c, np.clip(expected, -1.0, 2.0), rtol=1e-4, atol=1e-4)


# The other tiles' modules, pinned by the SHA-256 of their IR text: `gemm_ir`'s part loop is
# shared with the AVX2 tile, and what the AVX2 tile needs of it must leave the AVX-512 and AMX
# modules as they are (hosts this project cannot always measure on). A change meant for them
# updates these digests.
OTHER_MODULES = {
    "avx512 fp32": "df4ad79de529420568c43e6e2f71a7db7aa8f9fe7e03cb3146004810c7ef21e9",
    "avx512 bf16 pairs": "4b8578bbbeeff78a6eab08f5dcc8300bc402bbf794815d1e7bbddbda60a86d0e",
    "amx": "20534c0c1bba04031af6d8911d3aae0b09b1ed02d9c348658fda87eda6e1506c",
}


def test_the_other_tiles_modules_are_unchanged() -> None:
    from engine.kernels.gemm_amx_ir import AmxTileKernel
    from engine.kernels.gemm_bf16_ir import PairTileKernel
    from engine.kernels.gemm_ir import NarrowEdgeTileKernel

    wide = gemm_kernel.Tile(12, 16, 2)
    for name, kernel in (("avx512 fp32", NarrowEdgeTileKernel(wide)),
                         ("avx512 bf16 pairs", PairTileKernel(wide)),
                         ("amx", AmxTileKernel(gemm_kernel.AMX_TILE))):
        kernel.define_part("part", kernel.define_full("tile_full"),
                           kernel.define_edge("tile_edge"), gemm_kernel.CONTEXT_FIELDS)
        digest = hashlib.sha256(str(kernel.module).encode()).hexdigest()
        assert digest == OTHER_MODULES[name], name


def prefetches(kernel: gemm_avx2_ir.Avx2TileKernel) -> tuple[int, int]:
    """The prefetches in a kernel's whole-tile module's text: all, and those into L2."""
    kernel.define_full("tile_full")
    text = str(kernel.module)
    return text.count('call void @"llvm.prefetch.p0"'), text.count("i32 0, i32 2, i32 1)")


def test_the_k_loops_prefetch_b_panels_alone() -> None:
    """The whole tile's K loops ask for B ahead (each line of its row, and the next panel's
    row into L2) in one loop per layout of A, the one run where B streams from panels;
    nothing else in the loops asks for anything."""

    class Quiet(gemm_avx2_ir.Avx2TileKernel):
        k_loop_streams = ()

    shape = gemm_kernel.AVX2_TILE
    lines = -(-shape.columns * 4 // 64)
    (every, into_l2), (quiet, quiet_l2) = (prefetches(kernel(shape)) for kernel in
                                            (gemm_avx2_ir.Avx2TileKernel, Quiet))
    assert quiet_l2 == 0
    assert into_l2 == 2  # two layouts of A
    assert every - quiet == 2 * (lines + 1)


@pytest.mark.parametrize("m", (1, 49))
@pytest.mark.parametrize("parts", (1, 3))
def test_panels_streamed_with_their_prefetches_give_the_product(kernels: dict, m: int,
                                                                parts: int) -> None:
    """B in panels (`gemm_kernel.pack_columns`), read where they lie with column panels
    outside (a transposed product's weight: the K loops that prefetch), a row of A or 49
    (eight row blocks and a one-row edge), strided or transposed as the 7² layers' are."""
    shape = kernels["tile"]
    part = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        kernels["part"])
    n, k = 5 * shape.columns + 3, 300
    a = RNG.standard_normal((m, k), dtype=np.float32)
    b = RNG.standard_normal((k, n), dtype=np.float32)
    panels = gemm_kernel.pack_columns(b, shape.columns)
    assert panels.shape[2] == shape.columns
    for name, (array, row_step, lda, acs) in layouts(a, shape.rows).items():
        c = np.full((m, n), np.nan, np.float32)
        zeros = np.zeros(max(m, n) + 64, np.float32)
        context = gemm_kernel._context(shape, array.ctypes.data, row_step, lda, acs,
                                       panels.ctypes.data, k, shape.columns, c, k, True,
                                       zeros.ctypes.data)
        for index in reversed(range(parts)):
            part(context.ctypes.data, index, parts)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4,
                                   atol=1e-5 * np.sqrt(k), err_msg=name)
