"""Ranges, gathers, adaptive pooling and attention matmuls: partial shapes and bad shapes."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops.nn.adaptive_pool import averaging_matrix
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(9)


def test_arange_lengths_and_errors() -> None:
    assert infer("_arange", {"start": "3"}, []) == ([], [(3,)])
    assert infer("_arange", {"start": "0", "stop": "1", "step": "0.3", "repeat": "2"},
                 [])[1] == [(8,)]
    assert infer("_arange", {"start": "5", "stop": "1"}, [])[1] == [(0,)]
    with pytest.raises(ShapeError, match="step must not be 0"):
        infer("_arange", {"start": "0", "stop": "1", "step": "0"}, [])
    with pytest.raises(ShapeError, match="infer_range without stop"):
        infer("_arange", {"start": "0", "infer_range": "True"}, [])


def test_arange_like_partial_shapes() -> None:
    assert infer("_contrib_arange_like", {}, [(2, 0, 3)])[1] == [(2, 0, 3)]
    assert infer("_contrib_arange_like", {"axis": "-1"}, [(0, 5)])[1] == [(5,)]
    assert infer("_contrib_arange_like", {}, [None])[1] == [None]
    (out,) = run("_contrib_arange_like", {"start": "1", "step": "2"},
                 np.zeros((2, 2), np.float16))
    assert out.dtype == np.float16 and out.tolist() == [[1, 3], [5, 7]]


def test_gather_nd_shapes() -> None:
    assert infer("gather_nd", {}, [(3, 4, 5), (2, 0)])[1] == [(0, 5)]
    with pytest.raises(ShapeError, match=r"indices address 4 dimensions"):
        infer("gather_nd", {}, [(3, 4, 5), (4, 2)])


def test_reshape_like_shapes_and_size_mismatch() -> None:
    assert infer("reshape_like", {"lhs_begin": "1"}, [(0, 6), (2, 3)])[1] == [(0, 2, 3)]
    with pytest.raises(ShapeError, match=r"cannot take shape \(5,\)"):
        infer("reshape_like", {}, [(2, 3), (5,)])
    with pytest.raises(ShapeError, match=r"lhs axes \[3, None\) are out of range"):
        infer("reshape_like", {"lhs_begin": "3"}, [(2, 3), (6,)])


def test_adaptive_pooling_bins_cover_and_overlap() -> None:
    weights = averaging_matrix(5, 3)  # bins [0, 2), [1, 4), [3, 5)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    assert (weights > 0).sum(axis=1).tolist() == [2, 3, 2]
    assert infer("_contrib_AdaptiveAvgPooling2D", {"output_size": "(2, 3)"},
                 [(0, 3, 0, 0)])[1] == [(0, 3, 2, 3)]
    with pytest.raises(ShapeError, match=r"must be 4-D"):
        infer("_contrib_AdaptiveAvgPooling2D", {}, [(3, 4, 4)])
    data = RNG.normal(size=(1, 2, 4, 6)).astype(np.float32)
    (out,) = run("_contrib_AdaptiveAvgPooling2D", {}, data)
    np.testing.assert_allclose(out[..., 0, 0], data.mean(axis=(2, 3)), rtol=1e-5)


def test_attention_shapes_and_errors() -> None:
    assert infer("_contrib_interleaved_matmul_selfatt_qk", {"heads": "2"},
                 [(7, 3, 24)])[1] == [(6, 7, 7)]
    assert infer("_contrib_interleaved_matmul_selfatt_valatt", {"heads": "2"},
                 [(7, 3, 24), None]) == ([(7, 3, 24), (6, 7, 7)], [(7, 3, 8)])
    with pytest.raises(ShapeError, match=r"has 20 features; expected a multiple of heads \* 3"):
        infer("_contrib_interleaved_matmul_selfatt_qk", {"heads": "2"}, [(7, 3, 20)])
    with pytest.raises(ShapeError, match=r"disagree on batch or per-head width"):
        infer("_contrib_interleaved_matmul_encdec_qk", {"heads": "2"},
              [(4, 3, 8), (5, 3, 24)])


def test_selfatt_matches_a_per_head_reference() -> None:
    heads, width = 2, 3
    qkv = RNG.normal(size=(4, 2, heads * 3 * width)).astype(np.float32)
    (scores,) = run("_contrib_interleaved_matmul_selfatt_qk", {"heads": str(heads)}, qkv)
    split = qkv.reshape(4, 2, heads, 3, width)
    for batch in range(2):
        for head in range(heads):
            query, key = split[:, batch, head, 0], split[:, batch, head, 1]
            np.testing.assert_allclose(scores[batch * heads + head],
                                       query @ key.T / np.sqrt(width), rtol=1e-5, atol=1e-6)
