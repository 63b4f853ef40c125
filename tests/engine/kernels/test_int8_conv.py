"""The fused int8 convolution (`int8_conv.FusedConv`) against the NumPy path it replaces
(`integer.conv`, the bias, `requantize.finish`): equal bit for bit, on VNNI and on AMX."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from engine.cpu import cache_sizes, host_features, spin_pool
from engine.kernels import border_taps, gemm_int8, int8_affine, int8_conv, part_chain
from engine.ops.quantized import integer
from engine.ops.quantized.requantize import finish
from engine.ops.quantized.subgraph_attrs import Activation

pytestmark = pytest.mark.skipif(
    not (gemm_int8.available() and spin_pool.available()),
    reason="needs AVX-512 VNNI and llvmlite's JIT")

ISAS = ["vnni", *(["amx"] if gemm_int8.amx_available() else [])]

# (batch, channels, size, filters, kernel, stride, pad, dilate): channels and filters off
# the 4/16/64 multiples the kernels step by, strides and padding as ResNets use them.
SHAPES = [
    (1, 5, (9, 11), 7, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 19, (10, 7), 33, (3, 3), (2, 2), (1, 1), (1, 1)),
    (1, 70, (8, 8), 80, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 67, (9, 9), 17, (1, 1), (2, 2), (0, 0), (1, 1)),
    (1, 3, (23, 21), 65, (7, 7), (2, 2), (3, 3), (1, 1)),
    (3, 33, (12, 13), 20, (3, 3), (1, 2), (2, 1), (2, 2)),
]


def _reference(data, weight, geometry, epilogue, residual, storage, dtype):
    sums = integer.conv(data, weight, geometry.kernel, geometry.stride, geometry.dilate,
                        geometry.pad, 1)
    sums += epilogue.bias.astype(np.float64).reshape(1, -1, 1, 1)
    act = None if epilogue.act is None else Activation(epilogue.act, epilogue.act_high)
    post = None if epilogue.postsum_act is None else Activation(epilogue.postsum_act,
                                                                epilogue.postsum_high)
    pair = None if residual is None else (residual, np.float32(epilogue.residual_scale))
    return finish(sums, epilogue.scales, 1, storage, act, pair, post).astype(dtype)


def _seed(*case) -> int:
    """A case's seed, the same in every process (``hash`` of a string is not)."""
    return zlib.crc32(repr(case).encode())


def _second_output(rng, want, filters):
    """A second output's per-channel (scale, shift) and its bytes: `int8_affine`'s pass over
    ``want``, as a reader's pre-activation asks the writer for them (`int8_conv.Rescaled`)."""
    scale = rng.uniform(-0.5, 4.0, filters).astype(np.float32)
    shift = rng.uniform(-200, 200, filters).astype(np.float32)
    second_want = np.zeros(want.shape, np.uint8)
    int8_affine.affine_job(want, scale, shift, second_want, False, False)()
    return scale, shift, second_want


def _case(rng, shape, data_dtype, out_dtype, act, with_residual):
    batch, channels, size, filters, kernel, stride, pad, dilate = shape
    geometry = int8_conv.Geometry(kernel, stride, dilate, pad)
    info = np.iinfo(data_dtype)
    data = rng.integers(info.min, info.max + 1, (batch, channels, *size)).astype(data_dtype)
    weight = rng.integers(-127, 128, (filters, channels, *kernel)).astype(np.int8)
    out_h, out_w = geometry.out_size(*size)
    # scales that spread the sums over the output's range and past it (saturation)
    reach = float(np.sqrt(weight[0].size)) * 127 * 40
    epilogue = int8_conv.Epilogue(
        bias=rng.integers(-20000, 20000, filters).astype(np.int32),
        scales=(rng.uniform(0.5, 2.0, filters) * 128 / reach).astype(np.float32),
        act=act, act_high=90.5 if act == "bounded_relu" else 0.0,
        residual_scale=0.73 if with_residual else 0.0,
        postsum_act="relu" if with_residual and out_dtype == np.uint8 else None)
    residual = None
    if with_residual:
        residual = rng.integers(-128, 128, (batch, filters, out_h, out_w)).astype(np.int8)
    storage = np.dtype(np.int8) if residual is not None else np.dtype(out_dtype)
    limits = np.iinfo(storage)
    epilogue.low, epilogue.high = int(limits.min), int(limits.max)
    return data, weight, geometry, epilogue, residual, storage


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("data_dtype,out_dtype,act,with_residual", [
    (np.uint8, np.uint8, "relu", False),
    (np.int8, np.int8, None, False),
    (np.uint8, np.uint8, "bounded_relu", True),
    (np.int8, np.int8, None, True),
])
def test_equals_the_numpy_path_bit_for_bit(isa, shape, data_dtype, out_dtype, act,
                                           with_residual):
    rng = np.random.default_rng(_seed(shape, np.dtype(data_dtype).str, act))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, out_dtype, act, with_residual)
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    out = np.full(want.shape, 77, out_dtype)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=isa == "amx")
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    conv(epilogue)
    np.testing.assert_array_equal(out, want)
    # a second run reads the data again (the jobs are bound to the buffers, not the values)
    data[...] = data[::-1].copy() if data.shape[0] > 1 else np.flip(data, axis=2).copy()
    conv(epilogue)
    np.testing.assert_array_equal(
        out, _reference(data, weight, geometry, epilogue, residual, storage, out_dtype))


def test_runs_split_over_the_pool_equal_to_one_part():
    """Armed, the jobs run in parts on the pool's workers: the same bytes."""
    rng = np.random.default_rng(7)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, (3, 70, (16, 16), 80, (3, 3), (1, 1), (1, 1), (1, 1)), np.uint8, np.uint8,
        "relu", True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight),
                                     amx=gemm_int8.amx_available())
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    with spin_pool.armed(2):
        for _ in range(3):
            out[...] = 0
            conv(epilogue)
            np.testing.assert_array_equal(out, want)


def test_refuses_an_output_of_the_wrong_shape():
    weight = np.ones((8, 4, 3, 3), np.int8)
    data = np.zeros((1, 4, 6, 6), np.uint8)
    geometry = int8_conv.Geometry((3, 3), (1, 1), (1, 1), (1, 1))
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    with pytest.raises(ValueError, match="output"):
        int8_conv.FusedConv(data, weight, packed, geometry, np.zeros((1, 8, 4, 4), np.uint8))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("chunk_bytes", [1, 40_000])
def test_layers_cut_into_chunks_equal_the_numpy_path(monkeypatch, isa, chunk_bytes):
    """A layer runs chunk by chunk (rows and sums kept in cache); chunks of one row block,
    or of some that end inside an image, change no byte."""
    monkeypatch.setattr(int8_conv, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(11)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, (3, 21, (13, 11), 40, (3, 3), (1, 1), (1, 1), (1, 1)), np.int8, np.uint8,
        "bounded_relu", True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=isa == "amx")
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    assert 1 < -(-conv.rows // int8_conv.chunk_rows(conv.rows, packed))
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("batch,channels,size,filters", [
    (1, 64, (7, 11), 40),  # K of 64: rows read as laid on VNNI, by the direct product on AMX
    (3, 20, (5, 5), 33),  # K of 20: as laid on VNNI, gathered on AMX (K padded to 64)
    (1, 18, (5, 7), 16),  # K of 18: gathered on VNNI (padded to 20), direct on AMX
])
def test_one_by_one_layers_read_the_channels_last_rows(isa, batch, channels, size, filters):
    """A 1×1 convolution of stride 1 whose channels fill the packed K exactly runs its GEMM
    on the channels-last copy's rows without a gather (its last row block reaching past
    the copy), on AMX the direct product where its rows take tiles, with the same bytes as
    the NumPy path; other depths still gather."""
    rng = np.random.default_rng(channels)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, (batch, channels, size, filters, (1, 1), (1, 1), (0, 0), (1, 1)), np.int8,
        np.uint8, "relu", True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=isa == "amx")
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    direct = isa == "amx" and gemm_int8.direct_tile_rows(size[1]) > 0
    assert bool(conv.tile_rows) == direct
    assert conv.gathers == (channels != packed.groups * 4 and not direct)
    assert conv.rows % packed.rows  # the last row block runs past the rows laid
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("batch,size,in_place", [
    (1, (8, 12), True),  # 96 rows: whole row blocks of any packing (2 to 32 rows)
    (1, (5, 7), False),  # 35 rows: the last block would read past the data's end
])
def test_one_by_one_layers_read_uint8_rows_handed_over_where_they_lie(batch, size, in_place):
    """Unpadded uint8 data handed over channels-last is the copy's bytes already: a 1×1
    product of stride 1 in whole row blocks reads its rows there (no copy job), one whose
    last row block would pass the data's end copies them; both write the NumPy path's
    bytes."""
    rng = np.random.default_rng(size[0])
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, (batch, 64, size, 40, (1, 1), (1, 1), (0, 0), (1, 1)), np.uint8, np.int8, None,
        True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.int8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(_channels_last(data), weight, packed, geometry, out,
                               _channels_last(residual), int8_conv.Layouts(True, True, True))
    assert conv.reads_rows_in_place == conv.reads_data_in_place == in_place
    assert (conv.rows % packed.rows == 0) == in_place
    chunks = -(-conv.rows // int8_conv.chunk_rows(conv.rows, packed, gathers=False))
    jobs = conv.jobs_for(epilogue)
    # the copy where one is made and the products and requantize passes: a job each a
    # chunk, on several cores one chain whose shares copy their own rows, or on VNNI's
    # tiles one job requantizing in their epilogue
    chained = isinstance(jobs[-1], part_chain.Chain)
    copy = 0 if in_place else 1
    assert len(jobs) == (1 + copy if conv.vnni_epilogue else 1 if chained
                         else 2 * chunks + copy)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)


