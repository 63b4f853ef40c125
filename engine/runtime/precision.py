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
log; so does a host where our int8 kernels cannot run (`int8_conv.supported_here`: neither
AVX2 nor AVX-512 VNNI, no JIT or no numba) for a float32 model asked to run in int8, whose int8
layers would run on the NumPy path, in float64, several times slower than float32 (ResNet-18
at batch 1, one thread on AMD Zen 3 with that path forced: 270–340 against 43–55 ms). An int8
export (MXNet's quantized operators) has no float32 to fall back to: it runs on that path
there. TF32 is no
precision here but the GPU device's switch for fp32 products (``get_device("gpu", tf32=True)``).
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


def resolve(precision: object, device_kind: str, *, int8_export: bool = False) -> str:
    """The precision a model asking for ``precision`` runs in on ``device_kind`` ("cpu" or
    "gpu"): itself, or ``fp32`` (logged once) for bf16 on a CPU without AVX-512 BF16 and for
    int8 on one without our int8 kernels. ``int8_export``: the graph is an int8 export already
    (MXNet's quantized operators), so int8 is what it runs on any host: it has no float32
    layers to fall back to, and its int8 layers run on the NumPy path where our kernels are
    missing.

    Raises:
        ValueError: ``precision`` names no precision, or one this device has no path for.
    """
    name = check_name(precision)
    if name not in _RUNS_ON[device_kind]:
        raise ValueError(f"precision {name!r} is not available on the {device_kind.upper()} "
                         f"(it runs {', '.join(_RUNS_ON[device_kind])})")
    if device_kind == "gpu":  # the host CPU's features do not matter there
        return name
    missing = None if name == "int8" and int8_export else fp32_because(name)
    if missing is not None:
        if name not in _warned:
            _warned.add(name)
            log.warning("precision %s asked for, but %s: running in fp32", name, missing)
        return "fp32"
    if name == "bf16" and "bf16 kernels" not in _warned:
        _warned.add("bf16 kernels")
        # Asking for AMX's tile state here, at the first bf16 load, not at a first product.
        log.info("precision bf16: products on %s", "AMX tiles" if host_features.amx_permitted()
                 else "AVX-512 BF16 (no AMX, or Linux refused its tile state)")
    return name


def fp32_because(precision: str) -> str | None:
    """Why a float32 model asking for ``precision`` runs in fp32 on this CPU, in a few words
    (the log line's and the load-time check's); None where the CPU runs it."""
    if precision == "bf16" and not host_features.bf16_dot_product():
        return "this CPU lacks AVX-512 BF16"
    if precision == "int8" and not int8_kernels_here():
        return f"our int8 kernels cannot run on this CPU ({_int8_missing()})"
    return None


def int8_kernels_here() -> bool:
    """Whether our int8 kernels run on this host (`int8_conv.supported_here`; compiled on the
    first call)."""
    from engine.kernels import int8_conv

    return int8_conv.supported_here()


def _int8_missing() -> str:
    """What keeps the int8 kernels from this host, in a few words."""
    from engine.cpu import compiled, spin_pool
    from engine.kernels import gemm_int8

    if not (host_features.has("avx2") or host_features.has("avx512_vnni")):
        gemm = "AVX2 or AVX-512 VNNI"
    else:
        gemm = "the int8 GEMM's JIT (llvmlite)"
    missing = [what for what, present in (("numba", compiled.available()),
                                           ("the spin pool", spin_pool.available()),
                                           (gemm, gemm_int8.available())) if not present]
    return ", ".join(missing) or "none missing"
