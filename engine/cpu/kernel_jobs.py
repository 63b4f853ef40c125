"""Compiled kernels run as `spin_pool` jobs: each part a range of the kernel's outer loop.

A kernel here is a numba function whose last two arguments are ``first, last``, the range of
its outer loop it computes (planes, channels, filters), whose ranges are independent. `bind`
gives a `spin_pool.Job` of it over bound arguments: a native ``task(context, part, parts)``
generated for the arguments' kinds (numba ``cfunc``, compiled once per kernel and kinds) reads
them back from the context (arrays as address and shape, C-contiguous; integers; floats) and
calls the kernel on part ``part``'s share of the range. An array may be scratch of its own per
part (``per_part``): bound with a leading axis of one slice per part.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import cache, compiled, spin_pool

# Elements (of the arrays a kernel reads and writes) per part at least: about 2 µs of a pass.
PART_ELEMENTS = 4096

_tasks: dict[tuple[Any, ...], int] = {}


def parts_for(total: int, elements: int) -> int:
    """Parts to cut a range of ``total`` into, for ``elements`` of work: at most
    `spin_pool.PARTS_PER_CORE` per core, none under `PART_ELEMENTS`."""
    return max(1, min(total, spin_pool.PARTS_PER_CORE * spin_pool.cores(),
                      elements // PART_ELEMENTS))


def bind(kernel: tuple[str, str], args: tuple[Any, ...], total: int, parts: int,
         per_part: frozenset[int] = frozenset()) -> spin_pool.Job | None:
    """``kernel(*args, first, last)`` over ``range(total)`` in ``parts`` parts, as a job;
    ``kernel`` is named by (module, name): ``module.compiled_kernels()[name]``, a numba
    function. The arrays at positions ``per_part`` hold one slice per part on their first
    axis. None where an argument cannot be passed (an array not C-contiguous, a dtype numba
    lacks)."""
    kinds = tuple(_kind(value, index in per_part) for index, value in enumerate(args))
    if None in kinds or not spin_pool.available():
        return None
    context: list[int] = []
    for value, kind in zip(args, kinds, strict=True):
        if kind[0] == "array":
            context += [value.ctypes.data, *value.shape]
        elif kind[0] == "int":
            context.append(int(value))
        else:
            context.append(int(np.float64(value).view(np.int64)))
    context.append(total)
    task = _task(kernel, kinds)
    return spin_pool.job(task, np.array(context, np.int64), parts, keep=tuple(
        value for value in args if isinstance(value, np.ndarray)))


def _kind(value: Any, per_part: bool) -> tuple[Any, ...] | None:
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous or value.dtype.kind not in "fiub" or not value.ndim:
            return None
        return ("array", value.dtype.str, value.ndim, per_part)
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return ("int",)
    if isinstance(value, (float, np.floating)):
        return ("float", np.dtype(type(value)).str)
    return None


def _task(kernel: tuple[str, str], kinds: tuple[Any, ...]) -> int:
    return compiled.made_once(_tasks, (kernel, kinds), partial(_compile, kernel, kinds))


def _compile(kernel: tuple[str, str], kinds: tuple[Any, ...]) -> int:
    """The address of the task generated for ``kernel`` and these arguments' kinds.

    Its source reads each argument from the context in order (see `bind`), then calls the
    kernel on the part's range. Compiling it takes numba about half a second, so the source is
    written to a file (`_source_file`) and compiled with numba's disk cache: the next process
    loads it. The file's name is the hash of its text, which carries the hash of the kernel's
    module too, so an edited kernel gets a new file (numba's cache alone would keep serving a
    task with the old kernel inlined). Where the cache directory cannot be written, it is
    compiled in each process."""
    import importlib.util

    path = _source_file(_source(kernel, kinds, on_disk=True))
    if path is None:
        namespace: dict[str, Any] = {}
        exec(compile(_source(kernel, kinds, on_disk=False), f"<kernel job for {kernel}>",
                     "exec"), namespace)
        return namespace["task"].address
    name = "engine_kernel_" + os.path.basename(path)[:-3]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        # Importable by name while it runs: numba's cache, loading, imports it again.
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module.task.address


def _source(kernel: tuple[str, str], kinds: tuple[Any, ...], on_disk: bool) -> str:
    module_name, kernel_name = kernel
    lines, names, slot = [], [], 0
    for index, kind in enumerate(kinds):
        name = f"a{index}"
        if kind[0] == "array":
            _, dtype, ndim, per_part = kind
            shape = ", ".join(f"v[{slot + 1 + axis}]" for axis in range(ndim))
            view = f"carray(pointer(v[{slot}], np.dtype('{dtype}').type), ({shape},))"
            lines.append(f"    {name} = {view}" + ("[part]" if per_part else ""))
            slot += 1 + ndim
        elif kind[0] == "int":
            lines.append(f"    {name} = v[{slot}]")
            slot += 1
        else:
            lines.append(f"    {name} = np.dtype('{kind[1]}').type(floats[{slot}])")
            slot += 1
        names.append(name)
    return "\n".join([
        f'"""A spin pool job\'s task for {module_name}\'s {kernel_name!r}, made by',
        f'engine.cpu.kernel_jobs (kernel module {_module_hash(module_name)}). Generated."""',
        "import numpy as np",
        "from numba import carray, cfunc, types",
        "from numba.extending import intrinsic",
        f"from {module_name} import compiled_kernels",
        "",
        f"kernel = compiled_kernels()[{kernel_name!r}]",
        "",
        "",
        "@intrinsic",
        "def pointer(typingctx, address, dtype):",
        "    target = types.CPointer(dtype.instance_type)",
        "",
        "    def codegen(context, builder, signature, args):",
        "        return builder.inttoptr(args[0], context.get_value_type(target))",
        "",
        "    return target(types.int64, dtype), codegen",
        "",
        "",
        "@cfunc(types.void(types.CPointer(types.int64), types.int64, types.int64),",
        f"       cache={on_disk})",
        "def task(context, part, parts):",
        f"    v = carray(context, {slot + 1})",
        "    floats = v.view(np.float64)",
        *lines,
        f"    total = v[{slot}]",
        f"    kernel({', '.join(names)}, part * total // parts, (part + 1) * total // parts)",
        "",
    ])


def _module_hash(module_name: str) -> str:
    import importlib

    module = importlib.import_module(module_name)
    with open(module.__file__, "rb") as file:
        return hashlib.sha1(file.read()).hexdigest()[:16]


def _source_file(source: str) -> str | None:
    """The path of a file holding ``source`` with numba's cache on, under the cache directory
    (`cache.folder`); None where it cannot be written."""
    folder = cache.folder("kernel_jobs")
    if folder is None or not cache.point_numba_here():
        return None
    digest = hashlib.sha1(source.encode()).hexdigest()[:20]
    path = os.path.join(folder, f"job_{digest}.py")
    if os.path.exists(path):
        return path
    try:
        partial_path = f"{path}.{os.getpid()}.{threading.get_ident()}"
        with open(partial_path, "w", encoding="utf-8") as file:
            file.write(source)
        os.replace(partial_path, path)  # whole or absent, for processes racing here
    except OSError:
        return None
    return path