@pytest.mark.skipif(host_features.has("avx512f"),
                    reason="an AVX-512 host keeps a 1×1 layer's chunks' jobs")
@pytest.mark.parametrize("laid,channels,size,data_dtype", [
    # NCHW: copied channels-last, the last block read in its tail
    (False, 16, (15, 16), np.uint8),
    # handed over channels-last: the rows read where they lie
    (True, 64, (16, 16), np.uint8),
    # int8 handed over channels-last: each share shifts its own rows onto uint8 first, the
    # last block read in the copy's tail
    (True, 32, (15, 15), np.int8),
])
@pytest.mark.parametrize("share_blocks", [1, 3])
def test_a_one_by_one_layer_reading_its_rows_is_one_chain_of_shares(monkeypatch, laid,
                                                                    channels, size,
                                                                    data_dtype, share_blocks):
    """A 1×1 layer of stride 1 that reads its patch rows in the copy (or in the data handed
    over) runs its products and requantize passes as one chained job, in shares of
    `chunk_bytes` of sums at most, one part a core (data handed over channels-last but
    copied, each share's copy first in its steps): the NumPy path's bytes on one thread,
    armed on two (twice: the claim word starts again at 0), and again after the data
    change."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    rng = np.random.default_rng(_seed("one by one", channels, share_blocks))
    shape = (1, channels, size, 24, (1, 1), (1, 1), (0, 0), (1, 1))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, np.uint8, "bounded_relu", True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    block_bytes = packed.rows * packed.panels * packed.vectors * gemm_int8.LANES * 4
    monkeypatch.setattr(int8_conv, "chunk_bytes", lambda: share_blocks * block_bytes)
    layouts = int8_conv.Layouts(laid, laid, laid)
    arrange = _channels_last if laid else np.ascontiguousarray
    out = np.full(arrange(want).shape, 77, np.uint8)
    conv = int8_conv.FusedConv(arrange(data), weight, packed, geometry, out, arrange(residual),
                               layouts)
    assert not (conv.gathers or conv.reads_windows or conv.tile_rows)
    copies_in_shares = laid and data_dtype == np.int8
    assert conv.reads_data_in_place == (laid and not copies_in_shares)
    jobs = conv.jobs_for(epilogue)
    assert len(jobs) == (1 if laid else 2)  # the copy, then the chain
    chain = jobs[-1]
    assert isinstance(chain, part_chain.Chain) and chain.parts == len(chain.by_part) == 2
    row_blocks = -(-conv.rows // packed.rows)
    assert row_blocks > 2 * share_blocks
    assert len(chain.alone) == -(-row_blocks // share_blocks)
    assert {len(steps) for steps in chain.alone} == {3 if copies_in_shares else 2}
    restore = _from_channels_last if laid else np.asarray
    _alone_then_armed(conv, epilogue, out, want, restore)
    data = np.flip(data, axis=3).copy()
    conv.data[...] = arrange(data)
    conv(epilogue)
    np.testing.assert_array_equal(
        restore(out), _reference(data, weight, geometry, epilogue, residual, storage, np.uint8))


@pytest.mark.skipif(not gemm_int8.narrow_weights_pay(),
                    reason="the host runs the VNNI kernels: no one-row tile for a short block")
@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("batch,size,filters", [
    (1, (7, 7), 48),  # 49 rows: the last block's one row on the one-row tile
    (2, (3, 5), 40),  # 30 rows: two
])
def test_one_by_one_rows_of_a_short_last_block_are_read_where_they_lie(monkeypatch, batch, size,
                                                                      filters, cores):
    """A 1×1 layer of stride 1 handed unpadded uint8 rows channels-last, whose last row block
    is short, reads them where they lie (no copy job), the short block a row at a time on
    the one-row tile, so no row past the data's end is read: the NumPy path's
    bytes, with the second output `int8_requantize_ir`'s pass writes, in chunks' jobs (one
    core) or chained (two), on one thread and armed on two, and again after the data
    change. The data ends where a page that may not be read begins."""
    monkeypatch.setattr(spin_pool, "cores", lambda: cores)
    has = host_features.has
    monkeypatch.setattr(host_features, "has",
                        lambda flag: False if flag == "avx512dq" else has(flag))
    # the vector pass's case: VNNI's tiles would requantize in their epilogue instead
    monkeypatch.setattr(gemm_int8, "fused_runs", lambda weights: False)
    rng = np.random.default_rng(_seed("short block in place", batch, size))
    shape = (batch, 64, size, filters, (1, 1), (1, 1), (0, 0), (1, 1))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.int8, None, True)
    weight = np.clip(weight, -63, 63)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.int8)
    scale, shift, second_want = _second_output(rng, want, filters)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    laid = _at_a_page_end(_channels_last(data))
    out = np.zeros_like(want)
    conv = int8_conv.FusedConv(laid, weight, packed, geometry, out, _channels_last(residual),
                               int8_conv.Layouts(True, True, True))
    assert conv.rows % packed.rows and not (conv.reads_windows or conv.gathers)
    assert gemm_int8.reads_rows_only(packed, conv.rows)
    assert conv.reads_data_in_place and conv.writes_rescaled
    epilogue.rescaled = int8_conv.Rescaled(np.zeros(want.shape, np.uint8), scale, shift)
    jobs = conv.jobs_for(epilogue)
    # the chain, or the one chunk's product and pass: no copy
    assert len(jobs) == (1 if cores > 1 else 2)
    assert isinstance(jobs[-1], part_chain.Chain) == (cores > 1)
    _alone_then_armed(conv, epilogue, out, want, _from_channels_last, second_want)
    flipped = np.flip(data, axis=3).copy()
    laid[...] = _channels_last(flipped)
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), _reference(
        flipped, weight, geometry, epilogue, residual, storage, np.int8))


def _at_a_page_end(array):
    """A copy of ``array`` whose last byte is the last of a page followed by one that may not
    be read (`mmap` with no access), so that a read past the end faults."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    pages = -(-array.nbytes // page) + 1
    mapped = mmap.mmap(-1, pages * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    buffer = np.frombuffer(mapped, np.uint8)
    guard = buffer[(pages - 1) * page:]
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(guard.ctypes.data, page, 0) == 0
    start = (pages - 1) * page - array.nbytes
    copy = buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    _guarded.append(mapped)  # the mapping outlives the test's arrays
    return copy


_guarded = []


def _channels_last(array):
    """``array``'s values laid N, H, W, C in an array of its own (N, C, H, W) shape."""
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1)).reshape(array.shape)


def _alone_then_armed(conv, epilogue, out: np.ndarray, want: np.ndarray,
                      restore=np.asarray, second_want: np.ndarray | None = None) -> None:
    """``conv`` writes ``want`` (read back through ``restore``) on the caller alone, then twice
    armed over two threads, its output spoiled before each; and ``second_want`` into the
    epilogue's second output (`int8_conv.Rescaled`) where given."""
    second = None if second_want is None else epilogue.rescaled.out
    for armed in (False, True, True):
        if armed:
            out[...] = 77
            if second is not None:
                second[...] = 7
            with spin_pool.armed(2):
                conv(epilogue)
        else:
            conv(epilogue)
        np.testing.assert_array_equal(restore(out), want)
        if second is not None:
            np.testing.assert_array_equal(restore(second), second_want)


def _from_channels_last(array):
    batch, channels, height, width = array.shape
    return array.reshape(batch, height, width, channels).transpose(0, 3, 1, 2)


def _direct_to_channels_last(data, weight, geometry, out, residual=None, residual_laid=False):
    """The fused layer on the direct AMX product of ``weight``'s packed matrix, writing ``out``
    channels-last; ``residual`` (NCHW) handed to it channels-last where ``residual_laid``."""
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=True)
    if residual is not None and residual_laid:
        residual = _channels_last(residual)
    return int8_conv.FusedConv(data, weight, packed, geometry, out, residual,
                               int8_conv.Layouts(out=True, residual=residual_laid))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("laid", [
    int8_conv.Layouts(data=True), int8_conv.Layouts(out=True),
    int8_conv.Layouts(residual=True), int8_conv.Layouts(True, True, True)])
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2],
                                   (2, 64, (5, 7), 24, (1, 1), (1, 1), (0, 0), (1, 1))])
