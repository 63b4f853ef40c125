"""The AMX kernels give the tile state back (``tilerelease``) when a part returns: their IR
releases before every return, and a thread that ran one holds no tile data afterwards."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from engine.cpu import host_features
from engine.kernels import bf16, conv_amx, gemm_int8, gemm_kernel

llvmlite_ir = pytest.importorskip("llvmlite.ir")

RELEASE = "llvm.x86.tilerelease"
XTILEDATA = 1 << 18  # the tile registers' bit in XINUSE (XGETBV with ECX = 1)


def amx_entries() -> list[Any]:
    """Each AMX module's functions that a caller enters (a pool's parts, the int8 panels)."""
    from engine.kernels.conv_amx_ir import module as conv_module
    from engine.kernels.gemm_amx_ir import AmxTileKernel
    from engine.kernels.gemm_int8_amx_ir import AmxInt8Kernel
    from engine.kernels.gemm_int8_direct_ir import DirectInt8Kernel

    tiles = AmxTileKernel(gemm_kernel.AMX_TILE)
    tiles.define_part("part", tiles.define_full("tile_full"), tiles.define_edge("tile_edge"),
                      gemm_kernel.CONTEXT_FIELDS)
    entries = {"gemm part": tiles.module.get_global("part"),
               "conv part": conv_module(conv_amx._FIELD).get_global("part"),
               "int8 panels": AmxInt8Kernel().define("panels"),
               "int8 direct task": DirectInt8Kernel().task}
    return [pytest.param(name, function, id=name) for name, function in entries.items()]


@pytest.mark.parametrize(("name", "function"), amx_entries())
def test_every_return_of_an_amx_entry_releases_the_tiles_first(name: str,
                                                                function: Any) -> None:
    returns = [block for block in function.blocks
               if isinstance(block.terminator, llvmlite_ir.Ret)]
    assert returns, f"{name} has no return"
    for block in returns:
        before = block.instructions[-2] if len(block.instructions) > 1 else None
        assert isinstance(before, llvmlite_ir.CallInstr) and before.callee.name == RELEASE, \
            f"{name}'s return in block {block.name!r} follows {before}, not {RELEASE}"


class TileProbe:
    """JIT-compiled helpers on the calling thread: ``in_use()`` reads XINUSE's tile-data bit,
    ``dirty()`` loads a non-zero tile and leaves it loaded."""

    def __init__(self) -> None:
        import llvmlite.binding as llvm
        import llvmlite.ir as ir

        from engine.cpu.llvm_jit import compile_ir
        from engine.kernels.gemm_amx_ir import I8, I64, declare_tile_intrinsics

        module = ir.Module(name="tile_probe")
        kernel = type("Intrinsics", (), {})()
        declare_tile_intrinsics(kernel, module, "llvm.x86.tdpbf16ps", "probe_configuration")
        xgetbv = ir.Function(module, ir.FunctionType(I64, [ir.IntType(32)]),
                             name="llvm.x86.xgetbv")
        in_use = ir.Function(module, ir.FunctionType(I64, []), name="in_use")
        builder = ir.IRBuilder(in_use.append_basic_block("entry"))
        builder.ret(builder.call(xgetbv, [ir.IntType(32)(1)]))
        dirty = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8.as_pointer()]),
                            name="dirty")
        builder = ir.IRBuilder(dirty.append_basic_block("entry"))
        builder.call(kernel.load_config, [builder.bitcast(kernel.config, I8.as_pointer())])
        builder.call(kernel.load_tile, [I8(0), dirty.args[0], I64(64)])
        builder.ret_void()
        llvm.initialize_native_target()
        self.engine = compile_ir(str(module), llvm.get_host_cpu_name(),
                                 llvm.get_host_cpu_features().flatten())
        self._in_use = ctypes.CFUNCTYPE(ctypes.c_uint64)(self.engine.get_function_address(
            "in_use"))
        self._dirty = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.engine.get_function_address(
            "dirty"))
        self._ones = np.ones(16 * 64, np.uint8)

    def in_use(self) -> bool:
        return bool(self._in_use() & XTILEDATA)

    def dirty(self) -> None:
        self._dirty(self._ones.ctypes.data)


@pytest.fixture
def probe() -> TileProbe:
    tile_probe = TileProbe()
    tile_probe.dirty()
    # The probe sees tile data a kernel leaves behind (else the checks below prove nothing).
    assert tile_probe.in_use()
    return tile_probe


@pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX),
                    reason="this CPU lacks AMX-BF16 or Linux refused its tile state")
def test_the_thread_holds_no_tile_data_after_a_bf16_product(probe: TileProbe) -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 48), np.float32), rng.standard_normal((48, 40), np.float32)
    c = np.zeros((40, 40), np.float32)
    gemm_kernel.bind_tiles(bf16.amx_weight_rows(a), bf16.amx_weight_columns(b), c)()
    assert np.abs(c).sum() > 0
    assert not probe.in_use()


@pytest.mark.skipif(not (host_features.has("amx_int8") and gemm_int8.amx_available()),
                    reason="this CPU lacks AMX-INT8 or Linux refused its tile state")
def test_the_thread_holds_no_tile_data_after_an_int8_product(probe: TileProbe) -> None:
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (40, 70)).astype(np.uint8)
    w = rng.integers(-128, 128, (70, 33)).astype(np.int8)
    product = gemm_int8.multiply(a, gemm_int8.PackedWeights(w, True))
    np.testing.assert_array_equal(product, a.astype(np.int64) @ w.astype(np.int64))
    assert not probe.in_use()
