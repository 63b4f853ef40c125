"""Ops the exporter refuses on purpose, each with the reason ONNX cannot express it faithfully.

`export` names the node, the op and this reason instead of writing a model whose outputs
would differ from MXNet's. docs/onnx.md lists the same table.
"""

from __future__ import annotations

from engine.ops.internal.fused import FUSED_ELEMENTWISE
from engine.ops.quantized import QUANTIZED_OPS

_NO_FACTORISATION = "ONNX has no matrix inverse, factorisation or triangular-solve op"
_SIGN = "copysign copies the sign bit of a NaN, which no ONNX op can read"
_ATAN2 = ("ONNX has no Atan2; a composed Atan form loses MXNet's quadrant and signed-zero "
          "results")
_CBRT = "ONNX has no cube root; Pow(x, 1/3) is NaN for negative x"
_PRECISION = ("ONNX has no such op, and a composed form would lose MXNet's precision "
              "(overflow in hypot, cancellation near 0 in log1p and expm1)")

REFUSED: dict[str, str] = {
    **dict.fromkeys(("_hypot", "_hypot_scalar", "broadcast_hypot", "_npi_hypot_scalar", "log1p",
                     "expm1"), _PRECISION),
    **dict.fromkeys(("cbrt", "rcbrt"), _CBRT),
    **dict.fromkeys(("_linalg_inverse", "_linalg_potrf", "_linalg_potri", "_linalg_trsm",
                     "_npi_cholesky", "_npi_solve"), _NO_FACTORISATION),
    **dict.fromkeys(("_linalg_gelqf", "_linalg_syevd", "_npi_eig", "_npi_eigh", "_npi_eigvals",
                     "_npi_eigvalsh", "_npi_svd", "_npi_pinv", "_npi_pinv_scalar_rcond",
                     "_npi_tensorinv", "_npi_tensorsolve"), _NO_FACTORISATION),
    "_npi_norm": "its spectral and nuclear orders need an SVD, which ONNX lacks; not mapped",
    **dict.fromkeys(("_npi_average", "_npi_percentile", "_histogram", "_npi_ediff1d",
                     "_npi_diag_indices_from", "_npi_pad", "_npi_insert_scalar",
                     "_npi_insert_slice", "_npi_insert_tensor"),
                    "NumPy-mode array utility not mapped to ONNX yet"),
    "_npi_powerd": "samples MXNet's power distribution; ONNX random ops cannot reproduce it",
    "_linalg_slogdet": ("ONNX Det over- and underflows where MXNet's LU-based log-determinant "
                        "does not"),
    **dict.fromkeys(("_npi_copysign", "_npi_copysign_scalar", "_npi_rcopysign_scalar"), _SIGN),
    **dict.fromkeys(("_npi_arctan2", "_npi_arctan2_scalar", "_npi_rarctan2_scalar"), _ATAN2),
    **dict.fromkeys(("_npi_lcm", "_npi_lcm_scalar"),
                    "ONNX has no integer gcd; not mapped (it would need a Euclid Loop)"),
    **dict.fromkeys(("_foreach", "_while_loop", "_cond"),
                    "control flow with subgraphs; converting it to ONNX Loop/If is not "
                    "implemented"),
    FUSED_ELEMENTWISE.name: "made by this engine's fusion pass, which export does not run",
    "_npi_bincount": ("ONNX has no bincount; a scatter-add needs the bin count (the data's "
                      "largest value) as a shape, known only at run time"),
    "_npi_delete": "not mapped (a Compress over a mask scattered from obj is not implemented)",
    **dict.fromkeys(("gamma", "gammaln", "erfinv"),
                    "ONNX has no gamma, log-gamma or inverse error function"),
    **dict.fromkeys([f"_random_pdf_{name}" for name in (
        "dirichlet", "exponential", "gamma", "generalized_negative_binomial",
        "negative_binomial", "normal", "poisson", "uniform")],
        "the densities are not mapped (most need log-gamma, which ONNX lacks)"),
    **dict.fromkeys(("_contrib_PSROIPooling", "_contrib_DeformablePSROIPooling",
                     "_contrib_RROIAlign", "_contrib_DeformableConvolution",
                     "_contrib_ModulatedDeformableConvolution"),
                    "ONNX (opset 17) has no position-sensitive, rotated or deformable ROI and "
                    "convolution ops"),
    **dict.fromkeys(("im2col", "col2im", "_contrib_fft", "_contrib_ifft",
                     "_contrib_count_sketch", "_image_resize", "amp_multicast", "_square_sum",
                     "_onehot_encode", "fill_element_0index"),
                    "not mapped to ONNX yet"),
    "_contrib_bipartite_matching": "a greedy matching step by step; an ONNX Loop for it is not "
                                   "implemented",
    "_npx_constraint_check": "raises an error that depends on the data; ONNX has no assertion",
    "CTCLoss": ("its alpha recursion runs over the time frames; an ONNX Loop for it is not "
                "implemented"),
    "_npi_boolean_mask_assign_tensor": ("not mapped (the running count of the mask that picks "
                                        "each element's value row is not implemented)"),
    **dict.fromkeys(QUANTIZED_OPS,
                    "MXNet's int8 ops (its scales, rounding and fused oneDNN subgraphs) are not "
                    "mapped to ONNX's QLinear ops"),
}
