"""Linear algebra, NumPy-mode, spatial, Crop and legacy ops: partial shapes and bad shapes."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(3)


def test_gemm2_shapes_with_transposes_and_unknown_batch() -> None:
    assert infer("_linalg_gemm2", {}, [(0, 3, 4), (0, 4, 5)])[1] == [(0, 3, 5)]
    assert infer("_linalg_gemm2", {"transpose_a": "True"}, [(2, 4, 3), (2, 4, 5)])[1] == [
        (2, 3, 5)]
    with pytest.raises(ShapeError, match=r"do not multiply \(inner sizes 4 and 6\)"):
        infer("_linalg_gemm2", {}, [(2, 3, 4), (2, 6, 5)])


def test_square_matrix_ops_refuse_rectangles() -> None:
    assert infer("_linalg_det", {}, [(5, 0, 0)])[1] == [(5,)]
    with pytest.raises(ShapeError, match=r"square matrices; got \(2, 3, 4\)"):
        infer("_linalg_inverse", {}, [(2, 3, 4)])


def test_trsm_inverts_trmm() -> None:
    lower = np.tril(RNG.normal(size=(2, 3, 3))).astype(np.float64) + 3 * np.eye(3)
    b = RNG.normal(size=(2, 3, 4))
    for attrs in ({}, {"transpose": "True"}, {"lower": "False", "transpose": "True"}):
        (product,) = run("_linalg_trmm", {**attrs, "alpha": "2"}, lower, b)
        (solved,) = run("_linalg_trsm", {**attrs, "alpha": "0.5"}, lower, product)
        np.testing.assert_allclose(solved, b, rtol=1e-10, atol=1e-10)


def test_numpy_mode_shapes() -> None:
    assert infer("_np_transpose", {}, [(2, 0, 4)])[1] == [(4, 0, 2)]
    assert infer("_np_any", {}, [(2, 3)])[1] == [()]
    assert infer("_np_all", {"axis": "(0,)", "keepdims": "True"}, [(2, 3)])[1] == [(1, 3)]
    assert infer("_npi_concatenate", {"num_args": "2", "axis": "1"},
                 [(2, 0), (2, 3)])[1] == [None]  # an unknown width leaves the join unknown
    assert infer("_npi_vstack", {"num_args": "2"}, [(3,), (3,)])[1] == [(2, 3)]
    with pytest.raises(ShapeError, match=r"axis 0 has size 2, not 1"):
        infer("_np_squeeze", {"axis": "0"}, [(2, 1)])
    with pytest.raises(ValueError, match="broadcast"):
        infer("_npi_broadcast_to", {"shape": "(4, 3)"}, [(2, 3)])


def test_where_scalar_forms_pick_the_right_branch() -> None:
    condition = np.array([1.0, 0.0], np.float32)
    values = np.array([5.0, 6.0], np.float32)
    assert run("_npi_where_lscalar", {"scalar": "9"}, condition, values)[0].tolist() == [9, 6]
    assert run("_npi_where_rscalar", {"scalar": "9"}, condition, values)[0].tolist() == [5, 9]


def test_spatial_and_crop_shapes() -> None:
    assert infer("GridGenerator", {"transform_type": "affine", "target_shape": "(3, 4)"},
                 [(0, 6)])[1] == [(0, 2, 3, 4)]
    with pytest.raises(ShapeError, match=r"data must be \(N, 6\)"):
        infer("GridGenerator", {"transform_type": "affine", "target_shape": "(3, 4)"}, [(2, 4)])
    assert infer("BilinearSampler", {}, [(2, 3, 8, 8), (2, 2, 4, 5)])[1] == [(2, 3, 4, 5)]
    assert infer("Crop", {"num_args": "2"}, [(1, 3, 8, 8), None])[1] == [None]
    with pytest.raises(ShapeError, match=r"a 5x5 window at \(4, 0\) does not fit"):
        infer("Crop", {"num_args": "1", "h_w": "(5, 5)", "offset": "(4, 0)"}, [(1, 3, 8, 8)])


def test_identity_affine_grid_samples_the_image_back() -> None:
    data = RNG.normal(size=(1, 2, 5, 6)).astype(np.float32)
    theta = np.array([[1, 0, 0, 0, 1, 0]], np.float32)
    (out,) = run("SpatialTransformer", {"target_shape": "(5, 6)", "transform_type": "affine",
                                        "sampler_type": "bilinear"}, data, theta)
    np.testing.assert_allclose(out, data, rtol=1e-5, atol=1e-5)


def test_legacy_and_sync_batchnorm_count_mxnets_outputs() -> None:
    for name, attrs, total in (("BatchNorm_v1", {}, 3), ("_contrib_SyncBatchNorm",
                                                         {"key": "k"}, 3),
                               ("_contrib_BatchNormWithReLU", {}, 4),
                               ("Pooling_v1", {"kernel": "(2, 2)"}, 1)):
        op = get_op(name)
        assert op.num_total_outputs(op.parse_attrs(attrs)) == total, name
    assert infer("BatchNorm_v1", {}, [(2, 3, 4), None, None, None, None])[0][1] == (3,)


def test_correlation_centre_channel_is_the_mean_product() -> None:
    first = RNG.normal(size=(1, 2, 5, 6)).astype(np.float32)
    second = RNG.normal(size=(1, 2, 5, 6)).astype(np.float32)
    attrs = {"kernel_size": "1", "max_displacement": "1", "pad_size": "1"}
    (out,) = run("Correlation", attrs, first, second)
    assert out.shape == (1, 9, 5, 6)
    np.testing.assert_allclose(out[0, 4], (first * second).mean(axis=1)[0], rtol=1e-5)
    with pytest.raises(ShapeError, match="too small for max_displacement 4"):
        infer("Correlation", {"max_displacement": "4"}, [(1, 2, 5, 6), None])


def test_split_shapes_and_uneven_sections() -> None:
    attrs = {"indices": "(0, 2)", "axis": "1"}
    assert infer("_split_v2", attrs, [(3, 5)])[1] == [(3, 2), (3, 3)]
    assert infer("_split_v2", attrs, [(0, 5)])[1] == [None, None]
    with pytest.raises(ShapeError, match="an axis of 5 does not split into 2 equal sections"):
        infer("_split_v2", {"indices": "()", "sections": "2", "axis": "1"}, [(3, 5)])
    pieces = run("_npi_hsplit", {"indices": "()", "sections": "2"}, np.arange(4.0))
    assert [piece.tolist() for piece in pieces] == [[0.0, 1.0], [2.0, 3.0]]
