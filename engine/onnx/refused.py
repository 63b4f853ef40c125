"""Ops the exporter refuses on purpose, each with the reason ONNX cannot express it faithfully.

`export` names the node, the op and this reason instead of writing a model whose outputs
would differ from MXNet's. docs/onnx.md lists the same table.
"""

from __future__ import annotations

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
    "_fused_elementwise": "made by this engine's fusion pass, which export does not run",
}
