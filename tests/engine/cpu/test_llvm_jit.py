"""`llvm_jit`: the bf16 rounding the JIT provides where LLVM calls compiler-rt for it."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.cpu import llvm_jit
from engine.kernels import bf16

pytest.importorskip("llvmlite")

# A function that calls the provided symbol by name, as LLVM's lowering of ``fptrunc`` to
# ``bfloat`` does on a CPU without AVX512-BF16 (on one with it, LLVM emits the instruction).
# It takes the float's bits: no conversion on the way can flush a denormal or quiet a NaN.
CALLER = f"""
declare bfloat @{llvm_jit.SOFT_BF16_ROUNDING}(float)

define i16 @rounded_bits(i32 %word) {{
  %value = bitcast i32 %word to float
  %half = call bfloat @{llvm_jit.SOFT_BF16_ROUNDING}(float %value)
  %bits = bitcast bfloat %half to i16
  ret i16 %bits
}}
"""


def test_the_provided_rounding_is_round_to_bf16_bit_for_bit() -> None:
    engine = llvm_jit.compile_ir(CALLER)
    rounded = ctypes.CFUNCTYPE(ctypes.c_uint16, ctypes.c_uint32)(
        engine.get_function_address("rounded_bits"))
    # ties both ways, a carry into the exponent, infinities, NaNs (one whose payload lies
    # only in the low half), denormals, signed zeros, and random values
    special = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 - 2**-25, 3.3895314e38, np.inf, -np.inf,
                        np.nan, 1e-40, -1e-45, 0.0, -0.0], np.float32)
    low_nan = np.array([0x7F800001, 0xFF800001], np.uint32).view(np.float32)
    values = np.concatenate([special, low_nan,
                             np.random.default_rng(5).standard_normal(2000).astype(np.float32)])
    got = np.array([rounded(int(word)) for word in values.view(np.uint32)], np.uint16)
    np.testing.assert_array_equal(got, bf16.round_to_bf16(values))