def test_channels_last_arrays_give_the_same_values(isa, laid, shape):
    """Data, output and residual laid channels-last (a fused layer's hand-off to the next)
    hold the NumPy path's values, in that order."""
    rng = np.random.default_rng(len(shape[2]) + shape[1])
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.int8, np.uint8, "bounded_relu", True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=isa == "amx")
    conv = int8_conv.FusedConv(_channels_last(data) if laid.data else data, weight, packed,
                               geometry, out,
                               _channels_last(residual) if laid.residual else residual, laid)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out) if laid.out else out, want)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape,tile_rows", [
    ((1, 64, (14, 14), 40, (3, 3), (1, 1), (1, 1), (1, 1)), 14),
    ((3, 128, (17, 17), 33, (3, 3), (2, 2), (1, 1), (1, 1)), 9),  # 243 rows: a block cut
    ((2, 64, (16, 12), 70, (3, 3), (1, 1), (2, 2), (2, 2)), 12),
    ((3, 64, (14, 14), 32, (1, 1), (2, 2), (0, 0), (1, 1)), 7),
])
@pytest.mark.parametrize("data_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("chunk_bytes", [int8_conv.CHUNK_BYTES, 1])
def test_direct_products_read_the_windows_where_they_lie(monkeypatch, shape, tile_rows,
                                                         data_dtype, chunk_bytes):
    """On AMX, a layer of whole 64-channel blocks runs without a gather, its tiles read
    from the channels-last copy (`gemm_int8.direct_job`), whole chunks or one block at a
    time: the NumPy path's bytes."""
    monkeypatch.setattr(int8_conv, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(shape[1] + tile_rows)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, np.uint8, "relu", True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=True)
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    assert (conv.tile_rows, conv.gathers) == (tile_rows, False)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", [
    (3, 128, (17, 17), 33, (3, 3), (2, 2), (1, 1), (1, 1)),  # 33 filters: a masked half
    (2, 64, (16, 12), 64, (3, 3), (1, 1), (2, 2), (2, 2)),
])
@pytest.mark.parametrize("data_dtype,act,with_residual,residual_laid", [
    (np.uint8, "relu", False, False),
    (np.int8, "bounded_relu", True, True),
    (np.uint8, None, True, False),
])
@pytest.mark.parametrize("chunk_bytes", [int8_conv.CHUNK_BYTES, 1])
def test_direct_products_requantize_channels_last_in_their_epilogue(
        monkeypatch, shape, data_dtype, act, with_residual, residual_laid, chunk_bytes):
    """A direct product writing channels-last requantizes each block's sums as it makes
    them (no separate pass): the NumPy path's bytes, with or without a residual."""
    monkeypatch.setattr(int8_conv, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(shape[3])
    out_dtype = np.uint8 if act else np.int8
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, out_dtype, act, with_residual)
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    out = np.zeros_like(want)
    conv = _direct_to_channels_last(data, weight, geometry, out, residual, residual_laid)
    assert conv.tile_rows
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("threads", [1, 2])
def test_a_product_requantized_in_its_epilogue_is_one_job_however_many_rows(monkeypatch,
                                                                            threads):
    """Chunks bound the scratch of a product whose sums a pass requantizes after it; one
    requantized in its own epilogue has none, and runs as one job over every row (after its
    padded copy) even where a chunk would hold a single row block: the NumPy path's bytes."""
    monkeypatch.setattr(int8_conv, "CHUNK_BYTES", 1)
    shape = (2, 64, (14, 14), 40, (3, 3), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(41)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.uint8, "relu", False)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    conv = _direct_to_channels_last(data, weight, geometry, out)
    assert conv.requantizes_in_product
    with spin_pool.armed(threads):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    (jobs,) = conv._jobs.values()
    assert len(jobs) == 2  # the padded copy, then the product


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", [
    (2, 3, (23, 21), 64, (7, 7), (2, 2), (3, 3), (1, 1)),  # a stem: rows of 21 bytes
    (1, 5, (16, 16), 40, (3, 3), (1, 1), (1, 1), (2, 1)),  # dilated rows, 15 bytes
])
@pytest.mark.parametrize("data_dtype", [np.uint8, np.int8])
def test_kernel_rows_of_few_channels_are_steps_of_the_direct_product(shape, data_dtype):
    """A layer whose kernel rows are under 64 bytes channels-last (a stem) runs the direct
    product with one K step a kernel row (`tap_rows_matrix`): the NumPy path's bytes."""
    rng = np.random.default_rng(shape[1])
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, np.uint8, "relu", False)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    assert int8_conv.has_tap_rows(shape[1], geometry, want.shape[3])
    packed = gemm_int8.PackedWeights(int8_conv.tap_rows_matrix(weight), amx=True)
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out)
    assert conv.tap_rows and conv.tile_rows and not conv.gathers
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape,stack", [
    ((2, 3, (23, 21), 64, (7, 7), (2, 2), (3, 3), (1, 1)), 3),  # a stem: 3 rows of 21 bytes
    ((1, 5, (16, 16), 40, (3, 3), (1, 1), (1, 1), (2, 1)), 3),  # dilated rows of 15 bytes
    ((3, 3, (11, 30), 20, (5, 5), (1, 2), (2, 0), (1, 1)), 4),  # 5 rows in 2 steps
])
@pytest.mark.parametrize("data_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("laid", [False, True])
def test_stacked_kernel_rows_share_a_step_of_the_direct_product(shape, stack, data_dtype,
                                                                laid):
    """A layer of rows of taps whose weights are packed `stack` kernel rows to a 64-byte
    step (`tap_rows_matrix(weight, stack)`) reads a copy holding that many padded rows a
    pixel (`int8_stack_ir`): fewer steps of K, the NumPy path's bytes, from NCHW data or
    data laid channels-last, on one thread and armed on two."""
    rng = np.random.default_rng(shape[1] * 10 + stack)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, np.uint8, "relu", False)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    assert int8_conv.stacked_rows(shape[1], geometry, want.shape[3]) == stack
    packed = gemm_int8.PackedWeights(int8_conv.tap_rows_matrix(weight, stack), amx=True)
    assert packed.k == -(-shape[4][0] // stack) * 64
    conv = int8_conv.FusedConv(_channels_last(data) if laid else data, weight, packed,
                               geometry, out, None, int8_conv.Layouts(data=laid))
    assert conv.tap_rows and conv.stack == stack and conv.tile_rows and not conv.gathers
    conv(epilogue)
    np.testing.assert_array_equal(out, want)
    out[...] = 0
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)


def test_tap_rows_matrix_puts_each_kernel_row_in_its_slot_of_a_stacked_pixel():
    """Kernel row g · stack + r's tap (kx, c) lies at K 64 · g + kx · stack · C + r · C + c;
    rows past the kernel's, and the rest of each 64, are zero."""
    weight = np.arange(2 * 3 * 5 * 4).reshape(2, 3, 5, 4).astype(np.int8)
    matrix = int8_conv.tap_rows_matrix(weight, 2)
    assert matrix.shape == (3 * 64, 2)
    for f in range(2):
        for c in range(3):
            for ky in range(5):
                for kx in range(4):
                    group, slot = divmod(ky, 2)
                    assert matrix[64 * group + kx * 6 + slot * 3 + c, f] == weight[f, c, ky, kx]
    expected_nonzero = np.zeros((3, 64), bool)
    expected_nonzero[:2, :24] = True
    expected_nonzero[2, :24] = (np.arange(24) // 3) % 2 == 0  # row 5 of 6 is past the kernel
    assert not matrix.reshape(3, 64, 2)[~expected_nonzero].any()
    np.testing.assert_array_equal(int8_conv.tap_rows_matrix(weight),
                                  int8_conv.tap_rows_matrix(weight, 1))


def test_sums_fit_int32_counts_the_largest_product_sum_and_bias():
    """Each of ``depth`` products reaches 255 · 128; the bias's magnitude adds to it."""
    depth = 64
    room = np.iinfo(np.int32).max - depth * 255 * 128
    assert int8_conv.sums_fit_int32(depth, np.array([room, -room], np.int32))
    assert not int8_conv.sums_fit_int32(depth, np.array([0, -room - 1], np.int32))
    assert not int8_conv.sums_fit_int32(gemm_int8.EXACT_DEPTH, np.array([255 * 128], np.int32))


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("with_residual", [False, True])
def test_direct_epilogue_widens_sums_whose_bias_reaches_past_int32(with_residual):
    """Biases near int32's ends (sums plus bias past it): the fused epilogue adds them in
    int64 (`sums_fit_int32` is False) and still gives the NumPy path's bytes."""
    shape = (1, 64, (14, 14), 40, (3, 3), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(11)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.int8, None, with_residual)
    # every other filter's bias at an end of int32, its sums crossing it; scales that
    # bring such sums back into the int8 range
    top = np.iinfo(np.int32).max
    epilogue.bias[::2] = np.where(rng.integers(0, 2, 20) == 1, top - 100, -top + 100)
    epilogue.scales[:] = np.float32(60.0 / top)
    assert not int8_conv.sums_fit_int32(weight[0].size, epilogue.bias)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.int8)
    out = np.zeros_like(want)
    conv = _direct_to_channels_last(data, weight, geometry, out, residual)
    assert conv.tile_rows
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    sums = integer.conv(data, weight, geometry.kernel, geometry.stride, geometry.dilate,
                        geometry.pad, 1) + epilogue.bias.astype(np.float64).reshape(1, -1, 1, 1)
    assert (np.abs(sums) > top).any()  # some do leave int32: a wrapped add would show


@pytest.mark.parametrize("low,top,kind", [
    (-128, 127, "signed"), (-128, 90, "signed"), (0, 255, "unsigned"), (37, 255, "unsigned"),
    (0, 127, "none"), (0, 90, "none"), (-127, 127, "none"), (-128, 255, "signed")])
def test_saturation_names_the_bound_a_conversion_to_bytes_meets(low, top, kind):
    """The direct epilogue's saturating conversions stand in for a clamp only at their own
    bound: -128 (signed) under a top of 127 at most, 255 (unsigned) over a bottom of 0."""
    from engine.kernels import int8_epilogue_ir as epilogue_ir

    names = {"signed": epilogue_ir.SATURATE_SIGNED, "unsigned": epilogue_ir.SATURATE_UNSIGNED,
             "none": epilogue_ir.SATURATE_NONE}
    # a top past 127 with -128 below is no uint8 or int8 range: no conversion fits it
    if (low, top) == (-128, 255):
        assert epilogue_ir.saturation(low, top) == epilogue_ir.SATURATE_NONE
        return
    assert epilogue_ir.saturation(low, top) == names[kind]


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("out_dtype,act,with_residual", [
    (np.int8, None, False),  # -128 by the signed conversion
    (np.int8, None, True),
    (np.uint8, "relu", False),  # 255 by the unsigned one
    (np.uint8, "relu", True),
    (np.uint8, "bounded_relu", False),  # both clamps
])
def test_direct_epilogue_saturates_values_past_int32_to_the_bounds(out_dtype, act,
                                                                   with_residual):
    """Scales that take some values past int32 both ways (where a conversion to int32
    gives 0x80000000), and others inside the range: the epilogue whose conversion to bytes
    saturates in place of a clamp stores the NumPy path's bytes, the ends included."""
    shape = (1, 64, (14, 14), 40, (1, 1), (1, 1), (0, 0), (1, 1))
    rng = np.random.default_rng(29)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.int8, out_dtype, act, with_residual)
    epilogue.scales[:4] = np.float32([3e9, -3e9, 1e6, -1e6])
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    # both ends reached by the filters scaled past int32
    limits = np.iinfo(storage)
    top = 90 if act == "bounded_relu" else limits.max  # `_case`'s clip at 90.5
    for end in (top, limits.min if act is None else 0):
        assert (want[:, :2] == np.array(end).astype(out_dtype)).any()
    out = np.zeros_like(want)
    conv = _direct_to_channels_last(data, weight, geometry, out, residual, residual_laid=True)
    assert conv.requantizes_in_product
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)


