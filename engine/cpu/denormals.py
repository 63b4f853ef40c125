"""Denormal floats flushed to zero in the threads that run kernels (x86's FTZ and DAZ).

Why: an x86 core computes with a denormal operand or result (magnitudes below 1.2e-38 in
float32) up to a hundred times slower, through a microcode assist, unless MXCSR's
flush-to-zero (FTZ: denormal results become 0) and denormals-are-zero (DAZ: denormal inputs
read as 0) bits are set. Random bit patterns, as load generators send by default, are full of
them, and so are activations decaying towards zero. Inference runtimes set both bits in their
compute threads; so does the engine, in the threads it starts (the spin pool's workers, the
pools that run a batch's rows or a step's slabs) and, while a CPU plan runs, on the calling
thread (`flushed`), putting the caller's bits back afterwards. The results differ from
IEEE arithmetic only in values below the smallest normal float.

MXCSR is a per-thread register that Python cannot reach, so one tiny native function, built
with llvmlite as the spin pool is (``llvm.x86.sse.stmxcsr`` and ``ldmxcsr``), reads and
writes it. A thread inherits its creator's MXCSR, so numpy's OpenBLAS threads, started when
numpy loads, keep the bits they started with: `blas_threads.restart_flushed` starts them anew
from a flushed thread. Elsewhere than x86 (no MXCSR) every function here does nothing.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

FTZ = 0x8000  # MXCSR bit 15: flush denormal results to zero
DAZ = 0x0040  # MXCSR bit 6: read denormal operands as zero
BOTH = FTZ | DAZ

_state: dict[str, Any] = {}
_lock = threading.Lock()


def available() -> bool:
    """Whether MXCSR can be read and set here (an x86 CPU, llvmlite able to JIT)."""
    return _update() is not None


def mxcsr() -> int | None:
    """This thread's MXCSR now; None where there is none to read."""
    update = _update()
    return None if update is None else update(0, -1)


def flushing_here() -> bool:
    """Whether this thread flushes denormals now (both bits set)."""
    value = mxcsr()
    return value is not None and value & BOTH == BOTH


def flush_here() -> None:
    """Set FTZ and DAZ on this thread for good: for a thread that only runs kernels (a pool's
    worker, at its start)."""
    update = _update()
    if update is not None:
        update(BOTH, -1)


class flushed:  # noqa: N801 - used as a context manager, like a function's result
    """``with flushed():``: FTZ and DAZ set on this thread inside, its own bits put back after
    (a caller's thread runs a plan; its other arithmetic keeps IEEE denormals). A class, not a
    generator: a plan run enters it every time (two native calls, well under a microsecond)."""

    __slots__ = ("_saved",)

    def __init__(self) -> None:
        self._saved: int | None = None

    def __enter__(self) -> None:
        update = _update()
        if update is not None:
            saved = update(BOTH, -1)
            # A thread that flushes already (a compute thread) has nothing to put back.
            self._saved = None if saved & BOTH == BOTH else saved

    def __exit__(self, *exception: object) -> None:
        if self._saved is not None:
            _state["update"](self._saved, 0)
            self._saved = None


def _update() -> Any:
    """``update(set, keep) -> old``: MXCSR becomes ``old & keep | set``, its old value
    returned; None where it cannot be built (compiled on first use)."""
    if "update" not in _state:
        with _lock:
            if "update" not in _state:
                _state["update"] = _compile()
    return _state["update"]


def _compile() -> Any:
    try:
        import llvmlite.binding as llvm
        import llvmlite.ir as ir

        from engine.cpu.llvm_jit import compile_ir
    except ImportError:
        return None
    triple = llvm.get_default_triple()
    if not triple.startswith(("x86_64", "i686", "i386")):
        return None
    try:
        engine = compile_ir(str(_module(ir, triple)))
    except (RuntimeError, OSError):
        return None
    int32 = ctypes.c_int32
    function = ctypes.CFUNCTYPE(int32, int32, int32)(engine.get_function_address("mxcsr_update"))
    _state["engine"] = engine  # owns the machine code: kept as long as the function
    return function


def _module(ir: Any, triple: str) -> Any:
    """``i32 mxcsr_update(i32 set, i32 keep)``: store MXCSR to a stack slot, load the new value
    from another (the intrinsics take a pointer to 32 bits), return the old."""
    int32, byte = ir.IntType(32), ir.IntType(8)
    built = ir.Module(name="hybridserve_mxcsr")
    built.triple = triple
    access = ir.FunctionType(ir.VoidType(), [byte.as_pointer()])
    store = ir.Function(built, access, name="llvm.x86.sse.stmxcsr")
    load = ir.Function(built, access, name="llvm.x86.sse.ldmxcsr")
    function = ir.Function(built, ir.FunctionType(int32, [int32, int32]), name="mxcsr_update")
    set_bits, keep = function.args
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    old_slot, new_slot = builder.alloca(int32), builder.alloca(int32)
    builder.call(store, [builder.bitcast(old_slot, byte.as_pointer())])
    old = builder.load(old_slot)
    builder.store(builder.or_(builder.and_(old, keep), set_bits), new_slot)
    builder.call(load, [builder.bitcast(new_slot, byte.as_pointer())])
    builder.ret(old)
    return built
