"""Normalisation ops: parameter shapes inferred from data, dtypes, hidden outputs, kernels."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op

F32 = np.dtype(np.float32)


def infer(op_name: str, raw: dict[str, str], shapes: list) -> tuple[list, list]:
    op = get_op(op_name)
    return op.infer_shape(op.parse_attrs(raw), shapes)


def test_batchnorm_fills_channel_params_from_data() -> None:
    inputs, outputs = infer("BatchNorm", {}, [(2, 3, 4, 4), None, None, None, None])
    assert inputs == [(2, 3, 4, 4)] + [(3,)] * 4
    assert outputs == [(2, 3, 4, 4)]


def test_batchnorm_axis_and_unknown_batch() -> None:
    inputs, outputs = infer("BatchNorm", {"axis": "-1"}, [(0, 5, 7), None, (0,), None, None])
    assert inputs[1:] == [(7,)] * 4
    assert outputs == [(0, 5, 7)]


def test_batchnorm_fills_data_channels_from_params() -> None:
    inputs, _ = infer("BatchNorm", {}, [(2, 0, 4), (6,), None, None, None])
    assert inputs[0] == (2, 6, 4)
    assert inputs[2:] == [(6,)] * 3


def test_batchnorm_rejects_mismatched_gamma() -> None:
    with pytest.raises(ShapeError, match="BatchNorm input 1"):
        infer("BatchNorm", {}, [(2, 3, 4), (4,), None, None, None])


def test_batchnorm_output_counts_and_aux() -> None:
    op = get_op("BatchNorm")
    plain, with_stats = op.parse_attrs({}), op.parse_attrs({"output_mean_var": "True"})
    assert op.num_outputs(plain) == 1 and op.num_total_outputs(plain) == 3
    assert op.num_outputs(with_stats) == 3 and op.num_total_outputs(with_stats) == 3
    assert op.aux == ("moving_mean", "moving_var")
    assert get_op("_npx_batch_norm") is op
    _, outputs = op.infer_shape(with_stats, [(2, 3, 5), None, None, None, None])
    assert outputs == [(2, 3, 5), (3,), (3,)]


def test_batchnorm_float16_data_keeps_float32_params() -> None:
    op = get_op("BatchNorm")
    attrs = op.parse_attrs({"fix_gamma": "False"})
    inputs, outputs = op.infer_dtype(attrs, [np.dtype(np.float16), None, None, None, None])
    assert inputs[1:] == [F32] * 4 and outputs == [np.dtype(np.float16)]
    rng = np.random.default_rng(0)
    data = rng.normal(size=(2, 3, 4)).astype(np.float16)
    gamma, beta, mean = (rng.normal(size=3).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, size=3).astype(np.float32)
    (out,) = op.compute(np, attrs, [data, gamma, beta, mean, var])
    expected = ((data.astype(np.float64) - mean[:, None]) / np.sqrt(var[:, None] + 1e-3)
                * gamma[:, None] + beta[:, None])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("op_name", ["LayerNorm", "InstanceNorm", "GroupNorm"])
def test_scale_shift_params_from_data(op_name: str) -> None:
    raw = {"num_groups": "2"} if op_name == "GroupNorm" else {}
    inputs, outputs = infer(op_name, raw, [(2, 4, 6), None, None])
    channels = 6 if op_name == "LayerNorm" else 4
    assert inputs[1:] == [(channels,), (channels,)]
    assert outputs == [(2, 4, 6)]


def test_layernorm_stats_shapes_and_values() -> None:
    op = get_op("LayerNorm")
    attrs = op.parse_attrs({"axis": "1", "output_mean_var": "True"})
    _, shapes = op.infer_shape(attrs, [(2, 5, 3), None, None])
    assert shapes == [(2, 5, 3), (2, 1, 3), (2, 1, 3)]
    data = np.random.default_rng(1).normal(size=(2, 5, 3)).astype(np.float32)
    out, mean, std = op.compute(np, attrs, [data, np.ones(5, np.float32), np.zeros(5, np.float32)])
    np.testing.assert_allclose(mean, data.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, np.sqrt(data.var(axis=1, keepdims=True) + 1e-5), rtol=1e-5)
    np.testing.assert_allclose(out.std(axis=1), np.ones((2, 3)), rtol=1e-3)


def test_groupnorm_matches_layernorm_over_whole_sample_with_one_group() -> None:
    rng = np.random.default_rng(2)
    data = rng.normal(size=(3, 4, 5)).astype(np.float32)
    gamma, beta = rng.normal(size=4).astype(np.float32), rng.normal(size=4).astype(np.float32)
    op = get_op("GroupNorm")
    (out,) = op.compute(np, op.parse_attrs({}), [data, gamma, beta])
    flat = data.reshape(3, -1)
    normed = ((flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-5))
    expected = normed.reshape(data.shape) * gamma[:, None] + beta[:, None]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_groupnorm_rejects_indivisible_channels() -> None:
    with pytest.raises(ShapeError, match="num_groups"):
        infer("GroupNorm", {"num_groups": "3"}, [(2, 4, 5), None, None])


def test_lrn_matches_direct_window_sum() -> None:
    rng = np.random.default_rng(3)
    data = rng.normal(size=(2, 6, 3)).astype(np.float32)
    op = get_op("LRN")
    attrs = op.parse_attrs({"nsize": "5", "alpha": "0.01", "beta": "0.75", "knorm": "1.5"})
    (out,) = op.compute(np, attrs, [data])
    expected = np.empty_like(data, dtype=np.float64)
    for channel in range(6):
        window = data[:, max(0, channel - 2):channel + 3].astype(np.float64) ** 2
        expected[:, channel] = data[:, channel] / (1.5 + 0.01 / 5 * window.sum(1)) ** 0.75
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    assert op.num_total_outputs(attrs) == 2


def test_l2normalization_rejects_too_few_dims_for_channel_mode() -> None:
    with pytest.raises(ShapeError, match="at least 3 dims"):
        infer("L2Normalization", {"mode": "channel"}, [(4, 5)])
