"""GPU execution through CuPy: fused-kernel generation, plan execution and CUDA graph replay.

`codegen` is pure Python (tested without a GPU); `fused`, `executor` and `graphs` use CuPy only
when a GPU plan is built. (Named ``cuda`` so that ``engine.gpu(0)``, MXNet's context
constructor, stays a plain function.)
"""
