"""Cases for special functions, densities, MXNet's internal helpers and the vision contrib ops.

Written on their own with ``generate_ops.py --only special`` (``ops_special/``). Some of these
ops have no CPU kernel in MXNet 1.9.1 (``_contrib_fft``, ``_contrib_ifft``,
``_contrib_count_sketch``), run only on row-sparse storage (``_square_sum``) or only
imperatively (``_onehot_encode``, ``fill_element_0index``); ``tests/engine/ops`` checks those
against NumPy references instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from casefile import Case

# MXNet 1.9.1's oneDNN build refuses amp_multicast on anything but float32 ("unknown type for
# MKLDNN"); its plain CPU kernel runs them. Read when the first op runs, so setting it here works.
os.environ["MXNET_MKLDNN_ENABLED"] = "0"

Rng = Callable[[str], np.random.Generator]

# Poles, signed zeros, infinities, nan and both sides of the overflow edges of gamma.
GAMMA_EDGES = np.array([-np.inf, -171.5, -30.5, -3.0, -2.5, -1.0, -0.5, -1e-30, -0.0, 0.0,
                        1e-30, 0.5, 1.0, 2.0, 3.5, 34.5, 35.5, 171.5, 172.0, np.inf, np.nan])
ERFINV_EDGES = np.array([-1.5, -1.0, -0.999999, -0.97, -0.5, -1e-8, 0.0, 1e-8, 0.3, 0.97576,
                         0.9999, 0.99999994, 1.0, 2.0, np.nan])


def special_function_cases(rng_for: Rng) -> list[Case]:
    """gamma, gammaln and erfinv over their domains, edges included.

    No float64 cases: a loaded model reads float64 feeds as float32 unless the graph declares
    the input's dtype, and MXNet writes no ``__dtype__`` here. The engine's tests check float64
    against Python's own ``math.lgamma``/``math.gamma`` instead.
    """
    rng = rng_for("special_functions")
    wide = rng.uniform(-8, 40, 120)
    unit = rng.uniform(-1, 1, 60)
    cases = []
    for name in ("gamma", "gammaln"):
        data = np.concatenate([GAMMA_EDGES, wide]).astype("f4")
        cases.append(Case(f"{name}_float32", name, {"data": data}))
        cases.append(Case(f"{name}_float16", name,
                          {"data": rng.uniform(-4, 8, (3, 5)).astype("float16")}))
        cases.append(Case(f"npx_{name}", f"_npx_{name}", {"data": wide[:12].astype("f4")}))
        cases.append(Case(f"{name}_int32", name,
                          {"data": np.array([1, 2, 3, 5, 7, 10], "int32")}))
    cases.append(Case("erfinv_float32", "erfinv",
                      {"data": np.concatenate([ERFINV_EDGES, unit]).astype("f4")}))
    cases.append(Case("erfinv_float16", "erfinv",
                      {"data": rng.uniform(-0.99, 0.99, (2, 6)).astype("float16")},
                      tolerance={"rtol": 1e-2, "atol": 2e-3}))
    cases.append(Case("npx_erfinv", "_npx_erfinv", {"data": unit[:10].astype("f4")}))
    return cases


def _pdf_inputs(rng: np.random.Generator, distribution: str) -> dict[str, np.ndarray]:
    """Samples (2, 3, 4) in the support, and parameters (2, 3) (or (2,) for the 1-D case)."""
    positive = lambda low, high: rng.uniform(low, high, (2, 3)).astype("f4")  # noqa: E731
    shape = (2, 3, 4)
    if distribution == "uniform":
        low = positive(-2, 0)
        return {"sample": rng.uniform(0, 1, shape).astype("f4"), "low": low,
                "high": low + positive(0.5, 3)}
    if distribution == "normal":
        return {"sample": rng.normal(0, 2, shape).astype("f4"), "mu": positive(-1, 1),
                "sigma": positive(0.5, 2)}
    if distribution == "gamma":
        return {"sample": rng.uniform(0.1, 5, shape).astype("f4"), "alpha": positive(0.5, 4),
                "beta": positive(0.5, 2)}
    counts = rng.integers(0, 8, shape).astype("f4")
    if distribution == "exponential":
        return {"sample": rng.uniform(0, 4, shape).astype("f4"), "lam": positive(0.2, 3)}
    if distribution == "poisson":
        return {"sample": counts, "lam": positive(0.5, 6)}
    if distribution == "negative_binomial":
        return {"sample": counts, "k": positive(1, 6), "p": positive(0.2, 0.8)}
    return {"sample": counts, "mu": positive(0.5, 5), "alpha": positive(0.2, 2)}


PDFS = ("uniform", "normal", "gamma", "exponential", "poisson", "negative_binomial",
        "generalized_negative_binomial")


def pdf_cases(rng_for: Rng) -> list[Case]:
    """Every density with and without is_log, under both names; a 1-D dirichlet sample."""
    cases = []
    for distribution in PDFS:
        inputs = _pdf_inputs(rng_for(f"pdf_{distribution}"), distribution)
        for is_log in ("False", "True"):
            cases.append(Case(f"pdf_{distribution}_log{is_log}", f"_random_pdf_{distribution}",
                              inputs, {"is_log": is_log}))
        cases.append(Case(f"pdf_{distribution}_alias", f"random_pdf_{distribution}", inputs))
    rng = rng_for("pdf_dirichlet")
    alpha = rng.uniform(0.5, 3, (2, 4))
    sample = rng.dirichlet(np.ones(4), (2, 5))
    cases += [
        Case("pdf_dirichlet", "_random_pdf_dirichlet",
             {"sample": sample.astype("f4"), "alpha": alpha.astype("f4")}),
        Case("pdf_dirichlet_log", "_random_pdf_dirichlet",
             {"sample": sample.astype("f4"), "alpha": alpha.astype("f4")}, {"is_log": "True"}),
        Case("pdf_dirichlet_vector", "random_pdf_dirichlet",
             {"sample": sample[0, 0].astype("f4"), "alpha": alpha[0].astype("f4")}),
    ]
    return cases


def internal_cases(rng_for: Rng) -> list[Case]:
    """_zeros_without_dtype, amp_multicast's dtype rules and _npx_constraint_check.

    The legacy NDArray functions ``_onehot_encode`` and ``fill_element_0index`` have no
    FCompute: MXNet runs them imperatively only (a graph holding one crashes it).
    """
    wide = np.array([1.2345678, 70000.0, -3.5], "f4")
    return [
        Case("zeros_without_dtype", "_zeros_without_dtype", {},
             {"shape": "(2, 3)", "dtype": "1"}),
        Case("zeros_without_dtype_int", "_zeros_without_dtype", {},
             {"shape": "(4,)", "dtype": "4"}),
        Case("amp_multicast_widest", "amp_multicast",
             {"data_0": wide.astype("f2"), "data_1": wide, "data_2": np.array([1, 2, 3], "int32")},
             {"num_outputs": "3"}),
        Case("amp_multicast_narrow", "amp_multicast",
             {"data_0": wide, "data_1": wide.astype("f2")},
             {"num_outputs": "2", "cast_narrow": "True"}),
        Case("amp_multicast_first_wins", "amp_multicast",
             {"data_0": np.array([3, -2], "int32"), "data_1": np.array([1.5, 2.5], "f2")},
             {"num_outputs": "2"}),
        Case("npx_constraint_check", "_npx_constraint_check",
             {"input": np.ones((2, 3), bool)}, {"msg": "all good"}),
    ]


def deformable_cases(rng_for: Rng) -> list[Case]:
    """DCN v1 and v2: offsets reaching past every border, groups, deformable groups, stride,
    dilation, no bias."""
    rng = rng_for("deformable")
    data = rng.standard_normal((2, 4, 7, 6)).astype("f4")

    def inputs(out_hw: tuple[int, int], groups: int, filters: int, channels: int,
               kernel: tuple[int, int], modulated: bool, bias: bool = True,
               num_group: int = 1) -> dict:
        taps = kernel[0] * kernel[1]
        found = {"data": data[:, :channels],
                 "offset": rng.uniform(-2.5, 2.5, (2, 2 * groups * taps, *out_hw)).astype("f4")}
        if modulated:
            found["mask"] = rng.uniform(0, 1, (2, groups * taps, *out_hw)).astype("f4")
        found["weight"] = rng.standard_normal((filters, channels // num_group, *kernel)).astype(
            "f4")
        if bias:
            found["bias"] = rng.standard_normal(filters).astype("f4")
        return found

    cases = []
    for modulated, op in ((False, "_contrib_DeformableConvolution"),
                          (True, "_contrib_ModulatedDeformableConvolution")):
        tag = "mdconv" if modulated else "dconv"
        cases += [
            Case(f"{tag}_3x3", op, inputs((7, 6), 1, 3, 4, (3, 3), modulated),
                 {"kernel": "(3, 3)", "pad": "(1, 1)", "num_filter": "3"}),
            Case(f"{tag}_groups_stride", op,
                 inputs((4, 3), 2, 4, 4, (3, 2), modulated, num_group=2),
                 {"kernel": "(3, 2)", "stride": "(2, 2)", "pad": "(1, 0)", "num_filter": "4",
                  "num_group": "2", "num_deformable_group": "2"}),
            Case(f"{tag}_dilate_no_bias", op,
                 inputs((5, 3), 4, 4, 4, (2, 2), modulated, bias=False),
                 {"kernel": "(2, 2)", "dilate": "(2, 3)", "num_filter": "4", "no_bias": "True",
                  "num_deformable_group": "4"}),
        ]
    return cases


def psroi_cases(rng_for: Rng) -> list[Case]:
    """PSROIPooling and its deformable variant: ROIs over and past the map, half-pixel corners,
    group and part sizes, several samples per part, with and without trans."""
    rng = rng_for("psroi")
    data = rng.standard_normal((2, 18, 9, 8)).astype("f4")
    rois = np.array([[0, 1, 1, 10, 12], [1, 0, 2.5, 15, 14], [0, -4, -3, 30, 25],
                     [1, 6, 7, 7.5, 8]], "f4")
    trans = rng.uniform(-1, 1, (4, 4, 3, 3)).astype("f4")
    common = {"spatial_scale": "0.5", "output_dim": "2", "pooled_size": "3"}
    deformable = "_contrib_DeformablePSROIPooling"
    return [
        Case("psroi_pooling", "_contrib_PSROIPooling", {"data": data, "rois": rois}, common),
        Case("psroi_pooling_groups", "_contrib_PSROIPooling",
             {"data": data[:, :8], "rois": rois},
             {"spatial_scale": "0.625", "output_dim": "2", "pooled_size": "4",
              "group_size": "2"}),
        Case("dpsroi_no_trans", deformable, {"data": data, "rois": rois},
             {**common, "group_size": "3", "no_trans": "True", "sample_per_part": "2"}),
        Case("dpsroi_trans", deformable, {"data": data, "rois": rois, "trans": trans},
             {**common, "group_size": "3", "trans_std": "0.1", "sample_per_part": "2"}),
        Case("dpsroi_trans_parts", deformable,
             {"data": data, "rois": rois, "trans": trans[:, :2, :2, :2].copy()},
             {**common, "group_size": "3", "part_size": "2", "trans_std": "0.3"}),
    ]


def image_cases(rng_for: Rng) -> list[Case]:
    """im2col/col2im geometries; _image_resize up, down (by fractions and by halves) and
    mixed, every OpenCV method, HWC and NHWC, keep_ratio, uint8 (OpenCV's fixed-point
    rounding: one grey level)."""
    rng = rng_for("image")
    data = rng.standard_normal((2, 3, 7, 6)).astype("f4")
    image = rng.integers(0, 256, (5, 7, 3)).astype("uint8")
    floats = rng.uniform(0, 1, (2, 6, 5, 2)).astype("f4")
    wide = rng.uniform(0, 1, (8, 10, 3)).astype("f4")
    grey = {"rtol": 0.0, "atol": 1.0}
    return [
        Case("im2col_3x3", "im2col", {"data": data}, {"kernel": "(3, 3)", "pad": "(1, 1)"}),
        Case("im2col_strided", "im2col", {"data": data},
             {"kernel": "(2, 3)", "stride": "(2, 1)", "dilate": "(2, 1)", "pad": "(0, 1)"}),
        Case("col2im_3x3", "col2im", {"data": rng.standard_normal((2, 27, 42)).astype("f4")},
             {"output_size": "(7, 6)", "kernel": "(3, 3)", "pad": "(1, 1)"}),
        Case("col2im_strided", "col2im", {"data": rng.standard_normal((2, 18, 18)).astype("f4")},
             {"output_size": "(7, 6)", "kernel": "(2, 3)", "stride": "(2, 1)",
              "dilate": "(2, 1)", "pad": "(0, 1)"}),
        Case("image_resize_up", "_image_resize", {"data": floats[0]}, {"size": "(8, 9)"}),
        Case("image_resize_down_batch", "_image_resize", {"data": floats},
             {"size": "(3, 4)"}),
        Case("image_resize_nearest", "_image_resize", {"data": floats[1]},
             {"size": "(7, 4)", "interp": "0"}),
        Case("image_resize_keep_ratio", "_npx__image_resize", {"data": floats[0]},
             {"size": "4", "keep_ratio": "True"}),
        Case("image_resize_square", "_image_resize", {"data": floats[1]}, {"size": "3"}),
        Case("image_resize_uint8", "_image_resize", {"data": image}, {"size": "(10, 4)"},
             tolerance=grey),
        Case("image_resize_uint8_nearest", "_image_resize", {"data": image},
             {"size": "(4, 8)", "interp": "0"}),
        *(Case(f"image_resize_{name}_{way}", "_image_resize", {"data": source},
               {"size": size, "interp": interp})
          for interp, name in (("2", "cubic"), ("3", "area"), ("4", "lanczos"))
          for way, source, size in (("up", floats[0], "(8, 9)"), ("down", wide, "(4, 3)"),
                                    ("halve", wide, "(5, 4)"), ("mixed", floats[1], "(3, 9)"))),
        Case("image_resize_uint8_cubic", "_image_resize", {"data": image},
             {"size": "(10, 4)", "interp": "2"}, tolerance=grey),
        Case("image_resize_uint8_area", "_image_resize", {"data": image},
             {"size": "(3, 2)", "interp": "3"}, tolerance=grey),
    ]


def matching_cases(rng_for: Rng) -> list[Case]:
    """bipartite_matching both ways, thresholds that stop early, topk (MXNet takes one more
    pair than topk), a leading batch axis; RROIAlign with angles, adaptive and fixed grids."""
    rng = rng_for("matching")
    scores = rng.permutation(60).reshape(2, 5, 6).astype("f4") / 60  # no ties
    data = rng.standard_normal((2, 3, 9, 10)).astype("f4")
    rois = np.array([[0, 8, 9, 10, 6, 30], [1, 12, 6, 7.5, 14, -60], [0, 2, 3, 40, 3, 95],
                     [1, 30, 30, 12, 12, 180], [0, 10, 10, 0.5, 0.2, 10]], "f4")
    matching = "_contrib_bipartite_matching"
    return [
        Case("bipartite_matching", matching, {"data": scores}, {"threshold": "0.1"}),
        Case("bipartite_matching_stops", matching, {"data": scores}, {"threshold": "0.7"}),
        Case("bipartite_matching_ascend", matching, {"data": scores[0]},
             {"threshold": "0.5", "is_ascend": "True"}),
        Case("bipartite_matching_topk", matching, {"data": scores.reshape(2, 1, 5, 6)},
             {"threshold": "0.05", "topk": "2"}),
        Case("rroi_align", "_contrib_RROIAlign", {"data": data, "rois": rois},
             {"pooled_size": "(2, 3)", "spatial_scale": "0.5"}),
        Case("rroi_align_ratio", "_contrib_RROIAlign", {"data": data, "rois": rois},
             {"pooled_size": "(3, 3)", "spatial_scale": "0.25", "sampling_ratio": "2"}),
    ]


def special_cases(rng_for: Rng) -> list[Case]:
    """Every family of this set."""
    return [*special_function_cases(rng_for), *pdf_cases(rng_for), *internal_cases(rng_for),
            *deformable_cases(rng_for), *psroi_cases(rng_for), *image_cases(rng_for),
            *matching_cases(rng_for)]
