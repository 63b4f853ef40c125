"""LLVM IR built with `llvmlite.ir`, compiled to machine code in this process (MCJIT).

The GEMM kernels (`gemm_kernel`) and the spin pool's loops (`spin_pool`) are written as IR
because numba cannot be made to emit them (a register tile, atomics); llvmlite is numba's own
compiler, so this adds no dependency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.cpu import compiled, jit_objects


def compile_ir(text: str, cpu: str = "", features: str = "", level: int = 2,
               optimise: bool = False, kept: bool = False) -> Any:
    """An execution engine holding ``text`` compiled for ``cpu`` with ``features`` (the host's
    defaults where empty) at optimisation ``level``; with ``optimise``, the module's passes run
    first (the IR's own loops unrolled and vectorised). With ``kept``, the machine code is
    taken from, or else kept in, the cache directory (`jit_objects`). The engine owns the
    machine code: keep it as long as its functions. Raises RuntimeError or OSError where there
    is no JIT for this target, ImportError without llvmlite."""
    import llvmlite
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    triple = llvm.get_default_triple()
    machine = llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=level)
    module = llvm.parse_assembly(text)
    module.verify()
    _provide_bf16_rounding(llvm)
    path = None if not kept else jit_objects.path_for(
        (triple, cpu, features, level, optimise, llvmlite.__version__, llvm.llvm_version_info),
        text)
    code = None if path is None else jit_objects.load(path)
    if optimise and code is None:
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(level))
        builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, machine)
    if path is not None:  # MCJIT links ``code`` where there is one, else hands over its own
        engine.set_object_cache(
            notify_func=lambda _module, generated: jit_objects.store(path, generated),
            getbuffer_func=lambda _module: code)
    engine.finalize_object()
    return engine


def compile_for_host(build: Callable[[], Any], optimise: bool = True) -> Any:
    """An execution engine holding the module ``build()`` makes (it imports llvmlite's IR
    itself), compiled for the host CPU and its features at level 3, the module's passes run
    first with ``optimise``, its machine code kept on disk for the next process
    (`jit_objects`); None where llvmlite or its JIT is missing. The engine owns the
    machine code: keep it as long as its functions."""
    try:
        import llvmlite.binding as llvm

        text = str(build())
    except ImportError:
        return None
    try:
        llvm.initialize_native_target()
        return compile_ir(text, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                          level=3, optimise=optimise, kept=True)
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


# Where the CPU has no ``vcvtneps2bf16`` (AVX512-BF16), LLVM lowers ``fptrunc`` to ``bfloat``
# into calls to compiler-rt's ``__truncsfbf2``, which MCJIT finds nowhere in this process: the
# call would jump to address 0. `_provide_bf16_rounding` defines it once, from integer
# operations (round to nearest even, a NaN quieted, denormals kept: `bf16.round_to_bf16`), so
# that a bf16 kernel runs correctly, if slowly, on any host. The engine runs bf16 models in
# float32 there (`engine.runtime.precision`); the kernels' tests still run them.
SOFT_BF16_ROUNDING = "__truncsfbf2"
_soft_bf16: dict[str, Any] = {}

_BF16_ROUNDING_IR = f"""
define bfloat @{SOFT_BF16_ROUNDING}(float %value) {{
  %bits = bitcast float %value to i32
  %upper = lshr i32 %bits, 16
  %odd = and i32 %upper, 1
  %bias = add i32 %odd, 32767
  %sum = add i32 %bits, %bias
  %nearest = lshr i32 %sum, 16
  %quiet = or i32 %upper, 64
  %magnitude = and i32 %bits, 2147483647
  %nan = icmp ugt i32 %magnitude, 2139095040
  %chosen = select i1 %nan, i32 %quiet, i32 %nearest
  %half = trunc i32 %chosen to i16
  %result = bitcast i16 %half to bfloat
  ret bfloat %result
}}
"""


def _provide_bf16_rounding(llvm: Any) -> None:
    """Registers `SOFT_BF16_ROUNDING` with the JIT's symbol table, once per process."""
    compiled.made_once(_soft_bf16, "engine", lambda: _compile_bf16_rounding(llvm))


def _compile_bf16_rounding(llvm: Any) -> Any:
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(_BF16_ROUNDING_IR), machine)
    engine.finalize_object()
    llvm.add_symbol(SOFT_BF16_ROUNDING, engine.get_function_address(SOFT_BF16_ROUNDING))
    return engine  # it owns the machine code


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
