"""Where a direct convolution's sums over a zero-bordered grid go: for a vector of 16 grid
columns, which are output pixels and where they lie in the output (`GridLanes`). AMX's direct
convolution (`conv_amx_ir`) and AVX-512 BF16's (`conv_bf16_ir`) store through these.

Grid column ``n = y·Wp + x`` is output pixel ``y·W + x`` where ``x < W``; the columns past
each output row (the padding's) are computed and dropped. Packed together (``vcompressps``),
a vector's kept columns are consecutive output pixels, from the pixels before its first
column on: a row's last pixel and the next row's first lie side by side.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.task_ir import F64, I64, splat

LANES = 16


class GridLanes:
    """The intrinsics the placing needs, declared in ``module``, and the placing itself."""

    def __init__(self, module: ir.Module) -> None:
        self.count = ir.Function(module, ir.FunctionType(ir.IntType(LANES),
                                                         [ir.IntType(LANES)]),
                                 name=f"llvm.ctpop.i{LANES}")
        self.lanes = ir.VectorType(F64, LANES)
        self.floor = ir.Function(module, ir.FunctionType(self.lanes, [self.lanes]),
                                 name=f"llvm.floor.v{LANES}f64")

    def kept(self, builder: ir.IRBuilder, start: Any, grid_width: Any, width: Any,
             n: Any) -> Any:
        """Which of the 16 columns from ``start`` are pixels: ``x = column mod Wp`` below the
        output width and the column below ``n``. The remainder in float64 (exact here, and
        a vector has no integer division): floor((column + ½) / Wp)."""
        indices = ir.VectorType(I64, LANES)
        columns = builder.add(splat(builder, start, indices),
                              ir.Constant(indices, list(range(LANES))))
        as_float = builder.sitofp(columns, self.lanes)
        grid = splat(builder, builder.sitofp(grid_width, F64), self.lanes)
        half = ir.Constant(self.lanes, [0.5] * LANES)
        grid_rows = builder.call(self.floor, [builder.fdiv(builder.fadd(as_float, half), grid)])
        x = builder.fsub(as_float, builder.fmul(grid_rows, grid))
        inside = builder.fcmp_ordered("<", x, splat(builder, builder.sitofp(width, F64),
                                                    self.lanes))
        return builder.and_(inside, builder.icmp_signed("<", columns,
                                                        splat(builder, n, indices)))

    def leading(self, builder: ir.IRBuilder, kept: Any) -> Any:
        """The first as many lanes as ``kept`` has set: where a compressed vector's values
        lie."""
        count = builder.call(self.count, [builder.bitcast(kept, ir.IntType(LANES))])
        indices = ir.VectorType(I64, LANES)
        return builder.icmp_signed("<", ir.Constant(indices, list(range(LANES))),
                                   splat(builder, builder.zext(count, I64), indices))

    @staticmethod
    def pixels_before(builder: ir.IRBuilder, start: Any, grid_width: Any, width: Any) -> Any:
        """The output pixels before grid column ``start``: ``y·W + min(x, W)``."""
        y = builder.sdiv(start, grid_width)
        x = builder.sub(start, builder.mul(y, grid_width))
        x = builder.select(builder.icmp_signed("<", x, width), x, width)
        return builder.add(builder.mul(y, width), x)