@pytest.mark.parametrize("act", [None, "relu", "bounded_relu"])
@pytest.mark.parametrize("postsum_act", [None, "relu", "bounded_relu"])
@pytest.mark.parametrize("limits", [(-128, 127), (0, 255)])
def test_folded_bounds_clamp_the_rounded_value_as_the_whole_chain_does(act, postsum_act,
                                                                      limits):
    """One clamp of the rounded value stands for the activations' clamps, rounding and
    saturation, at every value: halves, the bounds themselves, far past them."""
    act_bounds = int8_conv.activation_bounds(act, 90.5)
    post_bounds = int8_conv.activation_bounds(postsum_act, 6.5)
    limits = tuple(np.float32(limit) for limit in limits)
    values = np.concatenate([np.arange(-300, 300, 0.25), [-1e30, 1e30, -0.0, 90.49, 6.51]]
                            ).astype(np.float32)
    want = values
    for low, high in (act_bounds, post_bounds):
        want = np.minimum(np.maximum(want, low), high)
    want = np.minimum(np.maximum(np.rint(want), limits[0]), limits[1])
    low, high = int8_conv.folded_bounds((act_bounds, post_bounds), limits)
    got = np.minimum(np.maximum(np.rint(values), low), high)
    np.testing.assert_array_equal(got.astype(np.int32), want.astype(np.int32))


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", [
    (2, 128, (14, 14), 40, (1, 1), (1, 1), (0, 0), (1, 1)),
    (1, 64, (14, 14), 33, (1, 1), (2, 2), (0, 0), (1, 1)),
])
@pytest.mark.parametrize("out_laid", [False, True])
def test_unpadded_uint8_data_laid_channels_last_is_read_where_it_lies(shape, out_laid):
    """A direct product without padding over uint8 data handed over channels-last reads the
    data's own buffer (no copy): the NumPy path's bytes, run after run as the data change."""
    rng = np.random.default_rng(shape[3])
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.uint8, "relu", False)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=True)
    laid_data = _channels_last(data)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    conv = int8_conv.FusedConv(laid_data, weight, packed, geometry, out, None,
                               int8_conv.Layouts(data=True, out=out_laid))
    assert conv.tile_rows
    for _ in range(2):
        conv(epilogue)
        np.testing.assert_array_equal(_from_channels_last(out) if out_laid else out, want)
        data = rng.integers(0, 256, data.shape).astype(np.uint8)
        laid_data[...] = _channels_last(data)
        want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", [
    (1, 16, (16, 16), 96, (1, 1), (1, 1), (0, 0), (1, 1)),  # MobileNet v2's expansions
    (2, 24, (14, 14), 40, (1, 1), (1, 1), (0, 0), (1, 1)),
    (1, 144, (14, 14), 24, (1, 1), (1, 1), (0, 0), (1, 1)),  # and a projection's 144
    (1, 96, (14, 14), 33, (1, 1), (2, 2), (0, 0), (1, 1)),
])
@pytest.mark.parametrize("data_dtype,with_residual", [(np.uint8, False), (np.int8, True)])
@pytest.mark.parametrize("data_laid", [False, True])
def test_one_by_one_layers_off_whole_channel_blocks_run_the_direct_product(
        shape, data_dtype, with_residual, data_laid):
    """A 1×1 layer whose channels are not whole 64-byte blocks runs the direct product on
    AMX, its last step's bytes past a pixel's channels (the next pixel's, or the copy's
    tail) times zero weights: K of a few channels as one step of 64 (`tap_rows_matrix`),
    more as the plain matrix padded to 64s. The NumPy path's bytes, requantized in the
    epilogue into channels-last bytes."""
    rng = np.random.default_rng(shape[1] * 7 + shape[3])
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, np.uint8, "relu", with_residual)
    want = _reference(data, weight, geometry, epilogue, residual, storage,
                      np.int8 if with_residual else np.uint8)
    out = np.zeros_like(want)
    taps = int8_conv.has_tap_rows(shape[1], geometry, want.shape[3])
    assert taps == (shape[1] < 64)
    matrix = int8_conv.tap_rows_matrix(weight) if taps else int8_conv.weight_matrix(weight)
    packed = gemm_int8.PackedWeights(matrix, amx=True)
    conv = int8_conv.FusedConv(_channels_last(data) if data_laid else data, weight, packed,
                               geometry, out, None if residual is None else
                               _channels_last(residual),
                               int8_conv.Layouts(data=data_laid, out=True, residual=True))
    assert conv.tile_rows and not conv.gathers
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", [
    (3, 128, (17, 17), 33, (3, 3), (2, 2), (1, 1), (1, 1)),  # 33 filters: a masked half
    (1, 64, (14, 14), 256, (1, 1), (1, 1), (0, 0), (1, 1)),  # a bottleneck's last 1×1
])
@pytest.mark.parametrize("with_residual,out_dtype", [
    (True, np.int8),  # ResNet v2: a signed sum, then BatchNorm and relu
    (False, np.uint8),
])
@pytest.mark.parametrize("chunk_bytes", [int8_conv.CHUNK_BYTES, 1])
def test_the_direct_epilogue_writes_a_rescaled_second_output(
        monkeypatch, shape, with_residual, out_dtype, chunk_bytes):
    """A second output (`int8_conv.Rescaled`) made in the direct product's epilogue has the
    bytes `int8_affine`'s pass makes from the first output, and the first output keeps the
    NumPy path's bytes."""
    monkeypatch.setattr(int8_conv, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(shape[3] + 1)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, out_dtype, "relu" if out_dtype == np.uint8 else None,
        with_residual)
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    filters = weight.shape[0]
    # scales and shifts that take bytes below 0, past 255 and far past both
    scale = rng.uniform(-0.5, 4.0, filters).astype(np.float32)
    scale[:2] = (-3e9, 3e9)
    shift = rng.uniform(-200, 200, filters).astype(np.float32)
    # the pass's bytes from the NumPy path's first output (both NCHW here)
    second_want = np.zeros(want.shape, np.uint8)
    with spin_pool.armed(2):
        int8_affine.affine_job(want, scale, shift, second_want, False, False)()
    out, second = np.zeros_like(want), np.full(want.shape, 7, np.uint8)
    conv = _direct_to_channels_last(data, weight, geometry, out, residual, with_residual)
    assert conv.requantizes_in_product
    epilogue.rescaled = int8_conv.Rescaled(second, scale, shift)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    np.testing.assert_array_equal(_from_channels_last(second), second_want)


def test_a_second_output_needs_the_requantize_in_the_product():
    rng = np.random.default_rng(5)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, SHAPES[2], np.uint8, np.int8, None, False)
    out = np.zeros((1, weight.shape[0], 8, 8), np.int8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out)  # NCHW out
    assert not conv.requantizes_in_product
    epilogue.rescaled = int8_conv.Rescaled(np.zeros_like(out), np.ones(weight.shape[0],
                                           np.float32), np.zeros(weight.shape[0], np.float32))
    with pytest.raises(ValueError, match="second output"):
        conv(epilogue)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
def test_a_second_output_is_uint8():
    rng = np.random.default_rng(6)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, (1, 64, (7, 7), 20, (1, 1), (1, 1), (0, 0), (1, 1)), np.uint8, np.int8, None,
        False)
    out = np.zeros((1, 20, 7, 7), np.int8)
    conv = _direct_to_channels_last(data, weight, geometry, out)
    epilogue.rescaled = int8_conv.Rescaled(np.zeros_like(out), np.ones(20, np.float32),
                                           np.zeros(20, np.float32))
    with pytest.raises(ValueError, match="second output int8"):
        conv(epilogue)


