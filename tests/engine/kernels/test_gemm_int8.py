"""The int8 GEMM (VNNI, else AVX2; AMX-INT8 where the host has it) against NumPy's integer
matmul: exact int32 sums for uint8 and int8 rows, at shapes that leave remainders everywhere (K
not a multiple of 4 or of 64, partial row blocks and column panels)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from engine.cpu import host_features
from engine.kernels import gemm_int8


def _host_has_vnni() -> bool:
    return host_features.has("avx512f") and host_features.has("avx512_vnni")


def _host_has_int8_kernel() -> bool:
    return _host_has_vnni() or host_features.has("avx2")


def test_the_kernels_compile_exactly_where_the_host_has_vnni_or_avx2() -> None:
    assert gemm_int8.available() == _host_has_int8_kernel()
    assert gemm_int8.vnni_available() == _host_has_vnni()


needs_kernel = pytest.mark.skipif(not _host_has_int8_kernel(),
                                  reason="the host has neither AVX-512 VNNI nor AVX2")

SHAPES = [(1, 1, 1), (1, 3, 5), (7, 13, 17), (6, 4, 16), (13, 64, 33), (16, 9, 64),
          (17, 147, 65), (25, 30, 100), (2, 2048, 10), (64, 576, 128), (5, 5, 250),
          (33, 65, 31), (40, 300, 70)]


KERNELS = [pytest.param(False, id="vector"), pytest.param(
    True, id="amx", marks=pytest.mark.skipif(
        not (host_features.has("amx_int8") and host_features.amx_permitted()),
        reason="the host has no AMX-INT8"))]


def test_the_amx_kernel_compiles_where_the_host_has_amx_int8() -> None:
    expected = _host_has_vnni() and host_features.has("amx_int8") and \
        host_features.amx_permitted()
    assert gemm_int8.amx_available() == expected


@needs_kernel
@pytest.mark.parametrize("amx", KERNELS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "x".join(map(str, shape)))
def test_products_equal_numpys_integer_matmul(shape: tuple[int, int, int], dtype: type,
                                              amx: bool) -> None:
    m, k, n = shape
    rng = np.random.default_rng(m * 10_000 + k * 100 + n)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(dtype)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    product = gemm_int8.multiply(a, gemm_int8.PackedWeights(w, amx))
    assert product.dtype == np.int32 and product.shape == (m, n)
    np.testing.assert_array_equal(product, a.astype(np.int64) @ w.astype(np.int64))


@needs_kernel
@pytest.mark.parametrize("amx", KERNELS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_extreme_values_sum_exactly(dtype: type, amx: bool) -> None:
    """The largest magnitudes at a long K: no saturation anywhere (vpmaddubsw would
    saturate its int16 pair sums here)."""
    info = np.iinfo(dtype)
    k = 4099
    a = np.full((3, k), info.max if dtype == np.uint8 else info.min, dtype)
    w = np.stack([np.full(k, -128), np.full(k, 127), np.tile([-128, 127], k)[:k]], axis=1)
    w = w.astype(np.int8)
    product = gemm_int8.multiply(a, gemm_int8.PackedWeights(w, amx))
    np.testing.assert_array_equal(product, a.astype(np.int64) @ w.astype(np.int64))


@needs_kernel
@pytest.mark.parametrize("amx", KERNELS)
def test_strided_activations_and_one_packing_for_many_calls(amx: bool) -> None:
    rng = np.random.default_rng(3)
    w = gemm_int8.PackedWeights(rng.integers(-128, 128, (40, 24)).astype(np.int8), amx)
    for rows in (1, 5, 40):
        wide = rng.integers(0, 256, (rows, 80)).astype(np.uint8)
        a = wide[:, ::2]  # not contiguous
        expected = a.astype(np.int64) @ np.asarray(_unpack(w), np.int64)
        np.testing.assert_array_equal(gemm_int8.multiply(a, w), expected)


@needs_kernel
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("n", [16, 40, 100, 1000])
def test_one_row_runs_on_the_one_row_tile_exactly(monkeypatch: pytest.MonkeyPatch, n: int,
                                                  dtype: type) -> None:
    """A single row (a classifier at batch 1) takes the one-row tile of each panel width,
    its sums NumPy's to the last bit, the extreme values included; two rows keep the
    whole tile."""
    kernels = gemm_int8._compiled()
    taken: list[object] = []
    for key in [key for key in kernels if isinstance(key, tuple) and key[0] == "row"]:
        kernel = kernels[key]
        monkeypatch.setitem(kernels, key, lambda *args, kernel=kernel, key=key: (
            taken.append(key), kernel(*args))[1])
    rng = np.random.default_rng(n)
    info = np.iinfo(dtype)
    k = 2051
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    w[:, 0] = -128
    weights = gemm_int8.PackedWeights(w)
    for rows in (1, 2):
        a = rng.integers(info.min, info.max + 1, (rows, k)).astype(dtype)
        a[:, :k // 2] = info.max if dtype == np.uint8 else info.min
        np.testing.assert_array_equal(gemm_int8.multiply(a, weights),
                                      a.astype(np.int64) @ w.astype(np.int64))
        assert taken == [("row", weights.vectors)]


@needs_kernel
@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_offsets_given_replace_the_compensation_and_sum_exactly(rows: int,
                                                                 dtype: type) -> None:
    """A caller's offsets (its bias plus the signed rows' compensation) are added to every
    row's sums, exactly where the result fits int32, however near its ends."""
    rng = np.random.default_rng(rows)
    info = np.iinfo(dtype)
    k, n = 300, 40
    a = rng.integers(info.min, info.max + 1, (rows, k)).astype(dtype)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    weights = gemm_int8.PackedWeights(w)
    exact = a.astype(np.int64) @ w.astype(np.int64)
    bias = rng.integers(-1000, 1000, n).astype(np.int64)
    bias[0] = 2 ** 31 - 1 - exact[:, 0].max()  # the largest int32 reached
    bias[1] = -2 ** 31 - exact[:, 1].min()  # the smallest
    compensation = weights.signed_offsets if dtype == np.int8 else weights.no_offsets
    offsets = compensation.astype(np.int64)
    offsets[:n] += bias
    padded = gemm_int8.padded_rows(rows, weights)
    padded[:rows, :k] = a.view(np.uint8) ^ 0x80 if dtype == np.int8 else a
    product = gemm_int8.multiply_rows(padded, rows, weights, dtype == np.int8,
                                      offsets.astype(np.int32))
    np.testing.assert_array_equal(product, exact + bias)
    with pytest.raises(ValueError, match="offsets int64"):
        gemm_int8.multiply_rows(padded, rows, weights, False, offsets)


