"""A model's precision: the number format its matrix products compute in.

``fp32`` (the default) computes everything in float32. ``bf16`` runs the Dense
(FullyConnected) and Convolution products with their operands rounded to bf16 and float32
sums; everything else (depthwise convolutions, pooling, normalisation, elementwise chains, the
outputs) stays float32. On the CPU the weights are rounded once when a plan binds
(`engine.kernels.bf16`), and the products run on AMX tiles where the process may use them,
else on AVX-512 BF16. ``fp16`` runs on a GPU only: the whole plan in half precision between
float32 inputs and outputs, products and reductions accumulating in float32
(`engine.cuda.half`, docs/gpu.md); bf16 on a GPU has the CPU's meaning, its products on
cuBLAS and cuDNN (`engine.cuda.bf16`). ``int8`` runs on the CPU only: the Convolution and
FullyConnected layers quantized after calibration (`engine.quantize`, `engine.runtime.int8`).
A host without AVX-512 BF16 runs a bf16 model in float32 on the CPU, and says so once in the
log. TF32 is no precision here but the GPU device's switch for fp32 products
(``get_device("gpu", tf32=True)``).
"""

from __future__ import annotations

import logging

from engine.cpu import host_features

PRECISIONS = ("fp32", "bf16", "int8", "fp16")
_RUNS_ON = {"cpu": ("fp32", "bf16", "int8"), "gpu": ("fp32", "bf16", "fp16")}

log = logging.getLogger("engine.precision")
_warned: set[str] = set()


def check_name(precision: object) -> str:
    """``precision`` when it is one of `PRECISIONS`; else ValueError naming them."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return str(precision)


def resolve(precision: object, device_kind: str) -> str:
    """The precision a model asking for ``precision`` runs in on ``device_kind`` ("cpu" or
    "gpu"): itself, or ``fp32`` for bf16 on a CPU without AVX-512 BF16 (logged once).

    Raises:
        ValueError: ``precision`` names no precision, or one this device has no path for.
    """
    name = check_name(precision)
    if name not in _RUNS_ON[device_kind]:
        raise ValueError(f"precision {name!r} is not available on the {device_kind.upper()} "
                         f"(it runs {', '.join(_RUNS_ON[device_kind])})")
    if device_kind == "gpu":  # the host CPU's features do not matter there
        return name
    if name == "bf16" and not host_features.bf16_dot_product():
        if name not in _warned:
            _warned.add(name)
            log.warning("precision bf16 asked for, but this CPU lacks AVX-512 BF16: running "
                        "in fp32")
        return "fp32"
    if name == "bf16" and "bf16 kernels" not in _warned:
        _warned.add("bf16 kernels")
        # Asking for AMX's tile state here, at the first bf16 load, not at a first product.
        log.info("precision bf16: products on %s", "AMX tiles" if host_features.amx_permitted()
                 else "AVX-512 BF16 (no AMX, or Linux refused its tile state)")
    return name
