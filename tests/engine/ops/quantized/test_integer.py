"""The int8 products on the VNNI GEMM give the float64 path's sums bit for bit, and MXNet's
int8 exports take that path where the host has VNNI (so the bit-exact model tests run it)."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.kernels import gemm_int8, int8_conv, int8_depthwise
from engine.ops.quantized import integer
from tests.engine.ops.quantized import fixtures


def _both_paths(run, *arguments):  # noqa: ANN001, ANN202 - any product
    integer.use_fast_path(False)
    try:
        exact = run(*arguments)
    finally:
        integer.use_fast_path(True)
    before = integer.PATHS["int8_gemm"]
    integer.use_fast_path(True, min_work=0)
    try:
        fast = run(*arguments)
    finally:
        integer.use_fast_path(True)
    taken = integer.PATHS["int8_gemm"] > before
    assert taken == gemm_int8.available()
    return fast, exact


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("channels", "filters", "kernel", "stride", "pad", "groups"), [
    (3, 16, (3, 3), (1, 1), (1, 1), 1), (13, 37, (3, 3), (2, 2), (1, 1), 1),
    (64, 64, (1, 1), (1, 1), (0, 0), 1), (32, 64, (3, 3), (1, 1), (1, 1), 2),
    (5, 20, (2,), (1,), (0,), 1)])
def test_convolutions_equal_the_float64_sums(dtype: type, channels: int, filters: int,
                                             kernel: tuple, stride: tuple, pad: tuple,
                                             groups: int) -> None:
    rng = np.random.default_rng(channels + filters)
    info = np.iinfo(dtype)
    data = rng.integers(info.min, info.max + 1, (2, channels, *[9] * len(kernel))).astype(dtype)
    weight = rng.integers(-128, 128, (filters, channels // groups, *kernel)).astype(np.int8)
    weight.setflags(write=False)
    fast, exact = _both_paths(integer.conv, data, weight, kernel, stride, (1,) * len(kernel),
                              pad, groups)
    assert fast.dtype == np.float64
    np.testing.assert_array_equal(fast, exact)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("multiplier", "stride", "dilate", "pad"), [
    (1, (1, 1), (1, 1), (1, 1)), (1, (2, 2), (1, 1), (1, 1)), (2, (1, 2), (2, 1), (2, 0))])
def test_depthwise_convolutions_run_as_int32_with_the_float64_sums(
        dtype: type, multiplier: int, stride: tuple, dilate: tuple, pad: tuple) -> None:
    rng = np.random.default_rng(multiplier)
    info = np.iinfo(dtype)
    data = rng.integers(info.min, info.max + 1, (2, 6, 9, 8)).astype(dtype)
    weight = rng.integers(-128, 128, (6 * multiplier, 1, 3, 3)).astype(np.int8)
    arguments = (data, weight, (3, 3), stride, dilate, pad, 6)
    integer.use_fast_path(False)
    try:
        exact = integer.conv(*arguments)
    finally:
        integer.use_fast_path(True)
    before = dict(integer.PATHS)
    sums = integer.conv(*arguments)
    assert integer.PATHS["int32_depthwise"] == before.get("int32_depthwise", 0) + 1
    assert integer.PATHS["int8_gemm"] == before.get("int8_gemm", 0)  # 16 columns a filter: no
    np.testing.assert_array_equal(sums, exact)


def test_products_too_small_to_pay_for_the_call_stay_on_float64() -> None:
    left, right = np.ones((4, 8), np.uint8), np.ones((8, 4), np.int8)
    before = dict(integer.PATHS)
    np.testing.assert_array_equal(integer.matmul(left, right), np.full((4, 4), 8.0))
    assert integer.PATHS["int8_gemm"] == before.get("int8_gemm", 0)
    assert integer.PATHS["float64"] == before.get("float64", 0) + 1


@pytest.mark.parametrize(("left_shape", "right_shape"), [
    ((3, 50), (50, 10)), ((2, 4, 7), (7, 20)), ((6, 5, 8), (6, 8, 5))])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_matrix_products_equal_the_float64_sums(left_shape: tuple, right_shape: tuple,
                                                dtype: type) -> None:
    rng = np.random.default_rng(len(left_shape))
    info = np.iinfo(dtype)
    left = rng.integers(info.min, info.max + 1, left_shape).astype(dtype)
    right = rng.integers(-128, 128, right_shape).astype(np.int8)
    fast, exact = _both_paths(integer.matmul, left, right)
    np.testing.assert_array_equal(fast, exact)


def test_long_products_of_many_rows_take_amx_where_the_host_has_it() -> None:
    rng = np.random.default_rng(5)
    weight = rng.integers(-128, 128, (300, 40)).astype(np.int8)
    weight.setflags(write=False)
    assert integer.packed_weights(weight, 64).amx == gemm_int8.amx_available()
    assert not integer.packed_weights(weight, 2).amx  # 2 rows of a 32-row tile: VNNI
    assert not integer.packed_weights(weight[:64], 64).amx  # K 64: VNNI
    # a fused convolution's product takes AMX from K 64 (`int8_conv.AMX_MIN_DEPTH`)
    assert integer.packed_weights(weight[:64], 64, min_depth=64).amx == \
        gemm_int8.amx_available()
    for dtype in (np.uint8, np.int8):
        info = np.iinfo(dtype)
        left = rng.integers(info.min, info.max + 1, (70, 300)).astype(dtype)
        fast, exact = _both_paths(integer.matmul, left, weight)
        np.testing.assert_array_equal(fast, exact)


def test_products_longer_than_int32_holds_stay_on_float64() -> None:
    depth = gemm_int8.EXACT_DEPTH + 1
    left = np.full((1, depth), 255, np.uint8)
    right = np.full((depth, 1), -128, np.int8)
    before = integer.PATHS["int8_gemm"]
    integer.use_fast_path(True, min_work=0)
    try:
        sums = integer.matmul(left, right)
    finally:
        integer.use_fast_path(True)
    assert integer.PATHS["int8_gemm"] == before
    assert sums[0, 0] == -255 * 128 * depth  # below int32's least value, exact in float64


def test_read_only_weights_are_packed_once() -> None:
    weight = np.random.default_rng(0).integers(-128, 128, (30, 20)).astype(np.int8)
    weight.setflags(write=False)
    left = np.ones((4, 30), np.uint8)
    integer.use_fast_path(True, min_work=0)
    try:
        first = integer.matmul(left, weight)
    finally:
        integer.use_fast_path(True)
    if not gemm_int8.available():
        return
    packed = integer.packed_weights(weight, 4)
    assert integer.packed_weights(weight, 4) is packed
    np.testing.assert_array_equal(integer.matmul(left, weight), first)


# The exports whose calibrated ``_sg_mkldnn_conv`` nodes `int8_conv` runs (the others have
# none, or uncalibrated int32 outputs, or MXNet's unfused quantized_conv).
CALIBRATED_FUSED_CONVS = ("resnet18_v1_naive", "resnet50_v1_thin_entropy", "mobilenet_v2_naive",
                          "concat_bn_int8_naive")
# Of those, the exports with calibrated depthwise convolutions: `int8_depthwise` runs them
# without the int8 GEMM.
CALIBRATED_DEPTHWISE = ("mobilenet_v2_naive",)


@pytest.mark.parametrize("name", fixtures.MODELS)
def test_mxnets_int8_exports_give_the_same_bits_on_both_paths(name: str) -> None:
    symbol, params = fixtures.paths(name)
    data = fixtures.io(name)["data"]
    model = engine.load_model(str(symbol), str(params))
    before = dict(integer.PATHS)
    integer.use_fast_path(True, min_work=0)  # every product, however small
    try:
        (fast,) = model.infer({"data": data}).values()
    finally:
        integer.use_fast_path(True)
    taken = {path for path in ("int8_gemm", "int8_fused_conv")
             if integer.PATHS[path] > before.get(path, 0)}
    depthwise_alone = name in CALIBRATED_DEPTHWISE and int8_depthwise.available()
    assert bool(taken) == (gemm_int8.available() or depthwise_alone)
    if name in CALIBRATED_FUSED_CONVS:  # a plan binds their convolutions fused
        assert ("int8_fused_conv" in taken) == (int8_conv.supported_here() or depthwise_alone)
    integer.use_fast_path(False)
    try:
        (exact,) = engine.load_model(str(symbol), str(params)).infer({"data": data}).values()
    finally:
        integer.use_fast_path(True)
    np.testing.assert_array_equal(np.asarray(fast), np.asarray(exact))


def test_a_one_row_product_with_a_large_weight_runs_on_the_int8_gemm() -> None:
    """Under `MIN_WORK` multiply-adds, but float64 would convert all 512 × 1000 weights on
    every call (a classifier at batch 1): the int8 GEMM, its weights packed once, takes it."""
    rng = np.random.default_rng(4)
    weight = rng.integers(-128, 128, (512, 1000)).astype(np.int8)
    weight.setflags(write=False)
    row = rng.integers(0, 256, (1, 512)).astype(np.uint8)
    assert row.size * weight.shape[1] < integer.MIN_WORK
    before = integer.PATHS["int8_gemm"]
    sums = integer.matmul(row, weight)
    assert (integer.PATHS["int8_gemm"] > before) == gemm_int8.available()
    np.testing.assert_array_equal(sums, row.astype(np.float64) @ weight.astype(np.float64))
