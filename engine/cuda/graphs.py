"""CUDA graph capture and replay of a plan's steps on one stream.

Capture runs the steps once more on the plan's stream with a private CuPy memory pool, so that
any temporary a kernel allocates during capture gets an address no other code can be handed
while the graph is alive (the pool lives as long as the graph). Capture is refused, and the plan
keeps running its steps one by one, when a step synchronises with the host or otherwise breaks
stream capture; the reason is kept for `stats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class CapturedGraph:
    """A captured graph, the private pool its temporaries live in, and its stream."""

    graph: Any
    pool: Any
    stream: Any

    def replay(self) -> None:
        """Launch the whole plan as one graph on its stream (asynchronous)."""
        self.graph.launch(self.stream)


def capture(run_steps: Callable[[], None], stream: Any, cupy: Any) -> CapturedGraph:
    """Capture ``run_steps`` on ``stream``.

    Raises:
        Exception: whatever CuPy/CUDA raised when a step cannot be captured (the caller keeps
            running eagerly and records why).
    """
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run_steps()  # fills the private pool outside capture, so capture needs no cudaMalloc
        stream.synchronize()
        _begin(stream, cupy)
        try:
            run_steps()
        except BaseException:
            _abandon(stream)
            raise
        graph = stream.end_capture()
    return CapturedGraph(graph, pool, stream)


def _begin(stream: Any, cupy: Any) -> None:
    # Relaxed mode: a library call that allocates (cuBLAS workspace, pool growth) stays legal.
    relaxed = getattr(cupy.cuda.runtime, "streamCaptureModeRelaxed", None)
    if relaxed is None:
        stream.begin_capture()
    else:
        stream.begin_capture(mode=relaxed)


def _abandon(stream: Any) -> None:
    """End a failed capture so the stream is usable again; its graph is dropped."""
    try:
        stream.end_capture()
    except Exception:  # the capture was invalidated: ending it reports that, which we know
        pass


def kernel_node_count(captured: CapturedGraph) -> int | None:
    """Kernel launches recorded in ``captured`` (through the CUDA driver), or None if unknown."""
    import ctypes

    handle = getattr(captured.graph, "graph", None)
    if not handle:
        return None
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_size_t(0)
    if driver.cuGraphGetNodes(ctypes.c_void_p(handle), None, ctypes.byref(count)) != 0:
        return None
    nodes = (ctypes.c_void_p * count.value)()
    if driver.cuGraphGetNodes(ctypes.c_void_p(handle), nodes, ctypes.byref(count)) != 0:
        return None
    kind = ctypes.c_int(-1)
    kernels = 0
    for node in nodes:
        driver.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
        kernels += kind.value == 0  # CU_GRAPH_NODE_TYPE_KERNEL
    return kernels