def _unpack(weights: gemm_int8.PackedWeights) -> np.ndarray:
    """The (K, N) matrix back out of the packed panels (the packing's own check)."""
    columns = weights.vectors * gemm_int8.LANES
    order = weights.packed.transpose(1, 3, 0, 2).reshape(weights.groups * 4,
                                                         weights.panels * columns)
    return order[:weights.k, :weights.n]


def test_bad_operands_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="int8"):
        gemm_int8.PackedWeights(np.zeros((4, 4), np.float32))
    if not gemm_int8.available():
        return
    weights = gemm_int8.PackedWeights(np.zeros((4, 4), np.int8))
    with pytest.raises(ValueError, match="K = 4"):
        gemm_int8.multiply(np.zeros((2, 5), np.uint8), weights)
    with pytest.raises(ValueError, match="float32"):
        gemm_int8.multiply(np.zeros((2, 4), np.float32), weights)


def test_a_host_without_vnni_or_avx2_keeps_float64_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(gemm_int8, "_state", {})
    monkeypatch.setattr(host_features, "has", lambda flag: flag not in ("avx512_vnni", "avx2"))
    with caplog.at_level(logging.INFO, logger=gemm_int8.__name__):
        assert not gemm_int8.available()
        assert not gemm_int8.available()
    assert [record.getMessage() for record in caplog.records].count(
        "int8 products run as float64 BLAS: no AVX-512 VNNI or AVX2 JIT here") == 1
    with pytest.raises(RuntimeError, match="not available"):
        gemm_int8.multiply(np.zeros((1, 4), np.uint8),
                           gemm_int8.PackedWeights(np.zeros((4, 1), np.int8)))


