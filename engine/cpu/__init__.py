"""The CPU runtime: threads that run a plan's steps and parts, and the compilers they use.

`spin_pool` (native spinning workers; their code in `spin_ir`, compiled by `llvm_jit`), the
thread-per-slab splitter (`parallel`), BLAS's thread count (`blas_threads`), compiled numba
kernels run as jobs of parts (`kernel_jobs`, `compiled`) and where generated code is cached
(`cache`). Nothing here knows an operator or a kernel: kernels offer `parts.PartedCall`.
"""
