"""GPU execution through CuPy: fused-kernel generation, plan execution and CUDA graph replay.

`codegen` is pure Python (tested without a GPU); `fused`, `executor` and `graphs` import CuPy
only when a GPU plan is built.
"""
