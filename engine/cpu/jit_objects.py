"""Machine code the LLVM JIT compiled for this host, kept on disk for the next process.

Compiling the IR kernels is most of a model's load: ResNet-18's int8 kernels took about 1 s of
LLVM passes and 1 s of code generation, its fp32 ones 1.2 s and 1.9 s, where parsing their IR
took under 0.1 s. `llvm_jit.compile_ir` asks here first: an object found is handed to MCJIT
through its object cache, which links it in place of generating code, and the module's passes
are skipped.

An object is filed under a digest of everything its code depends on: the IR text, the target
(triple, CPU name, feature string), the optimisation level, whether the passes ran, and the
llvmlite and LLVM versions. A host with other features, or another LLVM, looks for another
file. Files are written whole (to a temporary name, then renamed), so that processes racing to
store the same object never read half of one; where the directory cannot be written, every
process compiles. They live in the cache directory (`engine.cpu.cache`), beside numba's
compiled functions: as with those, whoever may write that directory may change the code the
process runs, so it is the process owner's own (the images keep it under ``/tmp``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from engine.cpu import cache

FOLDER = "llvm_objects"


def path_for(parts: tuple[object, ...], text: str) -> Path | None:
    """Where the object of ``text`` compiled under ``parts`` (target, level, versions) is
    kept; None where the cache directory cannot be written."""
    folder = cache.folder(FOLDER)
    if folder is None:
        return None
    digest = hashlib.sha256(repr(parts).encode())
    digest.update(text.encode())
    return folder / f"{digest.hexdigest()[:32]}.o"


def load(path: Path) -> bytes | None:
    """The object kept at ``path``; None where there is none (or it cannot be read)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data or None


def store(path: Path, data: bytes) -> None:
    """Keep ``data`` at ``path``, whole or not at all."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)
