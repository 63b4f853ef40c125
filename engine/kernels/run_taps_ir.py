"""Which taps of a convolution a tile of runs of output pixels computes, as LLVM IR: the
padding's products left out, as OpenVINO's convolutions leave them out.

A tile's pixels are runs of `SEGMENT` output pixels, each within one output row. At a tap,
a run's pixels read inside the input or in its zero padding: all of them inside, all but the
first or the last or both (a column of the border), or none (a row of it). Each tap's output
rows and columns reading inside lie in a table (`border_taps.tap_bounds`: per tap the first
and last row, then column, int64s); `variant` reads it for the tile's runs and numbers the
choice, and `each_variant` builds the tap's steps once for each choice, over the pixels it
computes alone. The products left out are those of zeros, so the sums are the same bit for
bit. A tap reading the border only a few pixels in from a run's end (a wide kernel's, or a
dilated one's) computes them all: their products with the padding's zeros add nothing.
`conv_bf16_pixels_ir` (bf16 pairs from a zero-bordered grid) and `gemm_int8_fused_ir`'s run
tiles (uint8 windows of a zero-padded copy) take it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import llvmlite.ir as ir

I64 = ir.IntType(64)
SEGMENT = 7  # pixels a run: ResNet's planes are 7 · 2^k pixels wide
# What each run computes at a tap: none, all, all but the first, all but the last, all but
# both ends; by the run's pixels in it.
RUN_PIXELS = ((), tuple(range(SEGMENT)), tuple(range(1, SEGMENT)), tuple(range(SEGMENT - 1)),
              tuple(range(1, SEGMENT - 1)))
OFF, ALL, BUT_FIRST, BUT_LAST, BUT_ENDS = range(len(RUN_PIXELS))


def variant(builder: ir.IRBuilder, bounds: Any, tap: Any, runs: list[tuple[Any, Any]]) -> Any:
    """At ``tap``, which of `RUN_PIXELS` each run computes (``runs``: each run's output row
    and first column, or a row of -1 for a run past the output's last pixel, computing
    none), as one number: the runs' choices as digits in `RUN_PIXELS`' base, the first run's
    the highest. Every pixel where ``bounds`` (an int64 pointer to the table) is null."""
    everything = sum(ALL * len(RUN_PIXELS) ** k for k in range(len(runs)))
    given = builder.icmp_unsigned("!=", builder.ptrtoint(bounds, I64), I64(0))
    before = builder.block
    with builder.if_then(given):
        row_first, row_last, column_first, column_last = (
            builder.load(builder.gep(bounds, [builder.add(builder.mul(tap, I64(4)), I64(i))]))
            for i in range(4))
        chosen = I64(0)
        for row, across in runs:
            last = builder.add(across, I64(SEGMENT - 1))
            reads = builder.and_(builder.icmp_signed(">=", row, row_first),
                                 builder.icmp_signed("<=", row, row_last))
            # an end pixel left out only where the next one in reads inside
            but_first = builder.and_(builder.icmp_signed("<", across, column_first),
                                     builder.icmp_signed(">=", builder.add(across, I64(1)),
                                                         column_first))
            but_last = builder.and_(builder.icmp_signed(">", last, column_last),
                                    builder.icmp_signed("<=", builder.sub(last, I64(1)),
                                                        column_last))
            state = builder.add(I64(ALL), builder.add(
                builder.zext(but_first, I64),
                builder.mul(builder.zext(but_last, I64), I64(BUT_LAST - ALL))))
            state = builder.select(reads, state, I64(OFF))
            chosen = builder.add(builder.mul(chosen, I64(len(RUN_PIXELS))), state)
        computed = builder.block
    number = builder.phi(I64)
    number.add_incoming(I64(everything), before)
    number.add_incoming(chosen, computed)
    return number


def each_variant(builder: ir.IRBuilder, function: ir.Function, number: Any, runs: int,
                 steps: Callable[[list[int]], None]) -> None:
    """The tap's steps for the variant ``number`` names (`variant`): ``steps(pixels)`` built
    once for each choice of the ``runs`` runs, over the tile's pixels it computes (by their
    place in the tile, run after run); none where no pixel reads inside. The builder ends
    after them."""
    done = function.append_basic_block("tap_done")
    choice = builder.switch(number, done)
    for index, computed in enumerate(itertools.product(RUN_PIXELS, repeat=runs)):
        pixels = [k * SEGMENT + j for k, run in enumerate(computed) for j in run]
        if not pixels:
            continue  # no pixel of the tile reads inside the input at this tap
        block = function.append_basic_block(f"variant{index}")
        choice.add_case(I64(index), block)
        builder.position_at_end(block)
        steps(pixels)
        builder.branch(done)
    builder.position_at_end(done)
