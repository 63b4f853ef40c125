"""What the host CPU offers the reduced-precision kernels, read once per process.

The flags come from ``/proc/cpuinfo`` (Linux names them as ``lscpu`` shows them:
``avx512_bf16``, ``amx_bf16``, ``amx_tile``, ``avx512_vnni``), else from LLVM's view of the
host (its names differ: ``avx512bf16``, ``amx-bf16``), so that a machine without procfs still
answers. AMX's tile registers hold 8 KiB of state that Linux hands out only on request: a
process must ask once with ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` before its
first tile instruction, or the kernel kills it with SIGILL. `amx_permitted` asks (through
libc's ``syscall``, as Python has no binding) and remembers the answer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

SYS_ARCH_PRCTL = 158  # x86-64's syscall number for arch_prctl
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

# Our names (Linux's) and the names LLVM gives the same features.
_LLVM_NAMES = {"avx512f": "avx512f", "avx512_bf16": "avx512bf16", "avx512_vnni": "avx512vnni",
               "amx_tile": "amx-tile", "amx_bf16": "amx-bf16", "amx_int8": "amx-int8"}


@functools.cache
def flags() -> frozenset[str]:
    """The host CPU's feature flags, in Linux's spelling (empty where none can be read)."""
    found = _cpuinfo_flags()
    return found if found is not None else _llvm_flags()


def has(flag: str) -> bool:
    """Whether the host CPU has ``flag`` (Linux's spelling, e.g. ``avx512_bf16``)."""
    return flag in flags()


def bf16_dot_product() -> bool:
    """Whether the CPU runs AVX-512 BF16's ``vdpbf16ps`` (our bf16 GEMM's instruction)."""
    return has("avx512f") and has("avx512_bf16")


@functools.cache
def amx_permitted() -> bool:
    """Whether this process may use AMX tiles: the CPU has them and Linux granted the tile
    state (asked here once; the grant lasts the process's life)."""
    if not (has("amx_tile") and has("amx_bf16")):
        return False
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        answer = libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                              ctypes.c_long(XFEATURE_XTILEDATA))
    except (OSError, AttributeError):
        return False
    return answer == 0


def summary() -> dict[str, bool]:
    """The features the reduced-precision paths look at, by name (logged, and shown in
    benchmarks)."""
    return {name: has(name) for name in _LLVM_NAMES}


def _cpuinfo_flags() -> frozenset[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as file:
            for line in file:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def _llvm_flags() -> frozenset[str]:
    try:
        import llvmlite.binding as llvm

        host = llvm.get_host_cpu_features()
    except (ImportError, RuntimeError):
        return frozenset()
    return frozenset(ours for ours, theirs in _LLVM_NAMES.items() if host.get(theirs))
