"""Native CPU kernels and their binds: the prepared fast paths operators bind into a plan.

A bind (`conv_bind`, `depthwise_bind`, `winograd_bind`, `gemm_bind`, the pooling kernels in
`pool_kernel`) turns one node into calls over memory fixed at compile time; a kernel module
(`gemm_kernel`, `winograd_kernel`, `depthwise_kernel`, `strided_kernel`) holds the compiled
code. Bound kernel calls offer the small protocol of `engine.cpu.parts` so that the thread pool
and the batch splitter never ask which kernel they hold.
"""
