"""LLVM IR built with `llvmlite.ir`, compiled to machine code in this process (MCJIT).

The GEMM kernels (`gemm_kernel`) and the spin pool's loops (`spin_pool`) are written as IR
because numba cannot be made to emit them (a register tile, atomics); llvmlite is numba's own
compiler, so this adds no dependency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.cpu import compiled


def compile_ir(text: str, cpu: str = "", features: str = "", level: int = 2,
               optimise: bool = False) -> Any:
    """An execution engine holding ``text`` compiled for ``cpu`` with ``features`` (the host's
    defaults where empty) at optimisation ``level``; with ``optimise``, the module's passes run
    first (the IR's own loops unrolled and vectorised). The engine owns the machine code: keep
    it as long as its functions. Raises RuntimeError or OSError where there is no JIT for this
    target, ImportError without llvmlite."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=cpu, features=features, opt=level)
    module = llvm.parse_assembly(text)
    module.verify()
    if optimise:
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(level))
        builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return engine


def compile_for_host(build: Callable[[], Any], optimise: bool = True) -> Any:
    """An execution engine holding the module ``build()`` makes (it imports llvmlite's IR
    itself), compiled for the host CPU and its features at level 3, the module's passes run
    first with ``optimise``; None where llvmlite or its JIT is missing. The engine owns the
    machine code: keep it as long as its functions."""
    try:
        import llvmlite.binding as llvm

        text = str(build())
    except ImportError:
        return None
    try:
        llvm.initialize_native_target()
        return compile_ir(text, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                          level=3, optimise=optimise)
    except (RuntimeError, OSError):
        return None


def compile_variants(builds: dict[Any, Callable[[], Any]], name: str) -> dict[Any, Any] | None:
    """Each module ``builds[key]()`` makes compiled for the host (`compile_for_host`), and the
    address of its function ``name`` by ``key``, beside ``"engines"``: the engines, which own
    the machine code; None where any cannot compile."""
    built: dict[Any, Any] = {"engines": []}
    for key, build in builds.items():
        engine = compile_for_host(build)
        if engine is None:
            return None
        built["engines"].append(engine)
        built[key] = engine.get_function_address(name)
    return built


class HostModule:
    """A module compiled for the host the first time one of its functions is asked for, once
    whichever threads ask at the same moment (`compile_for_host` with its module's passes);
    no function where the host lacks ``feature`` (a `host_features` flag) or the JIT."""

    def __init__(self, build: Callable[[], Any], feature: str) -> None:
        self._build = build
        self._feature = feature
        self._made: dict[str, Any] = {}  # the engine once made (None: none can be here)

    def address(self, name: str) -> int | None:
        """The machine address of function ``name``; None where the module cannot run here."""
        engine = compiled.made_once(self._made, "engine", self._compile)
        return None if engine is None else engine.get_function_address(name)

    def _compile(self) -> Any:
        from engine.cpu import host_features

        return compile_for_host(self._build) if host_features.has(self._feature) else None