@pytest.mark.skipif(not host_features.has("avx2"), reason="the host has no AVX2")
def test_a_host_without_vnni_runs_the_avx2_kernel_exactly_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Without VNNI (on a VNNI host too, its flag hidden), the AVX2 kernel compiles, its
    weights tiled in `AVX2_ROWS` rows, and gives NumPy's sums for every panel width, the
    extreme values included, K over two of its chunks of buffered activations; the log says
    which kernel runs, once."""
    from engine.kernels.gemm_int8_avx2_ir import CHUNK

    k = 4 * CHUNK + 89  # two chunks, the second partial, K not a multiple of 4
    has = host_features.has
    monkeypatch.setattr(gemm_int8, "_state", {})
    monkeypatch.setattr(host_features, "has", lambda flag: flag != "avx512_vnni" and has(flag))
    rng = np.random.default_rng(2)
    with caplog.at_level(logging.INFO, logger=gemm_int8.__name__):
        for n in (9, 17, 33, 65, 130):
            w = rng.integers(-128, 128, (k, n)).astype(np.int8)
            w[:, 0] = -128
            weights = gemm_int8.PackedWeights(w)
            assert weights.rows == gemm_int8.AVX2_ROWS
            for dtype, m in ((np.uint8, 1), (np.uint8, 5), (np.int8, 1), (np.int8, 8)):
                info = np.iinfo(dtype)
                a = rng.integers(info.min, info.max + 1, (m, k)).astype(dtype)
                a[:, :k // 2] = info.max if dtype == np.uint8 else info.min
                np.testing.assert_array_equal(gemm_int8.multiply(a, weights),
                                              a.astype(np.int64) @ w.astype(np.int64))
    assert gemm_int8.available() and not gemm_int8.vnni_available()
    assert not gemm_int8.amx_available()
    assert [record.getMessage() for record in caplog.records
            if record.name == gemm_int8.__name__] == [
        "int8 products run on the AVX2 kernel (vpmaddwd)"]


@needs_kernel
@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 3, 5), (49, 300, 520), (200, 65, 31),
                                           (33, 576, 130), (7, 13, 17)])
@pytest.mark.parametrize("signed", [False, True])
def test_the_product_as_a_pool_job_equals_numpys(amx: bool, m: int, k: int, n: int,
                                                 signed: bool) -> None:
    """`product_job` cuts the (panel, row block) tiles among its parts: on the pool's
    workers and on one thread, NumPy's sums."""
    from engine.cpu import spin_pool

    if amx and not gemm_int8.amx_available():
        pytest.skip("the host has no AMX-INT8")
    rng = np.random.default_rng(m * k + n)
    dtype = np.int8 if signed else np.uint8
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(dtype)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    packed = gemm_int8.PackedWeights(w, amx=amx)
    rows = gemm_int8.padded_rows(m, packed)
    rows[:m, :k] = a.view(np.uint8) ^ 0x80 if signed else a
    out = np.full((rows.shape[0], packed.panels * packed.vectors * gemm_int8.LANES), 7,
                  np.int32)
    job = gemm_int8.product_job(rows, m, packed, signed, out)
    want = a.astype(np.int64) @ w.astype(np.int64)
    job()
    np.testing.assert_array_equal(out[:m, :n], want)
    out[...] = 7
    with spin_pool.armed(2):
        job()
    np.testing.assert_array_equal(out[:m, :n], want)


@needs_kernel
@pytest.mark.parametrize("signed", [False, True])
def test_one_row_as_a_pool_job_runs_its_one_row_tile_over_the_panels(signed: bool) -> None:
    """A classifier at batch 1 (512 × 1000): the one-row tile, writing no padding rows, its
    panels cut into parts by the weights' bytes (each core streams its own), the caller's
    offsets (a bias) added; NumPy's sums on one thread and on two."""
    from engine.cpu import spin_pool

    rng = np.random.default_rng(512)
    dtype = np.int8 if signed else np.uint8
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, (1, 512)).astype(dtype)
    w = rng.integers(-128, 128, (512, 1000)).astype(np.int8)
    bias = rng.integers(-5000, 5000, 1000).astype(np.int64)
    packed = gemm_int8.PackedWeights(w)
    columns = packed.panels * packed.vectors * gemm_int8.LANES
    offsets = (packed.signed_offsets if signed else packed.no_offsets).astype(np.int64)
    offsets[:1000] += bias
    rows = gemm_int8.padded_rows(1, packed)
    rows[:1, :512] = a.view(np.uint8) ^ 0x80 if signed else a
    out = np.full((rows.shape[0], columns), 7, np.int32)
    job = gemm_int8.product_job(rows, 1, packed, signed, out, offsets.astype(np.int32))
    assert job.args[-1] > 1  # parts
    want = a.astype(np.int64) @ w.astype(np.int64) + bias
    for threads in (1, 2):
        out[...] = 7
        with spin_pool.armed(threads):
            job()
        np.testing.assert_array_equal(out[:1, :1000], want)
        assert (out[1:] == 7).all()  # the padding rows untouched: one row computed