def test_rows_first_where_the_weights_stay_in_cache_and_are_no_more_than_the_activations(
        monkeypatch):
    """A requantized direct product shares out its row blocks where its weights are small,
    or within twice its data and output and a core's L2 share (ResNet-18's 3×3 layers at
    28²: 144 KB against 196 KB), and it has two row blocks a core at least; else its
    panels."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)

    def packed(k, n):
        return gemm_int8.PackedWeights(np.zeros((k, n), np.int8), amx=True)

    assert int8_conv.rows_first(packed(576, 64), 2 * 64 * 56 * 56, 112)  # 36 KB at 56²
    assert int8_conv.rows_first(packed(1152, 128), 2 * 128 * 28 * 28, 28)  # 144 KB at 28²
    assert int8_conv.rows_first(packed(128, 256), 128 * 28 * 28 + 256 * 14 * 14, 7)
    assert not int8_conv.rows_first(packed(128, 256), 10 ** 6, 3)  # 3 blocks: 2 and 1
    assert int8_conv.rows_first(packed(256, 1024), 256 * 14 * 14 + 1024 * 14 * 14, 7)
    assert not int8_conv.rows_first(packed(2304, 256), 2 * 256 * 14 * 14, 7)  # 576 KB
    # ResNet-18's 3×3 layers into 512: 2.3 MB, past a core's L2 share whatever else
    assert not int8_conv.rows_first(packed(4608, 512), 10 ** 9, 10 ** 3)


def test_a_chain_takes_rows_first_also_where_the_weights_stay_in_the_l2(monkeypatch):
    """A chained layer shares out its rows where `rows_first` does, and also where its
    weights fit a core's L2 with two row blocks a core (MobileNet v2's 1×1 layers at 7²,
    150–410 KB against 55–80 KB of activations); not past the L2."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: 512 << 10)

    def packed(k, n):
        return gemm_int8.PackedWeights(np.zeros((k, n), np.int8))

    for k, n in ((160, 960), (960, 160), (960, 320), (320, 1280)):
        activations = 49 * (k + n)
        assert not int8_conv.rows_first(packed(k, n), activations, 13)
        assert int8_conv.chain_rows_first(packed(k, n), activations, 13)
        assert not int8_conv.chain_rows_first(packed(k, n), activations, 3)  # 2 and 1
    # ResNet's 3×3 layers into 256 at 14² (576 KB): past the L2
    assert not int8_conv.chain_rows_first(packed(2304, 256), 2 * 256 * 14 * 14, 7)
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: 256 << 10)
    assert not int8_conv.chain_rows_first(packed(320, 1280), 49 * 1600, 13)


@pytest.mark.skipif(host_features.has("avx512f"),
                    reason="an AVX-512 host keeps a 1×1 layer's chunks' jobs")
def test_a_one_by_one_layer_at_seven_squared_is_one_chain_copying_its_own_rows(monkeypatch):
    """MobileNet v2's 160 → 960 expansion at 7², int8 data handed over channels-last (49
    rows: the last row block read in the copy's tail), on two cores: one chained job whose
    shares each copy, multiply and requantize their rows; the NumPy path's bytes on one
    thread and armed, again after the data change."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: 512 << 10)
    rng = np.random.default_rng(_seed("seven squared"))
    shape = (1, 160, (7, 7), 960, (1, 1), (1, 1), (0, 0), (1, 1))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.int8, np.uint8, "bounded_relu", False)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    out = np.full(want.shape, 77, np.uint8)
    laid = _channels_last(data)
    conv = int8_conv.FusedConv(laid, weight, packed, geometry, out, None,
                               int8_conv.Layouts(data=True, out=True))
    assert not int8_conv.rows_first(packed, laid.nbytes + out.nbytes, 13)
    jobs = conv.jobs_for(epilogue)
    assert len(jobs) == 1 and isinstance(jobs[0], part_chain.Chain)
    assert {len(steps) for steps in jobs[0].alone} == {3}
    _alone_then_armed(conv, epilogue, out, want, _from_channels_last)
    data = np.flip(data, axis=2).copy()
    laid[...] = _channels_last(data)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), _reference(
        data, weight, geometry, epilogue, residual, storage, np.uint8))


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("size,row_blocks", [(28, 28), (14, 7)])
def test_a_direct_product_split_by_rows_or_by_panels_gives_the_same_bytes(
        monkeypatch, threads, rows, size, row_blocks):
    """The row blocks shared out among the parts (7 blocks: fewer than the 8 parts, some
    of which then get none) or the panels: the NumPy path's bytes, with a residual, on one
    thread and on two."""
    monkeypatch.setattr(int8_conv, "rows_first", lambda packed, activation_bytes, blocks: rows)
    shape = (1, 64, (size, size), 96, (3, 3), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(57)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.int8, None, True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.int8)
    out = np.zeros_like(want)
    conv = _direct_to_channels_last(data, weight, geometry, out, residual, residual_laid=True)
    assert conv.requantizes_in_product and -(-conv.rows // (2 * conv.tile_rows)) == row_blocks
    with spin_pool.armed(threads):
        for _ in range(3):  # the parts taken by either thread differ from run to run
            out[...] = 0
            conv(epilogue)
            np.testing.assert_array_equal(_from_channels_last(out), want)


# (batch, channels, size, filters, kernel, stride, pad, dilate) that run on wide rows:
# 7-wide outputs (ResNet-18's last stage), a batch of them, a dilated window, 33 filters
WIDE_SHAPES = [
    (1, 64, (7, 7), 48, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 128, (7, 7), 33, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 64, (7, 7), 64, (3, 3), (1, 1), (2, 2), (2, 2)),
    (2, 64, (9, 7), 40, (3, 3), (1, 1), (1, 1), (1, 1)),
]


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", WIDE_SHAPES)
@pytest.mark.parametrize("data_dtype,act,with_residual,residual_laid", [
    (np.uint8, "relu", False, False),
    (np.int8, "bounded_relu", True, True),
    (np.uint8, None, True, True),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_wide_rows_drop_the_sums_past_the_outputs_columns_and_rows(
        shape, data_dtype, act, with_residual, residual_laid, threads):
    """A stride-1 layer whose 7-wide output rows would fill 7 of a tile's 16 runs its tiles
    along the padded image's rows (`FusedConv.wide_grid`: half the row blocks), and its
    epilogue writes only the output's positions: the NumPy path's bytes, the bytes around
    the output untouched."""
    rng = np.random.default_rng(shape[3] + shape[0])
    out_dtype = np.uint8 if act else np.int8
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, out_dtype, act, with_residual)
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    room = np.full(want.size + 4096, 77, np.int8 if out_dtype == np.int8 else np.uint8)
    out = room[:want.size].reshape(want.shape)
    conv = _direct_to_channels_last(data, weight, geometry, out, residual, residual_laid)
    assert conv.grid is not None and conv.tile_rows == int8_conv.WIDE_TILE_ROWS
    assert -(-conv.sum_rows // 32) * 4 <= 3 * -(-conv.rows // (2 * gemm_int8.direct_tile_rows(
        want.shape[3])))
    with spin_pool.armed(threads):
        for _ in range(2):
            conv(epilogue)
            np.testing.assert_array_equal(_from_channels_last(out), want)
    assert (room[want.size:] == 77).all()


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", WIDE_SHAPES[:2])
def test_wide_rows_write_a_rescaled_second_output_at_the_outputs_positions(shape):
    rng = np.random.default_rng(shape[3] + 3)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.int8, None, True)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.int8)
    filters = weight.shape[0]
    scale, shift, second_want = _second_output(rng, want, filters)
    out, second = np.zeros_like(want), np.full(want.shape, 7, np.uint8)
    conv = _direct_to_channels_last(data, weight, geometry, out, residual, True)
    assert conv.grid is not None
    epilogue.rescaled = int8_conv.Rescaled(second, scale, shift)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    np.testing.assert_array_equal(_from_channels_last(second), second_want)


def test_outputs_wider_than_they_leave_room_for_keep_their_own_tiles():
    """Where wide rows would not save a quarter of the row blocks (14-wide rows fill 14 of
    16), or the layer is 1×1 or strided, the tiles stay within an output row."""
    for shape in [(1, 64, (14, 14), 64, (3, 3), (1, 1), (1, 1), (1, 1)),
                  (1, 64, (7, 7), 64, (1, 1), (1, 1), (0, 0), (1, 1)),
                  (1, 64, (14, 14), 64, (3, 3), (2, 2), (1, 1), (1, 1))]:
        rng = np.random.default_rng(1)
        data, weight, geometry, _, _, _ = _case(rng, shape, np.uint8, np.uint8, "relu", False)
        out_h, out_w = geometry.out_size(*shape[2])
        out = np.zeros((1, shape[3], out_h, out_w), np.uint8)
        packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight), amx=True)
        conv = int8_conv.FusedConv(data, weight, packed, geometry, out, None,
                                   int8_conv.Layouts(out=True))
        assert conv.grid is None and conv.tile_rows == gemm_int8.direct_tile_rows(out_w)
        assert conv.sum_rows == conv.rows


@pytest.mark.parametrize("avx512dq", [False, True])
@pytest.mark.parametrize("laid", [int8_conv.Layouts(), int8_conv.Layouts(True, True, True)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("huge_bias", [False, True])
def test_the_requantize_adds_in_int32_only_where_every_sum_fits(monkeypatch, avx512dq, laid,
                                                                 with_residual, huge_bias):
    """Without AVX-512 DQ the requantize adds sums and bias in int32 where every sum fits
    (`int8_conv.INT32_SUMS`), else in int64 as before: the NumPy path's bytes either way,
    a bias near int32's limit included."""
    from engine.cpu import host_features

    has = host_features.has
    monkeypatch.setattr(host_features, "has",
                        lambda flag: avx512dq if flag == "avx512dq" else has(flag))
    rng = np.random.default_rng(int(avx512dq) + 2 * int(huge_bias) + 4 * int(with_residual))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, SHAPES[2], np.uint8, np.uint8, "relu", with_residual)
    if huge_bias:
        epilogue.bias[::2] = 2 ** 31 - 2 ** 20
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(_channels_last(data) if laid.data else data, weight, packed,
                               geometry, out,
                               _channels_last(residual) if laid.residual and with_residual
                               else residual, laid)
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out) if laid.out else out, want)
    assert bool(conv._requantize_flags() & int8_conv.INT32_SUMS) == (
        not avx512dq and not huge_bias)


@pytest.mark.parametrize("postsum", [(None, 0.0), ("relu", 0.0), ("bounded_relu", 40.5),
                                     ("bounded_relu", 300.0)])
