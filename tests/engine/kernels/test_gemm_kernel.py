"""Our GEMM (`engine.kernels.gemm_kernel`) against float64 products, and where plans bind it."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

import engine
from engine import sym
from engine.cpu import spin_pool
from engine.cpu.llvm_jit import compile_ir
from engine.kernels import bf16, gemm_bind, gemm_kernel, winograd_bind
from engine.kernels.workspace import Workspace

pytestmark = pytest.mark.skipif(not gemm_kernel.available(),
                                reason="llvmlite cannot compile for this CPU")

RNG = np.random.default_rng(7)


def random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def expected(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def assert_product(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    # float32 sums of K terms, in another order than float64's
    np.testing.assert_allclose(c, expected(a, b), rtol=1e-4, atol=1e-5 * np.sqrt(a.shape[1]))


# Rows and columns around the tile's edges (12 × 32 with AVX-512, 6 × 16 with AVX2, ...).
EDGES = (1, 5, 6, 11, 12, 13, 25, 64)
COLUMNS = (1, 7, 8, 15, 16, 17, 31, 32, 33, 49, 100)


@pytest.mark.parametrize("rows", EDGES)
@pytest.mark.parametrize("columns", COLUMNS)
def test_every_edge_of_the_tile(rows: int, columns: int) -> None:
    for depth in (1, 3, 70):
        assert_every_bind(rows, depth, columns)


@pytest.mark.parametrize("rows", (1, 7, 49, 50))
@pytest.mark.parametrize("depth, columns", [(515, 529), (37, 100), (1031, 33)])
def test_few_rows_deep_products_against_float64(rows: int, depth: int, columns: int) -> None:
    # Batch-1 shapes whose weights stream (M of one to a few tiles), K past the prefetch
    # distance and no multiple of it, N leaving the last panel partly filled.
    assert_every_bind(rows, depth, columns)


def assert_every_bind(rows: int, depth: int, columns: int) -> None:
    """A random (rows × depth) · (depth × columns) product through each of the kernel's
    binds (plain, A packed with row blocks or B's column panels outside, B packed as column
    panels) equals float64's."""
    a, b = random(rows, depth), random(depth, columns)
    for run in ("plain", "packed", "packed, columns outside", "panels"):
        c = np.full((rows, columns), np.nan, np.float32)
        if run == "plain":
            gemm_kernel.multiply(a, b, c)
        elif run.startswith("packed"):
            product = gemm_kernel.bind_packed(gemm_kernel.pack(a), b, c,
                                              columns_outside=run.endswith("outside"))
            assert product.columns_outside == run.endswith("outside")
            product()
        else:
            gemm_kernel.bind_packed_columns(a, gemm_kernel.pack_columns(b), c)()
        assert_product(c, a, b)


@pytest.mark.parametrize("rows, depth, columns", [(1, 9, 17), (16, 512, 512), (49, 70, 100),
                                                  (13, 515, 33)])
def test_a_batch_of_products_on_column_panels(rows: int, depth: int, columns: int) -> None:
    batch = 3
    frame = random(batch, rows + 2, depth + 5)
    a = frame[:, 1:rows + 1, 2:depth + 2]  # strided A, rows and products apart
    b = random(batch, depth, columns)
    panels = np.stack([gemm_kernel.pack_columns(matrix) for matrix in b])
    c = np.full((batch, rows, columns), np.nan, np.float32)
    product = gemm_kernel.bind_packed_columns_batch(a, panels, c)
    assert product.columns_outside
    product()
    for index in range(batch):
        assert_product(c[index], a[index], b[index])
    bias = random(columns)
    product.with_epilogue(bias_columns=bias, low=0.0)()
    for index in range(batch):
        np.testing.assert_allclose(c[index], np.maximum(expected(a[index], b[index]) + bias, 0),
                                   rtol=1e-4, atol=1e-5 * np.sqrt(depth) + 1e-5)
    with pytest.raises(ValueError, match="a batch of products"):
        gemm_kernel.bind_packed_columns_batch(a[:2], panels, c)