@needs_kernel
def test_a_pool_jobs_offsets_must_be_one_int32_a_column() -> None:
    packed = gemm_int8.PackedWeights(np.ones((8, 20), np.int8))
    rows = gemm_int8.padded_rows(1, packed)
    out = np.zeros((rows.shape[0], packed.panels * packed.vectors * gemm_int8.LANES), np.int32)
    with pytest.raises(ValueError, match="offsets int64"):
        gemm_int8.product_job(rows, 1, packed, False, out, np.zeros(out.shape[1], np.int64))


def test_narrow_weights_pay_exactly_where_the_avx2_kernel_runs() -> None:
    assert gemm_int8.narrow_weights_pay() == (host_features.has("avx2") and not _host_has_vnni())


@pytest.mark.skipif(not host_features.has("avx2"), reason="the host has no AVX2")
def test_narrow_weights_run_on_the_vpmaddubsw_kernels_exactly_without_vnni(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without VNNI (on a VNNI host too, its flag hidden), weights within ±63 take the
    ``vpmaddubsw`` kernels (compiled when the first such weights are packed, not before), in
    tiles of `NARROW_ROWS` rows, the whole tile and the one-row tile, directly and as pool
    jobs (a short last block's rows on the one-row tile, the padding rows left as they
    were), row counts on either side of a tile's: NumPy's sums where every pair of
    products reaches 2 · 255 · 63 (each activation 255, its int8 form 127 plus 128), the
    bound its int16 sums must not pass. A weight of -64 keeps the exact ``vpmaddwd``
    kernel."""
    from engine.cpu import spin_pool

    has = host_features.has
    monkeypatch.setattr(gemm_int8, "_state", {})
    monkeypatch.setattr(host_features, "has", lambda flag: flag != "avx512_vnni" and has(flag))
    assert gemm_int8.narrow_weights_pay()
    full = np.random.default_rng(1).integers(-128, 128, (40, 20)).astype(np.int8)
    full[0, 0] = -128
    gemm_int8.multiply(np.ones((3, 40), np.uint8), gemm_int8.PackedWeights(full))
    assert "narrow kernels" not in gemm_int8._state  # full-range weights compile none
    assert gemm_int8.PackedWeights(full).rows == gemm_int8.AVX2_ROWS
    quarter = gemm_int8.PackedWeights(full // 4)
    assert "narrow kernels" in gemm_int8._state and quarter.rows == gemm_int8.NARROW_ROWS
    gemm_int8.multiply(np.ones((3, 40), np.uint8), quarter)
    kernels = gemm_int8._state["narrow kernels"]
    for vectors, _ in gemm_int8.TILES:  # every width's tiles compiled (each on its first ask)
        kernels[vectors]
    taken: list[object] = []
    for key in [key for key in kernels
                if not (isinstance(key, tuple) and ("task" in key or "edge" in key))]:
        kernel = kernels[key]
        monkeypatch.setitem(kernels, key, lambda *args, kernel=kernel, key=key: (
            taken.append(key), kernel(*args))[1])
    rng = np.random.default_rng(63)
    k = 1031
    for n in (9, 33, 130, 1000):
        w = rng.integers(-63, 64, (k, n)).astype(np.int8)
        w[:, 0], w[:, -1] = 63, -63
        weights = gemm_int8.PackedWeights(w)
        assert weights.narrow and weights.rows == gemm_int8.NARROW_ROWS
        for dtype, m in ((np.uint8, 1), (np.uint8, 5), (np.int8, 1), (np.int8, 8),
                         (np.uint8, 3), (np.int8, 13)):
            a = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, (m, k)).astype(dtype)
            a[:, :k // 2] = np.iinfo(dtype).max
            want = a.astype(np.int64) @ w.astype(np.int64)
            taken.clear()
            np.testing.assert_array_equal(gemm_int8.multiply(a, weights), want)
            assert taken == [("row", weights.vectors) if m == 1 else weights.vectors]
            signed = dtype == np.int8
            rows = gemm_int8.padded_rows(m, weights)
            rows[:m, :k] = a.view(np.uint8) ^ 0x80 if signed else a
            out = np.full((rows.shape[0], weights.panels * weights.vectors * gemm_int8.LANES),
                          7, np.int32)
            job = gemm_int8.product_job(rows, m, weights, signed, out)
            assert job.args[-3] == kernels["task", *(("row",) if m == 1 else ()),
                                          weights.vectors]
            with spin_pool.armed(2):
                job()
            np.testing.assert_array_equal(out[:m, :n], want)
            # a short last block's rows on the one-row tile: the padding rows not computed
            assert (out[m:] == 7).all()
    w[0, 0] = -64
    assert not gemm_int8.PackedWeights(w).narrow
    assert not gemm_int8.PackedWeights(w, amx=True).narrow


needs_narrow = pytest.mark.skipif(not gemm_int8.narrow_weights_pay(),
                                  reason="the host runs the VNNI kernels or no AVX2")


needs_table = pytest.mark.skipif(
    not (gemm_int8.narrow_weights_pay() or gemm_int8.vnni_available()),
    reason="the host runs no table product (neither VNNI nor AVX2)")


@needs_table
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 8, 5), (13, 576, 64), (49, 256, 130),
                                           (6, 1028, 33)])
def test_the_table_product_reads_each_row_where_its_address_points(m: int, k: int, n: int,
                                                                   signed: bool) -> None:
    """`table_job` reads row r's group g of four K values at ``addresses[r] +
    group_offsets[g]``: rows out of order in a larger array, groups out of order within a
    row (each read as the weights' K values 4g to 4g + 3), rows past ``m`` pointing
    anywhere (and, on the ``vpmaddubsw`` kernels, whose short last block runs on the
    one-row tile, no sums written for them); NumPy's sums of the bytes so read, on one
    thread and on two."""
    from engine.cpu import spin_pool

    rng = np.random.default_rng(m + k + n)
    w = rng.integers(-63, 64, (k, n)).astype(np.int8)
    w[0, :] = 63
    weights = gemm_int8.PackedWeights(w)
    assert gemm_int8.table_runs(weights)
    edge = gemm_int8.taps_run(weights)  # the narrow kernels' one-row tile ends a short block
    source = rng.integers(0, 256, (m + 5, k + 12)).astype(np.uint8)
    order = rng.permutation(m + 5)[:m]
    group_offsets = 4 * rng.permutation((k + 12) // 4)[:k // 4].astype(np.int64)
    blocks = -(-m // weights.rows)
    addresses = np.full(blocks * weights.rows, source.ctypes.data, np.int64)
    addresses[:m] = source.ctypes.data + order * source.shape[1]
    read = source[order][:, (group_offsets[:, None] + np.arange(4)).reshape(-1)]
    # signed: the bytes hold int8 values plus 128, and the sums are the int8 values'
    want = (read.astype(np.int64) - (128 if signed else 0)) @ w.astype(np.int64)
    out = np.full((blocks * weights.rows, weights.panels * weights.vectors * gemm_int8.LANES),
                  7, np.int32)
    job = gemm_int8.table_job(addresses, group_offsets, m, weights, signed, out, source)
    job()
    np.testing.assert_array_equal(out[:m, :n], want)
    # a short last block's rows only, on the one-row tile
    assert (out[m:] == 7).all() or not edge
    out[...] = 7
    with spin_pool.armed(2):
        job()
    np.testing.assert_array_equal(out[:m, :n], want)
    assert (out[m:] == 7).all() or not edge


@needs_table
def test_the_table_product_refuses_what_it_cannot_run() -> None:
    """Tables or a result that do not fit the product are refused; so, on the AVX2 host,
    weights past ±63, which its table kernels cannot multiply exactly."""
    narrow = gemm_int8.PackedWeights(np.ones((8, 4), np.int8))
    out = np.zeros((narrow.rows, 16), np.int32)
    addresses = np.zeros(narrow.rows, np.int64)
    with pytest.raises(ValueError, match="group offsets"):
        gemm_int8.table_job(addresses, np.zeros(3, np.int64), 1, narrow, False, out)
    with pytest.raises(ValueError, match="result"):
        gemm_int8.table_job(addresses, np.zeros(2, np.int64), 1, narrow, False, out[:1])
    full = gemm_int8.PackedWeights(np.full((8, 4), -128, np.int8))
    assert gemm_int8.table_runs(full) == gemm_int8.vnni_available()
    if not gemm_int8.vnni_available():
        with pytest.raises(RuntimeError, match="narrow weights"):
            gemm_int8.table_job(addresses, np.zeros(2, np.int64), 1, full, False, out)


def writes_on_one_thread_and_two(job: Any, out: np.ndarray, n: int, want: np.ndarray) -> None:
    """``job`` writes ``want`` into ``out``'s first ``n`` columns (its rows as ``want``'s,
    7 where it writes nothing), run on one thread and again on two."""
    from engine.cpu import spin_pool

    for threads in (1, 2):
        out[...] = 7
        with spin_pool.armed(threads):
            job()
        np.testing.assert_array_equal(out[:len(want), :n], want)


@needs_narrow
@pytest.mark.parametrize(("m", "k", "n"), [(1, 8, 5), (13, 576, 64), (49, 256, 130),
                                           (6, 1028, 33)])
def test_the_taps_product_walks_each_blocks_own_steps(m: int, k: int, n: int) -> None:
    """`taps_job` reads each row's window where its entry points, walks the K steps its
    block's first row lists (any subset of K's groups, in any order, none at all) and
    writes its sums to the row of ``out`` its entry names; a short last block runs a row at
    a time, each on its own steps. NumPy's sums of the bytes so read, on one thread and on
    two; the rows of ``out`` no entry names stay as they were."""

    rng = np.random.default_rng(m + k + n)
    w = rng.integers(-63, 64, (k, n)).astype(np.int8)
    weights = gemm_int8.PackedWeights(w)
    rows, groups = weights.rows, k // 4
    source = rng.integers(0, 256, (m + 5, k + 12)).astype(np.uint8)
    windows = rng.permutation(m + 5)[:m]
    group_offsets = 4 * rng.permutation((k + 12) // 4)[:groups].astype(np.int64)
    sums_rows = rng.permutation(m + 3)[:m]  # where each row's sums go, some rows left out
    blocks = -(-m // rows)
    short = m % rows
    lists, entries = [], np.zeros((blocks * rows, 4), np.int64)
    want = np.full((m + 3, n), 7, np.int64)
    for row in range(m):
        if row % rows == 0 or (short and row >= m - short):
            taken = rng.permutation(groups)[:rng.integers(0, groups + 1)]
            steps = np.zeros((max(len(taken), 1), 2), np.int64)
            steps[:len(taken), 0] = group_offsets[taken]
            steps[:len(taken), 1] = gemm_int8.weight_offset(weights, taken)
            lists.append(steps)
        entries[row] = (source.ctypes.data + windows[row] * source.shape[1], sums_rows[row],
                        steps.ctypes.data, len(taken))
        k_values = (4 * taken[:, None] + np.arange(4)).reshape(-1)
        read = source[windows[row], (group_offsets[taken, None] + np.arange(4)).reshape(-1)]
        want[sums_rows[row]] = read.astype(np.int64) @ w[k_values].astype(np.int64)
    out = np.empty((m + 3, weights.panels * weights.vectors * gemm_int8.LANES), np.int32)
    job = gemm_int8.taps_job(entries, m, weights, out, (source, *lists))
    writes_on_one_thread_and_two(job, out, n, want)


@needs_narrow
def test_narrow_kernels_compile_a_width_and_kind_at_its_first_ask() -> None:
    """The narrow kernels start as the widest panels' tiles alone; a key of another width or
    kind compiles that group only (ResNets run one width in most layers: the rest is load
    time spent for nothing)."""
    kernels = gemm_int8._compile_narrow()
    widest = gemm_int8.NARROW_FIRST
    assert set(kernels) == {widest, ("task", widest), ("row", widest),
                            ("task", "row", widest), ("edge", widest)}
    task = kernels["task", "taps", 1]
    assert task and set(kernels) - {widest, ("task", widest), ("row", widest),
                                    ("task", "row", widest), ("edge", widest)} == {
        ("task", "taps", 1), ("edge", "taps", 1)}
    assert kernels["task", "taps", 1] == task  # compiled once


@needs_narrow
def test_the_taps_product_refuses_what_it_cannot_run() -> None:
    narrow = gemm_int8.PackedWeights(np.ones((8, 4), np.int8))
    out = np.zeros((gemm_int8.NARROW_ROWS, 16), np.int32)
    entries = np.zeros((gemm_int8.NARROW_ROWS, 4), np.int64)
    with pytest.raises(ValueError, match="entries"):
        gemm_int8.taps_job(entries[:, :3].copy(), 1, narrow, out, ())
    entries[0, 1] = gemm_int8.NARROW_ROWS  # a sums row past the result's
    with pytest.raises(ValueError, match="result"):
        gemm_int8.taps_job(entries, 1, narrow, out, ())
    full = gemm_int8.PackedWeights(np.full((8, 4), -128, np.int8))
    with pytest.raises(RuntimeError, match="narrow weights"):
        gemm_int8.taps_job(entries, 1, full, out, ())


# sha-256 of the VNNI kernels' modules (each tile and its one-row tile, with their tasks) and
# the AMX kernel's, as `_compile` builds them: `define_task` serves the AVX2 table kernels too,
# and its default leaves those builds unchanged
VNNI_AND_AMX_IR = "c0d645ae1516e9a6872486735a888f290a62c4d2ec5e4796343a70d5dfafda91"


def test_the_vnni_and_amx_kernels_ir_is_unchanged() -> None:
    import hashlib

    from engine.kernels.gemm_int8_amx_ir import AmxInt8Kernel
    from engine.kernels.gemm_int8_ir import Int8Kernel, define_task

    texts = []
    for vectors, rows in gemm_int8.TILES:
        for tile_rows in (rows, 1):
            kernel = Int8Kernel(tile_rows, vectors)
            define_task(kernel.module, kernel.define("panels"), tile_rows)
            texts.append(str(kernel.module))
    amx = AmxInt8Kernel()
    define_task(amx.module, amx.define("panels"), amx.rows)
    texts.append(str(amx.module))
    assert hashlib.sha256("\n".join(texts).encode()).hexdigest() == VNNI_AND_AMX_IR


@needs_narrow
@pytest.mark.parametrize(("m", "k", "n"), [(49, 256, 130), (6, 64, 33), (8, 64, 16)])
def test_a_product_job_of_narrow_weights_takes_just_its_rows(m: int, k: int, n: int) -> None:
    """Narrow weights' `product_job` computes a short last row block a row at a time
    (`reads_rows_only`), so its rows and result may hold just the ``m`` rows: NumPy's
    sums on one thread and on two. Full-range weights' jobs, whose tiles read and write the
    whole last block, still refuse such rows."""

    rng = np.random.default_rng(m + k + n)
    w = rng.integers(-63, 64, (k, n)).astype(np.int8)
    weights = gemm_int8.PackedWeights(w)
    assert gemm_int8.reads_rows_only(weights, m)
    rows = rng.integers(0, 256, (m, k)).astype(np.uint8)
    columns = weights.panels * weights.vectors * gemm_int8.LANES
    out = np.empty((m, columns), np.int32)
    job = gemm_int8.product_job(rows, m, weights, False, out)
    writes_on_one_thread_and_two(job, out, n, rows.astype(np.int64) @ w.astype(np.int64))
    wide = gemm_int8.PackedWeights(np.full((k, n), 100, np.int8))
    assert gemm_int8.reads_rows_only(wide, m) == (m % wide.rows == 0)
    if m % wide.rows:
        with pytest.raises(ValueError, match="padded_rows"):
            gemm_int8.product_job(rows, m, wide, False, out)