@pytest.mark.parametrize("out_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("int32_sums", [False, True])
def test_a_channels_last_residual_folds_the_activation_after_it_into_the_saturation(
        monkeypatch, postsum, out_dtype, int32_sums):
    """Output and residual both channels-last: the activation after the sum and the
    saturation applied as one clamp before the rounding give the NumPy path's bytes, a
    bound between two integers and one past the output's range included."""
    from engine.cpu import host_features

    has = host_features.has
    monkeypatch.setattr(host_features, "has",
                        lambda flag: not int32_sums if flag == "avx512dq" else has(flag))
    rng = np.random.default_rng(_seed(postsum, np.dtype(out_dtype).name, int32_sums))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, SHAPES[2], np.uint8, out_dtype, "relu", True)
    epilogue.postsum_act, epilogue.postsum_high = postsum
    epilogue.residual_scale = 1.9  # residuals alone reach past the output's range
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, _channels_last(residual),
                               int8_conv.Layouts(out=True, residual=True))
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    assert bool(conv._requantize_flags() & int8_conv.INT32_SUMS) == int32_sums
    if postsum[1] == 40.5:  # the bound between two integers is reached
        assert (want == 40).any()


@pytest.mark.skipif(not host_features.has("avx2"), reason="needs AVX2")
@pytest.mark.parametrize("filters", [8, 40, 96])
@pytest.mark.parametrize("out_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("residual_dtype", [None, np.int8, np.uint8])
def test_the_vector_requantize_gives_the_numpy_paths_bytes(monkeypatch, filters, out_dtype,
                                                          residual_dtype):
    """`int8_requantize_ir`'s tasks (int32 sums, channels-last output and residual, filters
    32 and 8 at a time) replace the compiled loop and write the NumPy path's bytes, for
    either output type and a residual of either type or none."""
    from engine.cpu import kernel_jobs

    has = host_features.has
    monkeypatch.setattr(host_features, "has",
                        lambda flag: False if flag == "avx512dq" else has(flag))
    # the vector pass's case: VNNI's tiles would requantize in their epilogue instead
    monkeypatch.setattr(gemm_int8, "fused_runs", lambda weights: False)
    bound = []
    bind = kernel_jobs.bind
    monkeypatch.setattr(kernel_jobs, "bind",
                        lambda kernel, *args, **keywords: bound.append(kernel[1]) or bind(
                            kernel, *args, **keywords))
    shape = (2, 24, (9, 10), filters, (3, 3), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(_seed(filters, np.dtype(out_dtype).name, str(residual_dtype)))
    with_residual = residual_dtype is not None
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, out_dtype, "bounded_relu", with_residual)
    if with_residual:
        residual = rng.integers(*(0, 256) if residual_dtype == np.uint8 else (-128, 128),
                                residual.shape).astype(residual_dtype)
        epilogue.postsum_act, epilogue.postsum_high = "bounded_relu", 100.5
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out,
                               None if residual is None else _channels_last(residual),
                               int8_conv.Layouts(out=True, residual=with_residual))
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    assert bound and "requantize" not in bound
    assert 0 < np.count_nonzero(want) < want.size


@pytest.mark.skipif(not host_features.has("avx2"), reason="needs AVX2")
@pytest.mark.parametrize("filters", [8, 40, 96])
@pytest.mark.parametrize("out_dtype,residual_dtype,over_residual", [
    (np.int8, np.int8, False),  # ResNet v2: a signed sum, then BatchNorm and relu
    (np.int8, np.int8, True),
    (np.uint8, np.uint8, True),
    (np.uint8, None, False),
])
def test_the_vector_requantize_writes_a_rescaled_second_output(
        monkeypatch, filters, out_dtype, residual_dtype, over_residual):
    """A second output (`int8_conv.Rescaled`) written by `int8_requantize_ir`'s pass has the
    bytes `int8_affine`'s pass makes from the first output, and the first output keeps the
    NumPy path's bytes, in chunks of rows and with the second output in the residual's own
    buffer (as a plan may give it, `fused._FusedInt8Conv._clear`)."""
    has = host_features.has
    monkeypatch.setattr(host_features, "has",
                        lambda flag: False if flag == "avx512dq" else has(flag))
    # the vector pass's case: VNNI's tiles would requantize in their epilogue instead
    monkeypatch.setattr(gemm_int8, "fused_runs", lambda weights: False)
    monkeypatch.setattr(int8_conv, "CHUNK_BYTES", 1)  # a chunk a row block: several jobs
    shape = (2, 24, (9, 10), filters, (3, 3), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(_seed("rescaled", filters, np.dtype(out_dtype).name,
                                      str(residual_dtype), over_residual))
    with_residual = residual_dtype is not None
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, out_dtype, "relu" if out_dtype == np.uint8 else None,
        with_residual)
    if with_residual:
        residual = rng.integers(*(0, 256) if residual_dtype == np.uint8 else (-128, 128),
                                residual.shape).astype(residual_dtype)
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    # scales and shifts that take codes below 0, past 255 and far past both
    scale = rng.uniform(-0.5, 4.0, filters).astype(np.float32)
    scale[:2] = (-3e9, 3e9)
    shift = rng.uniform(-200, 200, filters).astype(np.float32)
    second_want = np.zeros(want.shape, np.uint8)
    int8_affine.affine_job(want, scale, shift, second_want, False, False)()
    laid_residual = None if residual is None else _channels_last(residual)
    second = laid_residual.view(np.uint8) if over_residual else np.full(want.shape, 7,
                                                                          np.uint8)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, laid_residual,
                               int8_conv.Layouts(out=True, residual=with_residual))
    assert conv.writes_rescaled and not conv.requantizes_in_product
    epilogue.rescaled = int8_conv.Rescaled(second, scale, shift)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    np.testing.assert_array_equal(_from_channels_last(second), second_want)
    assert 0 < np.count_nonzero(second_want) < second_want.size
    assert (second_want == 255).any()


def test_a_second_output_needs_whole_steps_of_filters_on_the_vector_requantize(monkeypatch):
    """Filters not in whole steps of eight take the compiled loop, which writes no second
    output: the layer refuses one."""
    has = host_features.has
    monkeypatch.setattr(host_features, "has",
                        lambda flag: False if flag == "avx512dq" else has(flag))
    # the vector pass's case: VNNI's tiles would requantize in their epilogue instead
    monkeypatch.setattr(gemm_int8, "fused_runs", lambda weights: False)
    rng = np.random.default_rng(8)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, (1, 24, (9, 10), 20, (3, 3), (1, 1), (1, 1), (1, 1)), np.uint8, np.int8,
        None, False)
    out = np.zeros((1, 20, 9, 10), np.int8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, None,
                               int8_conv.Layouts(out=True))
    assert not conv.writes_rescaled
    epilogue.rescaled = int8_conv.Rescaled(np.zeros_like(out, np.uint8), np.ones(
        20, np.float32), np.zeros(20, np.float32))
    with pytest.raises(ValueError, match="second output"):
        conv(epilogue)


def test_the_vector_requantize_compiles_for_an_avx2_cpu_without_avx512():
    """`int8_requantize_ir`'s module (AVX2's packs, nothing of AVX-512) compiles for an AVX2
    CPU, whatever this host has (nothing of it runs)."""
    pytest.importorskip("llvmlite.binding")
    from engine.cpu import llvm_jit
    from engine.kernels import int8_requantize_ir

    engine = llvm_jit.compile_ir(str(int8_requantize_ir.module()), "haswell",
                                 "+avx2,+fma,-avx512f", level=2)
    assert engine.get_function_address(int8_requantize_ir.task_name(False, True))


# (batch, channels, size, filters, kernel, stride, pad, dilate): channels a multiple of 4
WINDOW_SHAPES = [
    (1, 64, (12, 12), 64, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 8, (11, 9), 33, (3, 3), (2, 2), (1, 1), (1, 1)),
    (3, 12, (12, 13), 20, (3, 3), (1, 2), (2, 1), (2, 2)),
    (1, 4, (15, 15), 17, (5, 5), (2, 2), (2, 2), (1, 1)),
    (2, 16, (9, 9), 24, (1, 1), (2, 2), (0, 0), (1, 1)),
]


# a table product (`gemm_int8.table_job`) runs here: VNNI's, or the AVX2 host's on narrow weights
needs_table = pytest.mark.skipif(
    not (gemm_int8.narrow_weights_pay() or gemm_int8.vnni_available()),
    reason="the host runs no table product (neither VNNI nor AVX2)")


@needs_table
@pytest.mark.parametrize("shape", WINDOW_SHAPES)
@pytest.mark.parametrize("data_dtype,out_dtype,act,with_residual", [
    (np.uint8, np.uint8, "relu", False),
    (np.int8, np.uint8, "bounded_relu", True),
])
@pytest.mark.parametrize("chunk_bytes", [1, int8_conv.CHUNK_BYTES])
def test_windows_are_read_where_they_lie(monkeypatch, shape, data_dtype,
                                           out_dtype, act, with_residual, chunk_bytes):
    """On VNNI, or on the AVX2 host with weights within ±63, a layer whose channels are a
    multiple of 4 takes the table product (`gemm_int8.table_job`): no patch rows gathered,
    each window read in the channels-last copy, in chunks of one row block or whole; the
    NumPy path's bytes on one thread and on two, and again after the data changes."""
    monkeypatch.setattr(int8_conv, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(_seed(shape, act, chunk_bytes))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, out_dtype, act, with_residual)
    weight = np.clip(weight, -63, 63)
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    out = np.full(want.shape, 77, out_dtype)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    assert conv.reads_windows and not conv.gathers
    conv(epilogue)
    np.testing.assert_array_equal(out, want)
    out[...] = 77
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)
    data[...] = np.flip(data, axis=3).copy()
    conv(epilogue)
    np.testing.assert_array_equal(
        out, _reference(data, weight, geometry, epilogue, residual, storage, out_dtype))


