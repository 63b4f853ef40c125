"""Cases for BatchNorm variants, linear algebra, cropping, spatial transformers and math ops."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def batchnorm_cases(rng_for: Rng) -> list[Case]:
    """SyncBatchNorm (as exported by GluonCV) and BatchNormWithReLU, with real statistics."""
    rng = rng_for("batchnorm_variants")
    inputs = {"data": _normal(rng, 2, 3, 4, 5), "gamma": rng.uniform(0.5, 1.5, 3).astype("f4"),
              "beta": _normal(rng, 3), "moving_mean": _normal(rng, 3),
              "moving_var": rng.uniform(0.5, 2.0, 3).astype("f4")}
    return [
        Case("sync_bn", "_contrib_SyncBatchNorm", inputs,
             {"fix_gamma": "False", "eps": "1e-5", "key": "syncbatchnorm0", "ndev": "4"}),
        Case("sync_bn_fix_gamma", "_contrib_SyncBatchNorm", inputs, {"key": "k"}),
        Case("bn_with_relu", "_contrib_BatchNormWithReLU", inputs, {"fix_gamma": "False"}),
    ]


def legacy_v1_cases(rng_for: Rng) -> list[Case]:
    """Convolution_v1, Pooling_v1 and BatchNorm_v1, as pre-1.0 exports contain them."""
    rng = rng_for("legacy_v1")
    data = _normal(rng, 2, 4, 7, 6)
    conv = {"data": data, "weight": _normal(rng, 6, 2, 3, 3), "bias": _normal(rng, 6)}
    bn = {"data": data, "gamma": rng.uniform(0.5, 1.5, 4).astype("f4"), "beta": _normal(rng, 4),
          "moving_mean": _normal(rng, 4), "moving_var": rng.uniform(0.5, 2.0, 4).astype("f4")}
    return [
        Case("conv_v1", "Convolution_v1", conv,
             {"kernel": "(3, 3)", "num_filter": "6", "num_group": "2", "pad": "(1, 0)",
              "stride": "(2, 1)"}),
        Case("pool_v1_max_full", "Pooling_v1", {"data": data},
             {"kernel": "(3, 3)", "stride": "(2, 2)", "pooling_convention": "full"}),
        Case("pool_v1_avg_pad", "Pooling_v1", {"data": data},
             {"kernel": "(3, 2)", "pad": "(1, 1)", "pool_type": "avg"}),
        Case("pool_v1_global_sum", "Pooling_v1", {"data": data},
             {"kernel": "(1, 1)", "global_pool": "True", "pool_type": "sum"}),
        Case("bn_v1", "BatchNorm_v1", bn, {"fix_gamma": "False", "eps": "1e-4"}),
    ]


def linalg_cases(rng_for: Rng) -> list[Case]:
    """gemm/gemm2 (transposes, alpha/beta, axis) and the small square-matrix ops."""
    rng = rng_for("linalg")
    a, b, c = _normal(rng, 2, 3, 4), _normal(rng, 2, 4, 5), _normal(rng, 2, 3, 5)
    spd = _normal(rng, 2, 3, 3)
    spd = (spd @ spd.transpose(0, 2, 1) + 3 * np.eye(3, dtype="f4")).astype("f4")
    lower = np.tril(_normal(rng, 2, 3, 3)) + 2 * np.eye(3, dtype="f4")
    tol = {"rtol": 1e-4, "atol": 1e-4}
    return [
        Case("gemm2", "_linalg_gemm2", {"A": a, "B": b}, {"alpha": "0.5"}),
        Case("gemm2_transposed", "linalg_gemm2", {"A": a.transpose(0, 2, 1).copy(),
                                                  "B": b.transpose(0, 2, 1).copy()},
             {"transpose_a": "True", "transpose_b": "True"}),
        Case("gemm2_axis", "_linalg_gemm2", {"A": a.transpose(1, 0, 2).copy(),
                                             "B": b.transpose(1, 0, 2).copy()},
             {"axis": "-3"}),
        Case("gemm", "_linalg_gemm", {"A": a, "B": b, "C": c}, {"alpha": "2", "beta": "-0.5"}),
        Case("linalg_det", "_linalg_det", {"A": spd}, tolerance=tol),
        Case("linalg_inverse", "_linalg_inverse", {"A": spd}, tolerance=tol),
        Case("linalg_slogdet", "_linalg_slogdet", {"A": -spd}, tolerance=tol),
        Case("linalg_potrf", "_linalg_potrf", {"A": spd}, tolerance=tol),
        Case("linalg_potri", "_linalg_potri", {"A": lower}, tolerance=tol),
        Case("linalg_sumlogdiag", "_linalg_sumlogdiag", {"A": spd}),
        Case("linalg_extractdiag", "_linalg_extractdiag", {"A": spd}, {"offset": "1"}),
        Case("linalg_makediag", "_linalg_makediag", {"A": _normal(rng, 2, 3)}, {"offset": "-1"}),
        Case("linalg_syrk", "_linalg_syrk", {"A": a}, {"transpose": "True", "alpha": "0.3"}),
        Case("linalg_trmm", "_linalg_trmm", {"A": lower, "B": _normal(rng, 2, 3, 4)},
             {"alpha": "1.5"}),
        Case("linalg_trmm_right_upper", "_linalg_trmm",
             {"A": lower.transpose(0, 2, 1).copy(), "B": _normal(rng, 2, 4, 3)},
             {"rightside": "True", "lower": "False", "transpose": "True"}),
        Case("linalg_trsm", "_linalg_trsm", {"A": lower, "B": _normal(rng, 2, 3, 4)},
             {"alpha": "2"}, tolerance=tol),
        Case("linalg_trsm_right", "_linalg_trsm", {"A": lower, "B": _normal(rng, 2, 4, 3)},
             {"rightside": "True", "transpose": "True"}, tolerance=tol),
    ]


def crop_and_math_cases(rng_for: Rng) -> list[Case]:
    """Crop, argmax_channel, smooth_l1, degree/radian/rounding maths, cumsum, diag, moments."""
    rng = rng_for("crop_math")
    data = _normal(rng, 2, 3, 7, 8)
    x = (_normal(rng, 3, 4) * 3).astype("f4")
    x[0, :3] = [0.5, -1.5, 2.5]  # halves: rint rounds to even
    return [
        Case("crop_hw_offset", "Crop", {"arg0": data}, {"num_args": "1", "h_w": "(4, 5)",
                                                        "offset": "(1, 2)"}),
        Case("crop_like_center", "Crop", {"arg0": data, "arg1": np.zeros((1, 1, 4, 3), "f4")},
             {"num_args": "2", "center_crop": "True"}),
        Case("argmax_channel", "argmax_channel", {"data": x}),
        Case("smooth_l1", "smooth_l1", {"data": x}, {"scalar": "0.7"}),
        Case("degrees", "degrees", {"data": x}),
        Case("radians", "radians", {"data": x}),
        Case("rint", "rint", {"data": x}),
        Case("rcbrt", "rcbrt", {"data": np.abs(x) + 0.1}),
        Case("npi_degrees", "_npi_degrees", {"x": x}),
        Case("npi_radians", "_npi_radians", {"x": x}),
        Case("npi_rint", "_npi_rint", {"x": x}),
        Case("cumsum_axis", "cumsum", {"a": x}, {"axis": "1"}),
        Case("cumsum_flat", "cumsum", {"a": x}),
        Case("cumsum_dtype", "_np_cumsum", {"a": x}, {"axis": "0", "dtype": "float64"}),
        Case("diag_matrix", "diag", {"data": x}, {"k": "1"}),
        Case("diag_vector", "diag", {"data": x[0]}, {"k": "-1"}),
        Case("diag_axes", "diag", {"data": data}, {"axis1": "2", "axis2": "3", "k": "-2"}),
        Case("moments_axes", "moments", {"data": data}, {"axes": "(0, 2, 3)", "keepdims": "True"}),
        Case("moments_all", "moments", {"data": x}, {"axes": "(0, 1)"}),
    ]


def spatial_cases(rng_for: Rng) -> list[Case]:
    """GridGenerator (affine, warp), BilinearSampler and SpatialTransformer."""
    rng = rng_for("spatial")
    data = _normal(rng, 2, 3, 6, 7)
    theta = np.array([[0.9, 0.1, 0.05, -0.2, 1.1, 0.1], [1.2, 0.0, -0.3, 0.1, 0.8, 0.2]], "f4")
    flow = (_normal(rng, 2, 2, 6, 7) * 1.5).astype("f4")
    grid = rng.uniform(-1.2, 1.2, (2, 2, 4, 5)).astype("f4")  # partly outside the image
    return [
        Case("grid_affine", "GridGenerator", {"data": theta},
             {"transform_type": "affine", "target_shape": "(4, 5)"}),
        Case("grid_warp", "GridGenerator", {"data": flow}, {"transform_type": "warp"}),
        Case("bilinear_sampler", "BilinearSampler", {"data": data, "grid": grid}),
        Case("spatial_transformer", "SpatialTransformer", {"data": data, "loc": theta},
             {"target_shape": "(5, 4)", "transform_type": "affine",
              "sampler_type": "bilinear"}),
    ]


def more_cases(rng_for: Rng) -> list[Case]:
    """Every case of this module."""
    return (batchnorm_cases(rng_for) + legacy_v1_cases(rng_for) + linalg_cases(rng_for)
            + crop_and_math_cases(rng_for) + spatial_cases(rng_for))