def test_the_k_loop_prefetches_the_streamed_operand_ahead() -> None:
    from engine.kernels.gemm_ir import TileKernel

    tiles = TileKernel(gemm_kernel.tile())
    tiles.define_full("tile_full")
    # a loop prefetching each line of B's row ahead and the next panel's row into L2, and one
    # prefetching A's column and B's lines ``b_next`` on into L1; after each, the epilogue
    # asks for the residual's rows (two lines per vector, where one is added)
    lines = -(-gemm_kernel.tile().columns * 4 // 64)
    residual = 2 * 2 * gemm_kernel.tile().vectors
    text = str(tiles.module)
    assert text.count('call void @"llvm.prefetch.p0"') == 3 * lines + 1 + residual
    assert text.count("i32 0, i32 2, i32 1)") == lines  # prefetcht1: the next panel, into L2


@pytest.mark.parametrize("rows, depth, outside, expected", [
    (12, 64, True, "next panel"), (60, 2048, True, "next panel"),
    (60, 4608, True, "its own row"), (264, 1152, True, "its own row"),
    (264, 128, False, "next panel"), (264, 129, False, "near"), (12, 4608, False, "near")])
def test_what_each_step_asks_for_besides(rows: int, depth: int, outside: bool,
                                         expected: str) -> None:
    """The part's ``b_next``: the next panel's row where K is short, or with panels outside
    where A's rows and two panels fit `gemm_ir.NEXT_PANEL_L2_BYTES` (else the row itself:
    nothing more); with row blocks outside deeper than `gemm_ir.NEXT_PANEL_MAX_DEPTH`,
    `gemm_ir.NEAR_STEPS` rows on."""
    import llvmlite.ir as ir

    from engine.kernels import gemm_ir

    module = ir.Module()
    function = ir.Function(module, ir.FunctionType(ir.IntType(64), []), name="b_next")
    builder = ir.IRBuilder(function.append_basic_block())
    i64, i1 = ir.IntType(64), ir.IntType(1)
    constant = {"k": i64(depth), "column_step": i64(depth), "ldb": i64(3136)}
    builder.ret(gemm_ir.TileKernel._b_next(builder, constant, i64(rows), i64(32),
                                           i1(outside)))
    engine = compile_ir(str(module))
    answer = ctypes.CFUNCTYPE(ctypes.c_int64)(engine.get_function_address("b_next"))()
    assert answer == {"next panel": 32 * depth, "its own row": 0,
                      "near": gemm_ir.NEAR_STEPS * 3136}[expected]


@pytest.mark.parametrize("cpu, features, rows", [
    ("haswell", "+avx,+avx2,+fma,+sse4.2", 6),  # the EPYC machines without AVX-512
    ("x86-64", "+sse2", 4),  # neither: 128-bit vectors, no FMA
])
def test_the_tiles_of_other_x86_machines(cpu: str, features: str, rows: int) -> None:
    import llvmlite.binding as llvm

    host = llvm.get_host_cpu_features()
    if not all(host.get(name[1:]) for name in features.split(",")):
        pytest.skip(f"this CPU cannot run {cpu}'s code")
    kernels = gemm_kernel._compile(cpu, features)
    assert kernels is not None and kernels["tile"].rows == rows
    shape = kernels["tile"]
    part = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        kernels["part"])
    for m, n, k in ((shape.rows, shape.columns, 9), (2 * shape.rows + 1, 37, 50), (1, 3, 1),
                    (2 * shape.rows + 1, shape.columns + 1, 20)):
        a, b = random(m, k), random(k, n)
        blocks = -(-m // shape.rows)
        # A as it lies, and packed for this tile (unit row step: a narrow edge's columns
        # take their sums a column to a vector)
        padded = np.zeros((blocks * shape.rows, k), np.float32)
        padded[:m] = a
        packed = np.ascontiguousarray(padded.reshape(blocks, shape.rows, k).transpose(0, 2, 1))
        for start, row_step, lda, acs in ((a.ctypes.data, k, k, 1),
                                          (packed.ctypes.data, k, 1, shape.rows)):
            c = np.full((m, n), np.nan, np.float32)
            zeros = np.zeros(max(m, n) + 64, np.float32)
            context = gemm_kernel._context(shape, start, row_step, lda, acs, b.ctypes.data, 1,
                                           n, c, k, False, zeros.ctypes.data)
            for index in range(3):  # a job of three parts, run here in turn
                part(context.ctypes.data, index, 3)
            assert_product(c, a, b)


def test_an_edge_of_few_columns_runs_a_column_to_a_vector() -> None:
    from engine.kernels.gemm_ir import NarrowEdgeTileKernel, TileKernel

    shape = gemm_kernel.tile()
    narrow = NarrowEdgeTileKernel(shape)
    narrow.define_edge("tile_edge")
    plain = TileKernel(shape)
    plain.define_edge("tile_edge")
    text = str(narrow.module)
    columns = shape.width // 2 if shape.rows <= shape.width else 0
    assert all(f"columns{count}:" in text for count in range(1, columns + 1))
    assert f"columns{columns + 1}:" not in text and "columns1:" not in str(plain.module)


@pytest.mark.parametrize(("rows", "depth", "columns"),
                         [(25, 70, 36), (13, 3, 8), (12, 1, 33), (1, 64, 196), (30, 0, 4),
                          (40, 64, 3300)])  # C past `gemm_ir.ASKS_MIN_C_BYTES`
def test_a_packed_products_narrow_edge_adds_biases_residual_and_clamp(rows: int, depth: int,
                                                                      columns: int) -> None:
    """The last panel of a few columns over a packed A (sums a column to a vector): the
    epilogue's terms in order, each row's and column's own, the residual read where C's
    element lies, NaN kept, nothing written outside C; over a C large enough that the part
    asks for each tile's lines of C and the residual as the tile starts too."""
    a, b = random(rows, depth), random(depth, columns)
    bias_rows, bias_columns = random(rows), random(columns)
    out = np.full((3, rows, columns), 7.0, np.float32)
    other = random(3, rows, columns)
    other[1, rows - 1, columns - 1] = np.nan
    product = gemm_kernel.bind_packed(gemm_kernel.pack(a), b, out[1])
    product.with_epilogue(bias_rows=bias_rows, low=-0.5, high=1.0)()
    want = expected(a, b) + bias_rows[:, None]
    np.testing.assert_allclose(out[1], np.clip(want, -0.5, 1.0), rtol=1e-4, atol=1e-4)
    fused = product.with_epilogue(bias_rows=bias_rows, bias_columns=bias_columns) \
        .with_residual(out, other).with_epilogue(low=-0.5, high=1.0)
    fused()
    want = np.clip(want + bias_columns + other[1], -0.5, 1.0)
    np.testing.assert_allclose(out[1], want, rtol=1e-4, atol=1e-4)
    assert np.isnan(out[1, rows - 1, columns - 1])
    assert (out[[0, 2]] == 7.0).all()


def test_the_float32_part_asks_for_the_lines_of_a_residual_product() -> None:
    """The float32 tile's part asks for each tile's lines of C and the residual
    (``llvm.prefetch``) where `gemm_ir.TileKernel.asks_large_c` holds, under its test of
    the product (a residual added, C of `gemm_ir.ASKS_MIN_C_BYTES` or more); the AVX2 tile,
    measured on no host so, does not."""
    from engine.kernels import gemm_avx2_ir, gemm_ir

    def prefetches(asks: bool) -> int:
        tiles = gemm_ir.NarrowEdgeTileKernel(gemm_kernel.Tile(12, 16, 2))
        tiles.asks_large_c = asks
        tiles.define_part("part", tiles.define_full("tile_full"),
                          tiles.define_edge("tile_edge"), gemm_kernel.CONTEXT_FIELDS)
        text = str(tiles.module)
        start = text.index('define void @"part"')
        return text[start:text.index("\n}\n", start)].count("llvm.prefetch")

    assert gemm_ir.NarrowEdgeTileKernel.asks_large_c
    assert prefetches(True) > prefetches(False) == 0
    assert not gemm_avx2_ir.Avx2TileKernel.asks_large_c


def epilogue_product(weight: np.ndarray, data: np.ndarray, bias: np.ndarray,
                     residual: np.ndarray, precision: str, whole_panels: bool) -> np.ndarray:
    """``clip(weight @ data + bias + residual, -1, 1.5)`` as a plan binds it in
    ``precision``; with ``whole_panels``, over columns a whole number of the tile's panels
    (``data`` and ``residual`` padded with zero columns, the padding dropped)."""
    rows, columns = weight.shape[0], data.shape[1]
    panel = gemm_kernel.tile().columns
    padded = -(-columns // panel) * panel if whole_panels else columns
    wide = [np.zeros((array.shape[0], padded), np.float32) for array in (data, residual)]
    for array, original in zip(wide, (data, residual), strict=True):
        array[:, :columns] = original
    out = np.full((rows, padded), np.nan, np.float32)
    call = gemm_bind.weight_product(np, weight, wide[0], out,
                                    Workspace(np, 0, precision=precision))
    assert type(call) is not gemm_bind.Transposed  # the tile itself, its columns as they lie
    (call,) = gemm_bind.with_residual(gemm_bind.with_bias([call], bias_rows=bias), out,
                                      wide[1])
    (call,) = gemm_bind.clamped([call], -1.0, 1.5)
    call()
    return out[:, :columns]


# Products whose last panel is an edge of whole rows and a few columns past whole vectors:
# MobileNet v2's projection at 7² (a panel of 32, then 16 and 1 column), a layer at 14² (six
# panels, then 4 columns), and others; under a vector's columns (bf16's alone: float32's go
# to BLAS there).
EDGE_COLUMNS = [(160, 960, 49), (36, 576, 196), (12, 64, 17), (13, 65, 20), (12, 16, 36)]
NARROW_COLUMNS = [(25, 40, 3), (24, 32, 1)]


@pytest.mark.parametrize(("precision", "rows", "depth", "columns"), [
    *[("fp32", *shape) for shape in EDGE_COLUMNS],
    *[("bf16", *shape) for shape in EDGE_COLUMNS + NARROW_COLUMNS]])
def test_an_edges_columns_past_its_whole_vectors_sum_to_the_bits_of_whole_vectors(
        monkeypatch: pytest.MonkeyPatch, precision: str, rows: int, depth: int,
        columns: int) -> None:
    """An edge tile of whole rows whose columns run up to the kernel's `side_columns` past
    its whole vectors (AVX-512's float32 and AVX-512 BF16 tiles) sums those columns a column
    to a vector: with the filters' bias, a residual and the clamp, the output is that of the
    same product over whole panels (the columns past the edge zero), bit for bit, and the
    product of the operands (bf16's rounded)."""
    if precision == "fp32" and gemm_kernel.side_columns() == 0:
        pytest.skip("this host's float32 tile keeps every column in whole vectors (AVX2)")
    if precision == "bf16":
        if not gemm_kernel.available(gemm_kernel.BF16):
            pytest.skip("this CPU lacks AVX-512 BF16")
        monkeypatch.setattr(gemm_kernel, "available",
                            lambda kernel=None: kernel != gemm_kernel.AMX)
    weight, data = read_only(random(rows, depth)), random(depth, columns)
    bias, residual = random(rows), random(rows, columns)
    got = epilogue_product(weight, data, bias, residual, precision, whole_panels=False)
    whole = epilogue_product(weight, data, bias, residual, precision, whole_panels=True)
    assert np.array_equal(got.view(np.uint32), whole.view(np.uint32))
    if precision == "bf16":
        weight, data = bf16.rounded(weight), bf16.rounded(data)
    want = np.clip(expected(weight, data) + bias[:, None] + residual, -1.0, 1.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(depth))


def test_strided_operands_and_an_output_inside_a_larger_array() -> None:
    a = np.asfortranarray(random(40, 90))  # column-major A
    b = random(90, 200)[:, 30:130]  # rows 200 floats apart
    frame = np.zeros((60, 150), np.float32)
    c = frame[10:50, 20:120]
    gemm_kernel.multiply(a, b, c)
    assert_product(c, a, b)
    outside = frame.copy()
    outside[10:50, 20:120] = 0
    assert not outside.any()  # not a cell written beyond C
    transposed = random(90, 40).T  # A as a transposed view: unit row step
    gemm_kernel.multiply(transposed, b, c)
    assert_product(c, transposed, b)


def test_nan_and_inf_reach_the_output_as_in_numpy() -> None:
    a, b = random(30, 20), random(20, 40)
    a[3, 5] = np.nan
    b[7, 9] = np.inf
    c = np.empty((30, 40), np.float32)
    gemm_kernel.multiply(a, b, c)
    reference = expected(a, b)
    np.testing.assert_array_equal(np.isnan(c), np.isnan(reference))
    np.testing.assert_array_equal(np.isinf(c), np.isinf(reference))


def test_bias_per_row_and_column_and_the_clamp_as_results_are_stored() -> None:
    a, b = random(30, 20), random(20, 40)
    rows, columns = random(30), random(40)
    c = np.empty((30, 40), np.float32)
    product = gemm_kernel.bind(a, b, c)  # A read where it lies (not a packed copy)
    product.with_epilogue(bias_rows=rows, low=0.0, high=6.0)()
    want = expected(a, b) + rows[:, None]
    np.testing.assert_allclose(c, np.clip(want, 0, 6), rtol=1e-4, atol=1e-4)
    fused = product.with_epilogue(bias_columns=columns).with_epilogue(high=1.0)
    columns[:] = random(40)  # read at every run, where it lies
    fused()
    np.testing.assert_allclose(c, np.minimum(expected(a, b) + columns, 1.0), rtol=1e-4,
                               atol=1e-4)
    a[2, 3] = np.nan
    product.with_epilogue(low=0.0, high=6.0)()  # the clamp keeps NaN, as clip does
    np.testing.assert_array_equal(np.isnan(c), np.isnan(expected(a, b)))
    with pytest.raises(ValueError, match="float32, contiguous"):
        product.with_epilogue(bias_rows=random(60)[::2])
    with pytest.raises(ValueError, match="hold 40 values"):
        product.with_epilogue(bias_columns=random(39))  # would be read past its end


@pytest.mark.parametrize(("rows", "columns"), [(30, 40), (12, 32), (1, 5), (25, 33)])
def test_a_residual_is_added_after_the_biases_and_before_the_clamp(rows: int,
                                                                   columns: int) -> None:
    """Full tiles and every kind of edge; C is the second matrix of a larger output, and
    the residual's element for each of C's lies at the same place in an array shaped as
    that output. NaN in the residual reaches C, as an add and ``clip`` keep it."""
    a, b, bias = random(rows, 20), random(20, columns), random(rows)
    out = np.full((3, rows, columns), 7.0, np.float32)
    other = random(3, rows, columns)
    other[1, 0, columns - 1] = np.nan
    product = gemm_kernel.bind(a, b, out[1])
    assert product.writes_within(out) and not product.writes_within(out[0])
    fused = product.with_epilogue(bias_rows=bias).with_residual(out, other) \
        .with_epilogue(low=-0.5, high=1.0)
    fused()
    want = np.clip(expected(a, b) + bias[:, None] + other[1], -0.5, 1.0)
    np.testing.assert_allclose(out[1], want, rtol=1e-4, atol=1e-4)
    assert np.isnan(out[1, 0, columns - 1])
    assert (out[[0, 2]] == 7.0).all()  # only C's own elements are written
    other[1] = random(rows, columns)  # read where it lies, at every run
    fused()
    np.testing.assert_allclose(out[1], np.clip(expected(a, b) + bias[:, None] + other[1],
                                               -0.5, 1.0), rtol=1e-4, atol=1e-4)
    product()  # the product it came from adds none
    assert_product(out[1], a, b)
    with pytest.raises(ValueError, match="of the output's shape"):
        product.with_residual(out, other[:, :, :-1])


def test_a_product_moved_to_another_c_keeps_its_epilogue_and_leaves_its_own_c() -> None:
    """`Product.writing`: the same sums, biases and clamp stored into rows of another array
    (a band buffer's, rows a plane apart), the product it came from still writing its own;
    a C of another shape, or a product adding a residual, refused."""
    a, b, bias = random(24, 20), random(20, 35), random(24)
    c = np.full((24, 35), 7.0, np.float32)
    product = gemm_kernel.bind(a, b, c).with_epilogue(bias_rows=bias, low=-0.5, high=1.0)
    buffer = np.full((24, 2, 40), 5.0, np.float32)
    moved = product.writing(buffer[:, 1, :35])
    moved()
    want = np.clip(expected(a, b) + bias[:, None], -0.5, 1.0)
    np.testing.assert_allclose(buffer[:, 1, :35], want, rtol=1e-4, atol=1e-4)
    assert (buffer[:, 0] == 5.0).all() and (buffer[:, 1, 35:] == 5.0).all()
    assert (c == 7.0).all()
    product()
    np.testing.assert_array_equal(c, buffer[:, 1, :35])
    with pytest.raises(ValueError, match="of its shape"):
        product.writing(buffer[:, 1, :34])
    with pytest.raises(ValueError, match="no residual"):
        product.with_residual(c, random(24, 35)).writing(buffer[:, 1, :35])


def test_operands_it_does_not_take() -> None:
    a, b, c = random(20, 10), random(10, 30), np.empty((20, 30), np.float32)
    assert gemm_kernel.applies(a, b, c)
    assert not gemm_kernel.applies(a.astype(np.float64), b, c)
    assert not gemm_kernel.applies(a, np.asfortranarray(b), c)  # B's rows not contiguous
    assert not gemm_kernel.applies(a, b, np.empty((20, 30), np.float32, order="F"))
    assert not gemm_kernel.applies(a, b, c[:, :29])  # shapes do not match
    square = random(20, 20)
    assert not gemm_kernel.applies(square, square, square)  # C overwrites an operand
    assert not gemm_kernel.applies(random(20, 0), random(0, 30), c)


def test_worthwhile_wants_whole_vectors_of_columns() -> None:
    tile = gemm_kernel.tile()
    assert gemm_bind.worthwhile(tile.rows, 4 * tile.width)
    assert gemm_bind.worthwhile(tile.rows - 1, 4 * tile.width)  # fewer rows than a tile
    assert gemm_bind.worthwhile(1, 256)  # a matrix-vector product (weights packed)
    side = gemm_kernel.side_columns()  # an edge's columns past whole vectors fill its lanes
    assert gemm_bind.worthwhile(64, 3 * tile.width + side)
    assert not gemm_bind.worthwhile(tile.rows - 1, 3 * tile.width + 1)  # no whole row block
    assert not gemm_bind.worthwhile(64, 3 * tile.width + side + 1)  # a vector nearly empty
    assert not gemm_bind.worthwhile(1, 2)  # the seed MLP's last layer: BLAS


class FakeWorkspace:
    """`Workspace.derived` without a plan: computed once per weight and tag."""

    def __init__(self) -> None:
        self.made: dict = {}

    def derived(self, constant, tag, make):
        key = (id(constant), tag)
        if key not in self.made:
            self.made[key] = make(constant)
        return self.made[key]


def read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def test_products_follow_the_threads_blas_has_at_each_call(monkeypatch) -> None:
    workspace = FakeWorkspace()
    # 4M multiply-adds and more, with 64 rows and depth: BLAS with its threads, ours on one
    left, panel = random(64, 512), read_only(random(512, 256))
    bias = random(256)
    out = np.empty((64, 256), np.float32)
    call = gemm_bind.product_with_weight(np, left, panel, out, workspace)
    assert isinstance(call, gemm_bind.Threaded)
    call = call.with_epilogue(bias_columns=bias).with_epilogue(low=0.0)
    want = np.maximum(expected(left, panel) + bias, 0)
    monkeypatch.setattr(gemm_bind, "blas_threads", lambda: 2)
    with monkeypatch.context() as patched:  # ours would leave a mark: BLAS must run it
        patched.setattr(gemm_kernel.Product, "__call__", lambda self: out.fill(-1))
        out[:] = np.nan
        call()
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(gemm_bind, "blas_threads", lambda: 1)
    monkeypatch.setattr(call, "blas", lambda: out.fill(-1))  # and now ours must run it
    out[:] = np.nan
    call()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    monkeypatch.undo()
    # Small, or thin: ours whatever BLAS has
    small = gemm_bind.product_with_weight(np, random(16, 512), read_only(random(512, 512)),
                                          np.empty((16, 512), np.float32), workspace)
    assert isinstance(small, gemm_kernel.Product)


def test_a_product_blas_may_run_adds_a_residual_on_either_path(monkeypatch) -> None:
    """ResNet v2's block sum: a `Threaded` product (BLAS with its threads, else ours) adds a
    residual laid out as the whole output to its own rows, after its bias, before its clamp,
    whichever runs it."""
    weight, data = read_only(random(128, 256)), random(256, 200)
    bias = random(128)
    out = np.full((2, 128, 200), 7.0, np.float32)  # C is the second image's rows
    other = random(2, 128, 200)
    call = gemm_bind.weight_product(np, weight, data, out[1], FakeWorkspace())
    assert isinstance(call, gemm_bind.Threaded)
    assert call.writes_within(out) and not call.writes_within(out[0])
    fused = call.with_epilogue(bias_rows=bias).with_residual(out, other) \
        .with_epilogue(low=-1.0, high=2.0)
    want = np.clip(expected(weight, data) + bias[:, None] + other[1], -1.0, 2.0)
    monkeypatch.setattr(gemm_bind, "blas_threads", lambda: 2)
    with monkeypatch.context() as patched:  # ours would leave a mark: BLAS must run it
        patched.setattr(gemm_kernel.Product, "__call__", lambda self: out.fill(-5))
        fused()
    np.testing.assert_allclose(out[1], want, rtol=1e-4, atol=1e-4)
    assert (out[0] == 7.0).all()
    monkeypatch.setattr(gemm_bind, "blas_threads", lambda: 1)
    monkeypatch.setattr(fused, "blas", lambda: out.fill(-5))  # and now ours must run it
    out[1] = np.nan
    fused()
    np.testing.assert_allclose(out[1], want, rtol=1e-4, atol=1e-4)
    assert (out[0] == 7.0).all()
    with pytest.raises(ValueError, match="of the output's shape"):
        call.with_residual(out, other[:, :, :-1])


def residual_add_passes(model: engine.Model, feed: dict[str, np.ndarray]) -> int:
    """How many of the plan's steps add a residual in a pass of their own."""
    from engine.kernels import epilogue
    from tests.engine.runtime.helpers import step_funcs

    return sum(func is epilogue.bias_add_clamp
               or getattr(func, "__name__", "").startswith("elemwise_add")
               for func in step_funcs(model.plan_for(feed)))


def test_resnet50_v2_sums_in_the_products_keep_the_result(monkeypatch) -> None:
    """fp32 ResNet-50 v2 (112×112, one image, BLAS on one thread): each block's sum added by
    its last product, `Threaded` ones too, against the same plan adding them in passes of
    their own, the same sums in the same order."""
    from bench import nets
    from engine.cpu import parallel

    symbol = nets.resnet50_v2()
    params = nets.random_params(symbol, (1, 3, 112, 112), seed=3)
    feed = {"data": np.random.default_rng(4).standard_normal((1, 3, 112, 112))
            .astype(np.float32)}
    monkeypatch.setattr(parallel, "threads", lambda: 1)
    monkeypatch.setattr(gemm_bind, "blas_threads", lambda: 1)
    fused = engine.load_model(symbol, params)
    got = fused.infer(feed)["output_output"]
    monkeypatch.setattr(gemm_bind.Threaded, "writes_within", None)
    monkeypatch.setattr(gemm_bind.Transposed, "writes_within", None)
    apart = engine.load_model(symbol, params)
    want = apart.infer(feed)["output_output"]
    # 16 blocks; at 112² on AVX-512 6 are products run transposed, adding it as they copy
    assert residual_add_passes(apart, feed) == 16 and residual_add_passes(fused, feed) == 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


class ScratchWorkspace(FakeWorkspace):
    def zeroed(self, shape, dtype, tag):
        return np.zeros(shape, dtype)


def test_few_columns_run_transposed_and_land_in_place() -> None:
    # 57 columns: 9 past 3 whole vectors, more than an edge sums a column to a vector
    weight, data = read_only(random(64, 40)), random(40, 57)
    frame = np.zeros((70, 57), np.float32)
    out = frame[3:67]
    call = gemm_bind.weight_product(np, weight, data, out, ScratchWorkspace())
    assert isinstance(call, gemm_bind.Transposed)
    call()
    assert_product(out, weight, data)
    assert not frame[:3].any() and not frame[67:].any()
    # A bias per filter (row of ``out``) and a clamp, added as the transposed product stores
    bias = random(64)
    fused = gemm_bind.with_bias([call], bias_rows=bias)
    fused = gemm_bind.clamped(fused, 0.0, 1.5)
    assert fused is not None and isinstance(fused[0], gemm_bind.Transposed)
    fused[0]()
    np.testing.assert_allclose(out, np.clip(expected(weight, data) + bias[:, None], 0.0, 1.5),
                               rtol=1e-4, atol=1e-4)
    assert not frame[:3].any() and not frame[67:].any()
    call()  # the call it came from adds none
    assert_product(out, weight, data)
    # Half a vector of filters (8 of AVX-512's 16 lanes, 4 of AVX2's 8) fills too few lanes
    # either way: BLAS.
    filters = gemm_kernel.tile().width // 2
    thin = gemm_bind.weight_product(np, read_only(random(filters, 40)), data,
                                    np.empty((filters, 57), np.float32), ScratchWorkspace())
    assert thin is None


def test_a_transposed_product_adds_a_residual_as_it_copies_then_clamps() -> None:
    weight, data = read_only(random(64, 40)), random(40, 57)
    frame = np.zeros((70, 57), np.float32)
    out, other, bias = frame[3:67], random(70, 57), random(64)
    call = gemm_bind.weight_product(np, weight, data, out, ScratchWorkspace())
    assert isinstance(call, gemm_bind.Transposed)
    fused = gemm_bind.with_residual(gemm_bind.with_bias([call], bias_rows=bias), frame, other)
    assert fused is not None and isinstance(fused[0], gemm_bind.Transposed)
    fused = gemm_bind.clamped(fused, -0.5, 1.5)
    fused[0]()
    np.testing.assert_allclose(
        out, np.clip(expected(weight, data) + bias[:, None] + other[3:67], -0.5, 1.5),
        rtol=1e-4, atol=1e-4)
    assert not frame[:3].any() and not frame[67:].any()
    # a clamp set already would come before the sum: no residual then
    assert gemm_bind.with_residual(gemm_bind.clamped([call], 0.0, 6.0), frame, other) is None
    with pytest.raises(ValueError, match="residual"):
        call.with_residual(frame, other.astype(np.float64))


def test_a_weight_meets_a_large_activation_a_panel_of_columns_at_a_time() -> None:
    """Past `STREAMED_RIGHT_BYTES`, at least `STREAMED_RIGHT_MIN_DEPTH` deep, the
    activation's column panels are the outer loop (each read once); smaller or shallower,
    the packed weight's row blocks. Either way with the bias, the clamp and a residual as
    stored, in place inside a larger output."""
    tile = gemm_kernel.tile()
    limit, deep = gemm_bind.STREAMED_RIGHT_BYTES // 4, gemm_bind.STREAMED_RIGHT_MIN_DEPTH
    for depth, columns, outside in ((deep, limit // deep + 7 * tile.width + 3, True),
                                    (deep, limit // deep, False),
                                    (deep - 1, 2 * limit // (deep - 1), False)):
        weight, data = read_only(random(3 * tile.rows + 5, depth)), random(depth, columns)
        bias, other = random(weight.shape[0]), random(2, weight.shape[0], columns)
        out = np.full((2, weight.shape[0], columns), np.nan, np.float32)
        product = gemm_bind.weight_product(np, weight, data, out[1], FakeWorkspace())
        assert isinstance(product, gemm_kernel.Product)
        assert product.columns_outside == outside == gemm_bind.streams_right(depth, columns)
        product.with_epilogue(bias_rows=bias).with_residual(out, other) \
            .with_epilogue(low=-1.0, high=2.0)()
        want = np.clip(expected(weight, data) + bias[:, None] + other[1], -1.0, 2.0)
        np.testing.assert_allclose(out[1], want, rtol=1e-4, atol=1e-4)
        assert np.isnan(out[0]).all()


def test_a_wide_activation_walks_its_column_panels_only_when_split_over_threads() -> None:
    """A product whose activation is `SHARED_RIGHT_BYTES` or more and `SHARED_RIGHT_RATIO`
    times the weight (ResNet-18's fp32 stem band) walks row blocks outside run whole and
    column panels outside run in parts; both walks give the same sums. A weight as large as
    the activation keeps row blocks either way."""
    rows, depth = 64, gemm_bind.STREAMED_RIGHT_MIN_DEPTH + 19
    columns = gemm_bind.SHARED_RIGHT_BYTES // (4 * depth) + 37
    weight, data = read_only(random(rows, depth)), random(depth, columns)
    bias = random(rows)
    out = np.full((rows, columns), np.nan, np.float32)
    bound = gemm_bind.weight_product(np, weight, data, out, FakeWorkspace())
    product = getattr(bound, "ours", bound)  # a `Threaded` runs ours on the pool's threads
    assert isinstance(product, gemm_kernel.Product)
    assert product.columns_when_split and not product.columns_outside
    product = product.with_epilogue(bias_rows=bias, low=0.0)
    assert product.columns_when_split
    product()
    whole = out.copy()
    np.testing.assert_allclose(whole, np.maximum(expected(weight, data) + bias[:, None], 0),
                               rtol=1e-4, atol=1e-4)
    out[:] = np.nan
    with spin_pool.armed(2):
        product()
    np.testing.assert_array_equal(out, whole)  # each tile sums in the same order either way
    square = gemm_bind.weight_product(np, read_only(random(columns, depth)), data,
                                      np.empty((columns, columns), np.float32),
                                      FakeWorkspace())
    square = getattr(square, "ours", square)
    assert not square.columns_when_split and not square.columns_outside


def test_blas_threads_reads_numpy_openblas() -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        assert gemm_bind.blas_threads() == 1


def _network() -> tuple[object, dict[str, np.ndarray]]:
    """1×1, 3×3 (Winograd at 8×8 with 64 channels), strided im2col and dense layers."""
    data = sym.var("data")
    x = sym.Convolution(data, kernel=(1, 1), num_filter=64, name="pointwise")
    x = sym.Activation(x, act_type="relu")
    x = sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=64, name="winograd")
    x = sym.Convolution(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), num_filter=48,
                        name="strided")
    x = sym.FullyConnected(x, num_hidden=64, name="dense")
    rng = np.random.default_rng(3)
    shapes = {"pointwise_weight": (64, 16, 1, 1), "winograd_weight": (64, 64, 3, 3),
              "strided_weight": (48, 64, 3, 3), "dense_weight": (64, 48 * 4 * 4)}
    params = {name: rng.standard_normal(shape).astype(np.float32) * 0.1
              for name, shape in shapes.items()}
    for name, (filters, *_) in shapes.items():
        params[name.replace("weight", "bias")] = rng.standard_normal(filters).astype(np.float32)
    return x, params


def test_plans_bind_it_and_agree_with_the_reference_interpreter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # F(2×2) with NumPy's transforms at 8×8 (as without numba), whose 16 products are ours
    # (compiled transforms would run the whole layer as one call).
    monkeypatch.setattr(winograd_bind, "compiled", SimpleNamespace(available=lambda: False))
    symbol, params = _network()
    feed = {"data": np.random.default_rng(4).standard_normal((13, 16, 8, 8), np.float32)}
    optimised = engine.load_model(symbol, params, optimize=True)
    reference = engine.load_model(symbol, params, optimize=False)
    got = optimised.infer(feed)
    want = reference.infer(feed)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-3)
    steps = optimised.plan_for(feed).steps
    products = [step.call for step in steps if isinstance(step.call, gemm_kernel.Product)]
    # the 1×1 layer (A packed), the Winograd and dense layers (B in panels); the strided
    # one's product is `Threaded` or transposed depending on the tile
    assert {product.columns_outside for product in products} == {False, True}
    by_ours = {step.node.name for step in steps if step.call in products}
    assert {"winograd", "dense"} <= by_ours and len(by_ours) >= 3  # and the 1×1 + ReLU