@pytest.mark.skipif(not gemm_int8.narrow_weights_pay(),
                    reason="the host runs the VNNI kernels: no vpmaddubsw taps product")
@pytest.mark.parametrize("shape,data_dtype,skips", [
    (WINDOW_SHAPES[0], np.uint8, True),
    (WINDOW_SHAPES[2], np.uint8, True),  # dilated, strides and padding differing by axis
    ((2, 8, (3, 4), 16, (3, 3), (1, 1), (4, 3), (1, 1)), np.uint8, True),  # windows all padding
    (WINDOW_SHAPES[0], np.int8, False),  # its padding holds 128, taken out over every tap
    (WINDOW_SHAPES[4], np.uint8, False),  # no padding
])
def test_uint8_windows_at_the_border_walk_only_the_taps_inside(shape, data_dtype, skips):
    """uint8 data with padding take the taps product (`border_taps`): each tile walks the
    taps its windows have inside the image, down to none for a window wholly in the
    padding; the NumPy path's bytes on one thread and on two. int8 data, or no padding,
    keep the table product."""
    rng = np.random.default_rng(_seed("taps", shape, np.dtype(data_dtype).str))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, np.uint8, "relu", False)
    weight = np.clip(weight, -63, 63)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.full(want.shape, 77, np.uint8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    assert conv.reads_windows and conv.skips_padding == skips
    _alone_then_armed(conv, epilogue, out, want)


@needs_table
@pytest.mark.parametrize("shape,in_place", [
    ((2, 16, (9, 9), 24, (1, 1), (2, 2), (0, 0), (1, 1)), True),  # a stride-2 shortcut
    ((1, 8, (11, 9), 33, (3, 3), (2, 2), (1, 1), (1, 1)), False),  # padded: copied
])
def test_windows_of_uint8_data_handed_over_are_read_where_they_lie(shape, in_place):
    """The table product of an unpadded layer reads its windows in the uint8 data handed
    over channels-last (no copy job); a padded one reads them in the padded copy. Both
    write the NumPy path's bytes, again after the data change."""
    rng = np.random.default_rng(_seed("in place", shape))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.uint8, "relu", False)
    weight = np.clip(weight, -63, 63)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.full(want.shape, 77, np.uint8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    laid = _channels_last(data)
    conv = int8_conv.FusedConv(laid, weight, packed, geometry, out, None,
                               int8_conv.Layouts(data=True, out=True))
    assert conv.reads_windows and conv.reads_rows_in_place == conv.reads_data_in_place \
        == in_place
    chunks = -(-conv.rows // int8_conv.chunk_rows(conv.rows, packed, gathers=False))
    jobs = conv.jobs_for(epilogue)
    # the products and requantize passes: a job each a chunk, one chain on several cores,
    # or one job on VNNI's tiles requantizing in their epilogue
    chained = isinstance(jobs[-1], part_chain.Chain)
    assert len(jobs) == (1 if chained or conv.vnni_epilogue else 2 * chunks) + (
        0 if in_place else 1)
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    laid[...] = _channels_last(np.flip(data, axis=3))
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), _reference(
        np.flip(data, axis=3), weight, geometry, epilogue, residual, storage, np.uint8))


@needs_table
@pytest.mark.parametrize("shape", [WINDOW_SHAPES[0], WINDOW_SHAPES[2], WINDOW_SHAPES[3]])
@pytest.mark.parametrize("share_blocks", [1, 2])
def test_a_layer_reading_its_windows_is_one_chain_of_shares(monkeypatch, shape, share_blocks):
    """A layer of small weights that reads its windows where they lie runs its products and
    requantize passes as one chained job after its copy, in shares of at most `chunk_bytes`
    of sums (a row block each, or two), one part a core: the NumPy path's bytes on one
    thread, armed on two (twice: the claim word starts again at 0), and again after the
    data change."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    rng = np.random.default_rng(_seed(shape, share_blocks))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.int8, np.uint8, "bounded_relu", True)
    weight = np.clip(weight, -63, 63)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    out = np.full(want.shape, 77, np.uint8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    block_bytes = packed.rows * packed.panels * packed.vectors * gemm_int8.LANES * 4
    monkeypatch.setattr(int8_conv, "chunk_bytes", lambda: share_blocks * block_bytes)
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    jobs = conv.jobs_for(epilogue)
    assert conv.reads_windows and len(jobs) == 2
    chain = jobs[1]
    assert isinstance(chain, part_chain.Chain) and chain.parts == len(chain.by_part) == 2
    row_blocks = -(-conv.rows // packed.rows)
    assert row_blocks > 2 * share_blocks
    assert -(-row_blocks // share_blocks) <= len(chain.alone) <= row_blocks // share_blocks + 1
    _alone_then_armed(conv, epilogue, out, want)
    data[...] = np.flip(data, axis=3).copy()
    conv(epilogue)
    np.testing.assert_array_equal(
        out, _reference(data, weight, geometry, epilogue, residual, storage, np.uint8))


@needs_table
@pytest.mark.parametrize("shape", [
    (2, 16, (17, 17), 24, (1, 1), (2, 2), (0, 0), (1, 1)),  # a stride-2 shortcut: in place
    (1, 8, (16, 16), 16, (3, 3), (1, 1), (1, 1), (1, 1)),  # padded: read in the copy
])
def test_chained_shares_read_handed_over_data_in_place_and_write_a_second_output(
        monkeypatch, shape):
    """A chained layer's shares run the requantize pass the chunks run: with a second output
    (`int8_conv.Rescaled`) it has the bytes `int8_affine`'s pass makes from the first, and an
    unpadded layer's windows are read in the uint8 data handed over (no copy job); on one
    thread and armed on two."""
    has = host_features.has
    monkeypatch.setattr(host_features, "has",
                        lambda flag: False if flag == "avx512dq" else has(flag))
    # the vector pass's case: VNNI's tiles would requantize in their epilogue instead
    monkeypatch.setattr(gemm_int8, "fused_runs", lambda weights: False)
    monkeypatch.setattr(int8_conv, "chunk_bytes", lambda: 1)
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    rng = np.random.default_rng(_seed("chained rescaled", shape))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.int8, None, True)
    weight = np.clip(weight, -63, 63)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.int8)
    filters = shape[3]
    scale, shift, second_want = _second_output(rng, want, filters)
    laid = _channels_last(data)
    out = np.zeros_like(want)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(laid, weight, packed, geometry, out, _channels_last(residual),
                               int8_conv.Layouts(data=True, out=True, residual=True))
    epilogue.rescaled = int8_conv.Rescaled(np.full(want.shape, 7, np.uint8), scale, shift)
    in_place = geometry.pad == (0, 0)
    assert conv.reads_windows and conv.writes_rescaled and conv.reads_data_in_place == in_place
    jobs = conv.jobs_for(epilogue)
    assert len(jobs) == (1 if in_place else 2) and isinstance(jobs[-1], part_chain.Chain)
    for armed in (False, True):
        out[...] = 0
        epilogue.rescaled.out[...] = 7
        if armed:
            with spin_pool.armed(2):
                conv(epilogue)
        else:
            conv(epilogue)
        np.testing.assert_array_equal(_from_channels_last(out), want)
        np.testing.assert_array_equal(_from_channels_last(epilogue.rescaled.out), second_want)
    assert 0 < np.count_nonzero(second_want) < second_want.size


@needs_table
def test_a_layer_whose_weights_outweigh_its_rows_keeps_its_chunks_jobs(monkeypatch):
    """Where the cores had better share a layer's weights by panels than its rows
    (`int8_conv.rows_first`: 1.2 MB of weights against 0.1 MB of activations) and they
    outweigh a core's L2 (1 MB here, `chain_rows_first`), its chunks stay a product job and
    a requantize job each, their tiles shared among the cores."""
    monkeypatch.setattr(spin_pool, "cores", lambda: 2)
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: 2 ** 20)
    rng = np.random.default_rng(5)
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, (2, 512, (7, 7), 256, (3, 3), (1, 1), (1, 1), (1, 1)), np.uint8, np.uint8,
        "relu", False)
    weight = np.clip(weight, -63, 63)
    out = np.zeros((2, 256, 7, 7), np.uint8)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    jobs = conv.jobs_for(epilogue)
    assert conv.reads_windows and not any(isinstance(job, part_chain.Chain) for job in jobs)
    assert len(jobs) == 1 + 2 * -(-conv.rows // int8_conv.chunk_rows(conv.rows, packed,
                                                                      gathers=False))
    conv(epilogue)
    np.testing.assert_array_equal(
        out, _reference(data, weight, geometry, epilogue, residual, storage, np.uint8))


@pytest.mark.parametrize("l2,chunk", [(None, 2 ** 19), (2 ** 21, 2 ** 19), (2 ** 19, 2 ** 17)])
def test_chained_shares_take_a_share_of_the_l2_where_it_is_small(monkeypatch, l2, chunk):
    """A chained layer's share of sums: `CHUNK_BYTES` where the L2 is unknown or 2 MB, a
    quarter of Zen 3's 512 KB."""
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: l2)
    assert int8_conv.chunk_bytes() == chunk


needs_fused = pytest.mark.skipif(
    not gemm_int8.vnni_available(),
    reason="the host runs no VNNI tiles to requantize in their epilogue")


