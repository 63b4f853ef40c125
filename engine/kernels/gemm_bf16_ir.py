"""The bf16 register-tile micro-kernels: `gemm_ir`'s tiles with a K loop over pairs.

AVX-512 BF16's ``vdpbf16ps`` (``llvm.x86.avx512bf16.dpbf16ps.512``) multiplies 32 bf16 pairs
and adds each pair's two products to one of 16 float32 lanes: ``sum[j] += a[2j]·b[2j] +
a[2j+1]·b[2j+1]``. So the operands are laid out in pairs along K: a 32-bit word holds two
bf16 values, element k = 2p in its low half and 2p + 1 in its high half, and the fp32 tile
carries over unchanged with the word in place of the float. Per step p, a word of A per row
(K elements 2p and 2p+1 of that row) is broadcast to all 16 lanes, a vector of 16 words of B
(each column's two elements) is loaded, and one ``vdpbf16ps`` per row and vector does two
multiply-adds per lane. The loads, masks, stores and the epilogue (bias per row or column,
clamp) are `gemm_ir`'s: words are moved as float32 bit patterns and reread as bf16 pairs
(``bitcast``), which changes no bits.

llvmlite's IR builder has no ``bfloat`` type; `BFloatType` adds it (LLVM 17 and later give
the intrinsic ``<32 x bfloat>`` operands).

On the Intel machine of docs/benchmarks.md this tile is not faster than float32's where the
product is compute-bound: 96×256×256 with both operands packed ran at 112 GFLOP/s against the
float32 tile's 186, so ``vdpbf16ps`` issues there at about a third of the FMA's rate, which
its two multiply-adds per lane do not make up. It wins where memory bounds the product (half
the bytes per operand: a dense layer at batch 1, 1×512×1000 in 20 µs against 47), and AMX's
tiles (`gemm_amx_ir`, 420–930 GFLOP/s on one thread) run the rest. On AMD Zen 5 (AVX-512
BF16, no AMX) ``vdpbf16ps`` issues at the FMA's rate: the same product ran at 510 GFLOP/s
against 255, 1.9–2.1× float32 at ResNet's and MobileNet v2's shapes.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_ir import TileKernel

DOT_PRODUCT = "llvm.x86.avx512bf16.dpbf16ps.512"


class BFloatType(ir.Type):
    """LLVM's 16-bit brain float, which llvmlite's IR builder lacks."""

    def __str__(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BFloatType)

    def __hash__(self) -> int:
        return hash(BFloatType)


class PairTileKernel(TileKernel):
    """`TileKernel` over bf16 pairs: K counts pairs, strides count 32-bit words."""

    # A short K loop (ResNet-50 v2's 1×1 layers at 56²: 32 pairs) ends before lines of C or
    # the residual asked for after it arrive. Asked as each tile starts, on one Zen 4 core,
    # bf16 at batch 1 (`bench/variants.py`): its residual 1×1 products 0.80-0.93× at 56²,
    # 0.83-0.97× at 28², the 56² shortcut 0.70-1.0×; ResNet-18 and MobileNet v2 0.99-1.00×.
    # Asked only where a residual is added to a large C (`gemm_ir.ASKS_MIN_C_BYTES`), that
    # ÷ asked at every tile's start: MobileNet v2 0.988-0.996 (its 1×1 layers at 14² and 7²,
    # C in L2, 0.93-0.97), ResNet-50 v2 1.000, ResNet-18 0.998, within what two identical
    # plans read on that busy host (MobileNet v2 0.987-1.014); ResNet-50 v2's shortcuts (C
    # 0.8-3.2 MB, no residual) took 1.006-1.03× as long asking too.
    asks_large_c = True
    # An edge's last columns a column to a vector (`TileKernel._side_tiles`). One Zen 4 core,
    # bf16 at batch 1 (`bench/variants.py`), the products summing them in whole vectors
    # against this: MobileNet v2's 1×1 layers at 7² 1.15-1.17×, at 14² 1.02-1.07×;
    # ResNet-50 v2's residual products at 7² 1.17-1.19×, its 1×1 layers at 14² 1.04-1.07×.
    # Up to 8 columns: 5.9 s to build and compile the module, against 0.9 (0.6 with none).
    side_columns = 4

    def __init__(self, shape: Any) -> None:
        if shape.width != 16:
            raise ValueError(f"the bf16 tile needs 16-lane vectors (AVX-512); got {shape.width}")
        super().__init__(shape)
        self.pairs = ir.VectorType(BFloatType(), 2 * shape.width)
        self.dot_product = ir.Function(
            self.module, ir.FunctionType(self.vector, [self.vector, self.pairs, self.pairs]),
            name=DOT_PRODUCT)

    def _multiply_add(self, builder: ir.IRBuilder, broadcast: Any, b_value: Any,
                      sum_: Any) -> Any:
        # ``broadcast`` is one word of A (row i, pair p) in every lane, ``b_value`` 16 words
        # of B: both float32 vectors only in name.
        return builder.call(self.dot_product, [sum_, builder.bitcast(broadcast, self.pairs),
                                               builder.bitcast(b_value, self.pairs)])

