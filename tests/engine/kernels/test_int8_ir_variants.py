"""The int8 path's LLVM IR kernels in their two variants: the AVX-512 one, which only an
AVX-512 host runs, still compiles for such a CPU; the generic one names no x86 intrinsic and
compiles for an AVX2 CPU; and a module built for the host takes the variant its features
call for. (Their results against NumPy are their own tests', on whichever variant the host
runs.)"""

from __future__ import annotations

import pytest

from engine.cpu import host_features, llvm_jit
from engine.kernels import depthwise_int8_ir, int8_affine_ir, int8_convert_ir

llvmlite = pytest.importorskip("llvmlite.binding")

MODULES = [int8_affine_ir, int8_convert_ir, depthwise_int8_ir]
AVX512_FEATURES = "+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx2,+fma"
AVX2_FEATURES = "+avx2,+fma,-avx512f"


def _compiles(text: str, cpu: str, features: str) -> bool:
    """Whether ``text`` compiles to machine code for ``cpu`` (nothing of it is run)."""
    try:
        llvm_jit.compile_ir(text, cpu, features, level=2)
    except (RuntimeError, OSError):
        return False
    return True


@pytest.mark.parametrize("kernel", MODULES, ids=lambda kernel: kernel.__name__)
def test_the_avx512_variant_compiles_for_an_avx512_cpu(kernel):
    assert _compiles(str(kernel.module(avx512=True)), "skylake-avx512", AVX512_FEATURES)


@pytest.mark.parametrize("kernel", MODULES, ids=lambda kernel: kernel.__name__)
def test_the_generic_variant_names_no_x86_intrinsic_and_compiles_for_avx2(kernel):
    text = str(kernel.module(avx512=False))
    assert "llvm.x86" not in text
    assert _compiles(text, "haswell", AVX2_FEATURES)


@pytest.mark.parametrize("kernel", MODULES, ids=lambda kernel: kernel.__name__)
@pytest.mark.parametrize("has_avx512bw", [True, False])
def test_the_host_module_takes_the_variant_of_the_hosts_features(monkeypatch, kernel,
                                                                 has_avx512bw):
    monkeypatch.setattr(host_features, "has", lambda flag: has_avx512bw and flag == "avx512bw")
    assert str(kernel.module()) == str(kernel.module(avx512=has_avx512bw))
    assert str(kernel.module(avx512=True)) != str(kernel.module(avx512=False))


# sha-256 of the AVX-512 depthwise module's IR: the generic variant sums its products in
# chains of its own (`depthwise_int8_ir.GENERIC_CHAINS`), and leaves this build unchanged
DEPTHWISE_AVX512_IR = "82cdc5adcb8d52c10f33623eb01fecec90f4ab3cdc1eb50842252ad11171c45c"


def test_the_depthwise_avx512_variant_is_unchanged():
    import hashlib

    text = str(depthwise_int8_ir.module(avx512=True))
    assert hashlib.sha256(text.encode()).hexdigest() == DEPTHWISE_AVX512_IR


# sha-256 of the VNNI GEMM's modules (each `gemm_int8.TILES` tile and its one-row tile) and
# the AMX one's, each with its task: the AVX2 tiles' tasks finish a short last row block on
# the one-row tile (`gemm_int8_ir.define_task`'s ``edge``), and leave these builds unchanged
VNNI_AMX_GEMM_IR = "81c801ba51070349f056e365c227922f8d5cc658f0ccba1475101fc45d72a713"


def test_the_vnni_and_amx_gemm_tasks_are_unchanged():
    import hashlib

    from engine.kernels.gemm_int8 import TILES
    from engine.kernels.gemm_int8_amx_ir import AmxInt8Kernel
    from engine.kernels.gemm_int8_ir import Int8Kernel, define_task

    text = ""
    for vectors, rows in TILES:
        for tile_rows in (rows, 1):
            kernel = Int8Kernel(tile_rows, vectors)
            define_task(kernel.module, kernel.define("panels"), tile_rows)
            text += str(kernel.module)
    amx = AmxInt8Kernel()
    define_task(amx.module, amx.define("panels"), amx.rows)
    text += str(amx.module)
    assert hashlib.sha256(text.encode()).hexdigest() == VNNI_AMX_GEMM_IR