@needs_fused
@pytest.mark.parametrize("shape", [
    *WINDOW_SHAPES,
    (1, 16, (14, 14), 96, (1, 1), (1, 1), (0, 0), (1, 1)),  # an expansion: rows, 2 panels
    (2, 24, (5, 7), 144, (1, 1), (1, 1), (0, 0), (1, 1)),  # 70 rows: a short last block
    (1, 32, (7, 7), 8, (1, 1), (1, 1), (0, 0), (1, 1)),  # 8 filters: a 16-column panel
    (1, 3, (23, 21), 65, (7, 7), (2, 2), (3, 3), (1, 1)),  # a stem's runs of 7 × 3
])
@pytest.mark.parametrize("data_dtype,out_dtype,act,with_residual,rescaled", [
    (np.uint8, np.uint8, "relu", False, False),
    (np.int8, np.uint8, "bounded_relu", True, False),
    (np.uint8, np.int8, None, True, True),
    (np.int8, np.int8, None, False, True),
])
def test_vnni_tiles_requantize_in_their_epilogue(shape, data_dtype, out_dtype, act,
                                                 with_residual, rescaled):
    """On VNNI, a layer reading its rows without a gather (windows by their table, a 1×1
    layer's rows, a stem's runs) into a channels-last output is one job whose tiles
    requantize in their epilogue (`gemm_int8.fused_job`): the NumPy path's bytes, with a
    residual and a second output (`int8_conv.Rescaled`: `int8_affine`'s pass over the
    first), for panels of 16 to 64 columns, filters past a panel's, a short last row
    block, int8 data shifted onto uint8; on one thread, armed on two, and again after the
    data change."""
    rng = np.random.default_rng(_seed("fused", shape, np.dtype(data_dtype).str,
                                      np.dtype(out_dtype).str, act, with_residual, rescaled))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, out_dtype, act, with_residual)
    want = _reference(data, weight, geometry, epilogue, residual, storage, out_dtype)
    run = int8_conv.run_bytes(shape[1], geometry)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight) if run is None
                                     else int8_conv.run_matrix(weight, run))
    out = np.full(want.shape, 77, out_dtype)
    conv = int8_conv.FusedConv(
        data, weight, packed, geometry, out,
        None if residual is None else _channels_last(residual),
        int8_conv.Layouts(data=False, out=True, residual=residual is not None))
    assert conv.vnni_epilogue and conv.requantizes_in_product and not conv.gathers
    filters = shape[3]
    second_want = None
    if rescaled:
        scale, shift, second_want = _second_output(rng, want, filters)
        epilogue.rescaled = int8_conv.Rescaled(np.zeros(want.shape, np.uint8), scale, shift)
    jobs = conv.jobs_for(epilogue)
    assert len(jobs) == 2  # the channels-last copy, then the one product
    _alone_then_armed(conv, epilogue, out, want, _from_channels_last, second_want)
    data[...] = np.flip(data, axis=3).copy()
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), _reference(
        data, weight, geometry, epilogue, residual, storage, out_dtype))


@needs_fused
def test_the_fused_product_refuses_what_it_cannot_run():
    """Rows or tables that do not fit the weights are refused, and AMX-packed weights."""
    weights = gemm_int8.PackedWeights(np.ones((8, 20), np.int8))
    terms = (np.zeros(18, np.int64), np.zeros(7, np.float32))
    rows = np.zeros((weights.rows, 8), np.uint8)
    with pytest.raises(ValueError, match="rows"):
        gemm_int8.fused_job(rows[:1], 0, 2, weights, False, terms)
    with pytest.raises(ValueError, match="group offsets"):
        gemm_int8.fused_job(np.zeros(weights.rows, np.int64), np.zeros(3, np.int64), 1,
                            weights, False, terms)
    with pytest.raises(RuntimeError, match="AMX"):
        gemm_int8.fused_job(rows, 0, 1, gemm_int8.PackedWeights(np.ones((8, 20), np.int8),
                                                                amx=True), False, terms)


# (batch, channels, size, filters, kernel, stride, pad, dilate): kernel rows whose runs are
# not whole groups of four bytes (a stem's 7 × 3 channels: 21), one reaching the image's last
# pixel
RUN_SHAPES = [
    (1, 3, (23, 21), 65, (7, 7), (2, 2), (3, 3), (1, 1)),
    (2, 5, (9, 11), 7, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 1, (10, 10), 20, (5, 3), (1, 2), (0, 0), (2, 1)),
    (2, 3, (8, 9), 16, (3, 3), (1, 1), (0, 0), (1, 1)),
]


@needs_table
@pytest.mark.parametrize("shape", RUN_SHAPES)
@pytest.mark.parametrize("data_dtype", [np.int8, np.uint8])
def test_runs_padded_to_whole_groups_read_the_windows_where_they_lie(shape, data_dtype):
    """Weights within ±63 packed from `run_matrix` (each kernel row's run padded to whole
    groups, zero weights past it): the table product reads each window's runs where they
    lie, on past their ends (the next pixel's bytes, times zero); the NumPy path's bytes on
    one thread and on two. Packed from `weight_matrix`, the same layer still gathers."""
    rng = np.random.default_rng(_seed(shape))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, data_dtype, np.uint8, "relu", False)
    weight = np.clip(weight, -63, 63)
    want = _reference(data, weight, geometry, epilogue, residual, storage, np.uint8)
    run = int8_conv.run_bytes(shape[1], geometry)
    assert run is not None and run % 4 == 0 and run > shape[1] * geometry.kernel[1]
    packed = gemm_int8.PackedWeights(int8_conv.run_matrix(weight, run))
    out = np.full(want.shape, 77, np.uint8)
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, residual)
    assert conv.run == run and conv.reads_windows and not conv.gathers
    conv(epilogue)
    np.testing.assert_array_equal(out, want)
    out[...] = 77
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)
    plain = int8_conv.FusedConv(data, weight, gemm_int8.PackedWeights(
        int8_conv.weight_matrix(weight)), geometry, out, residual)
    assert plain.run is None and plain.gathers


def test_run_bytes_pads_only_runs_off_whole_groups():
    stem = int8_conv.Geometry((7, 7), (2, 2), (1, 1), (3, 3))
    assert int8_conv.run_bytes(3, stem) == 24
    assert int8_conv.run_bytes(4, stem) is None  # 28: whole groups already
    assert int8_conv.run_bytes(3, int8_conv.Geometry((7, 7), (2, 2), (1, 2), (3, 3))) is None


needs_vnni = pytest.mark.skipif(not gemm_int8.vnni_available(), reason="needs AVX-512 VNNI")


@needs_vnni
@pytest.mark.parametrize("shape,with_residual", [
    ((1, 64, (14, 14), 64, (3, 3), (1, 1), (1, 1), (1, 1)), False),  # 4-vector panels
    ((2, 32, (7, 7), 32, (3, 3), (1, 1), (1, 1), (1, 1)), True),  # tiles across two images
    ((1, 16, (28, 14), 40, (3, 3), (2, 2), (1, 1), (1, 1)), False),  # stride 2, filters off 16
    ((1, 8, (14, 14), 24, (3, 3), (1, 1), (2, 2), (2, 2)), True),  # dilated: two pixels a side
    ((1, 4, (14, 21), 17, (5, 5), (1, 1), (2, 2), (1, 1)), False),
])
def test_vnni_run_tiles_leave_out_the_taps_in_the_padding(shape, with_residual):
    """On VNNI, a padded layer of uint8 data whose output rows are whole runs of 7 and whose
    product requantizes in its epilogue runs the run tiles (`gemm_int8.fused_job`'s
    ``runs``): the NumPy path's bytes, on one thread and armed over two."""
    rng = np.random.default_rng(_seed("runs", shape))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.uint8, "relu", with_residual)
    want = _reference(data, weight, geometry, epilogue, residual, storage, storage)
    out = np.zeros(want.shape, storage)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    laid = None if residual is None else _channels_last(residual)
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, laid,
                               int8_conv.Layouts(out=True, residual=with_residual))
    assert conv.skips_padding_in_runs
    _alone_then_armed(conv, epilogue, out, want, restore=_from_channels_last)


@needs_vnni
def test_vnni_run_tiles_compute_only_the_taps_their_table_says_read_inside(monkeypatch):
    """The run tiles read which taps each run computes from `border_taps.tap_bounds`: told
    that the middle tap reads inside nowhere, they leave its products out everywhere. Signed
    data, whose padding holds 128, and a layer with no padding keep the tiles of every tap."""
    shape = (1, 32, (14, 14), 32, (3, 3), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(_seed("runs table", shape))
    data, weight, geometry, epilogue, residual, storage = _case(
        rng, shape, np.uint8, np.uint8, None, False)
    middle_less = weight.copy()
    middle_less[:, :, 1, 1] = 0
    want = _reference(data, middle_less, geometry, epilogue, residual, storage, storage)
    true_bounds = border_taps.tap_bounds

    def middle_nowhere(*args):
        bounds = true_bounds(*args)
        bounds[4] = (0, -1, 0, -1)
        return bounds

    monkeypatch.setattr(border_taps, "tap_bounds", middle_nowhere)
    out = np.zeros(want.shape, storage)
    packed = gemm_int8.PackedWeights(int8_conv.weight_matrix(weight))
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, None,
                               int8_conv.Layouts(out=True))
    conv(epilogue)
    np.testing.assert_array_equal(_from_channels_last(out), want)
    signed = int8_conv.FusedConv(data.view(np.int8), weight, packed, geometry, out, None,
                                 int8_conv.Layouts(out=True))
    unpadded = int8_conv.FusedConv(data, weight, packed, int8_conv.Geometry(
        (3, 3), (1, 1), (1, 1), (0, 0)), np.zeros((1, 32, 12, 12), np.uint8), None,
        int8_conv.Layouts(out=True))
    assert not signed.skips_padding_in_runs and not unpadded.skips_padding_in_runs
