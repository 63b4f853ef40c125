"""`Plan`: a graph compiled for one input signature into a flat list of steps.

Compilation infers every shape and dtype, plans memory, allocates all buffers and binds each
step to its input and output arrays, so `Plan.run` is a copy of the inputs, a plain loop of
zero-argument calls and a copy of the outputs: no graph walking, look-ups or allocation. On
the CPU, once its runs settle, the loop's calls that only post jobs are replayed as those jobs
in one native call (`engine.cpu.steady_walk`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.compiler.plan_memory import MemoryPlan, plan_memory
from engine.cpu import blas_threads, denormals, parallel, spin_pool
from engine.cpu.steady_walk import SteadyWalk
from engine.cuda.bf16 import Bf16Products, product_op, staging_elements
from engine.cuda.half import HALF_PRECISIONS, half_graph
from engine.device import CPU, Device, on_stream
from engine.errors import EngineError, ExecutionError, ShapeError
from engine.graph.infer import infer_dtypes, infer_shapes, specialize_sources
from engine.graph.ir import Graph, Node
from engine.kernels import expansion_chain, jobs
from engine.kernels.packed_weight import PackedWeight
from engine.kernels.workspace import ARENA_FROM_BYTES, Reader, Workspace
from engine.ops.quantized import ranges
from engine.ops.shapes import is_known
from engine.runtime.buffers import fill_rows
from engine.runtime.floats import quiet_floats, restore_floats

# A plan whose steps leave BLAS alone sticks the spin pool's workers to its runs while the
# quickest of its first `STUCK_TRIES` runs took under `STUCK_SECONDS` (`Plan._note_stuck_run`).
STUCK_TRIES = 3
STUCK_SECONDS = 0.001


@dataclass(frozen=True)
class Step:
    """One bound kernel call and the node it came from (for errors and profiles)."""

    call: Callable[[], Any]
    node: Node


class Plan:
    """A compiled, reusable execution of ``graph`` for fixed input shapes and dtypes.

    Thread-safe: runs of one plan are serialised by a lock, since they share buffers.
    ``device`` (the CPU when None) decides the array module the steps are bound with. On a
    GPU the buffers live in GPU memory, inputs and outputs move through pinned host buffers on
    the plan's own stream, and the steps are replayed as a CUDA graph once warm; ``run`` still
    takes and returns numpy arrays. ``constants`` (shared by a model's plans)
    caches parameters already on the device, and ``derived`` (shared likewise) values that ops
    derive from parameters when they bind (see `Workspace.derived`). ``precision`` (``fp32``,
    ``bf16``, or ``fp16`` on a GPU; `engine.runtime.precision`) is what it computes in: a GPU
    plan in ``fp16`` runs a half-precision copy of ``graph`` (`engine.cuda.half`), one in
    ``bf16`` binds its Convolution and Dense nodes with bf16 products (`engine.cuda.bf16`).
    """

    def __init__(self, graph: Graph, input_shapes: Mapping[str, tuple[int, ...]],
                 input_dtypes: Mapping[str, np.dtype],
                 reuse_memory: bool = True, device: Device | None = None,
                 constants: dict[str, Any] | None = None,
                 derived: dict | None = None, precision: str = "fp32") -> None:
        self.device = device or CPU
        self.precision = precision
        self.xp = self.device.xp
        if self.device.is_gpu and precision in HALF_PRECISIONS:
            # Half between float32 inputs and outputs; parameters converted once per model.
            graph = half_graph(graph, input_dtypes, precision,
                               None if derived is None else derived)
        self.graph = graph
        self._constants = {} if constants is None else constants
        shapes, dtypes = _infer(graph, input_shapes, input_dtypes)
        # the expansions whose depthwise reader may write while they read (`expansion_chain`)
        ahead = () if self.device.is_gpu else expansion_chain.writes_ahead(graph.nodes, shapes,
                                                                           dtypes)
        self.memory: MemoryPlan = plan_memory(graph, shapes, dtypes, reuse_memory, ahead)
        self._lock = threading.Lock()
        self.signature = tuple((name, tuple(input_shapes[name]), np.dtype(input_dtypes[name]))
                               for name in input_shapes)
        self._gpu = None
        # On a GPU everything compile time queues (uploads, zero fills, cuDNN plans) goes on the
        # plan's own stream, and only that stream is waited for: a device-wide synchronise
        # would break another thread's CUDA graph capture.
        stream = self._stream = self.device.new_stream()
        with self.device.activate(), on_stream(stream), spin_pool.watching() as split_jobs:
            self._compile(graph, input_shapes, input_dtypes, shapes, dtypes, derived, stream)
        # Steps handing parts to the spin pool: its workers spin through each run, where
        # that measures faster than one thread (`spin_pool.Choice`).
        self._spins = bool(split_jobs)
        self._spin_choice = spin_pool.Choice()
        self._hold_blas = not all(spin_pool.quiet_for_blas(step.call) for step in self.steps)
        # A plan whose steps leave BLAS alone keeps the workers spinning (`spin_pool.stick`)
        # only while its runs are short: the quickest of its first `STUCK_TRIES` runs decides.
        self._stuck_times: list[float] = []
        self._choosing = self._hold_blas
        if self.device.is_gpu:
            from engine.cuda.executor import GpuExecutor

            stream.synchronize()
            self._gpu = GpuExecutor(self.device, self._inputs, self._heads, self._run_steps,
                                    stream, self._convolutions, capture_blocker(graph))

    def _compile(self, graph: Graph, input_shapes: Mapping, input_dtypes: Mapping,
                 shapes: list, dtypes: list, derived: dict | None, stream: Any) -> None:
        xp = self.xp
        self._convolutions = _device_convolutions(self.device, stream)
        scratch_bytes = _scratch_bytes(graph, shapes, dtypes)
        self.workspace = Workspace(
            xp, scratch_bytes, derived, self._convolutions, self.precision,
            huge_pages=sum(self.memory.buffer_sizes) + scratch_bytes >= ARENA_FROM_BYTES)
        # whether the int8 steps' ranges are constants, so their steady runs may be replayed
        self.workspace.constant_ranges = ranges.constant_in(graph.nodes)
        # On huge pages, small buffers packed together (`Workspace.empty`).
        buffers = [self.workspace.empty(size, np.uint8) for size in self.memory.buffer_sizes]
        # where they lie: an array of the caller's inside one (an output of the last run,
        # returned uncopied) is copied in, not read in place while steps write there
        self._spans = [(buffer.ctypes.data, buffer.ctypes.data + buffer.nbytes)
                       for buffer in buffers] if xp is np else []
        self._inputs = {name: self.workspace.empty(input_shapes[name], input_dtypes[name])
                        for name in input_shapes}
        # bf16 on a GPU: the Convolution and Dense nodes bind with products on bf16 operands.
        products = Bf16Products(xp, self._constants, {} if derived is None else derived,
                                staging_elements(graph, shapes)) \
            if self.device.is_gpu and self.precision == "bf16" else None
        arrays: dict[tuple[int, int], Any] = {}
        readers = _readers(graph)
        self.steps: list[Step] = []
        spread = parallel.threads()
        for index, node in enumerate(graph.nodes):
            if node.is_variable:
                arrays[(index, 0)] = self._variable(node)
                continue
            args = [arrays[(entry.node, entry.index)] for entry in node.inputs]
            params = specialize_sources(node, shapes[index])
            if node.opdef.view and _bind_view(arrays, index, node, params, args, xp):
                continue
            outs = tuple(_buffer_view(buffers[self.memory.buffer_of[(index, slot)]], shape, dtype)
                         for slot, (shape, dtype) in enumerate(zip(shapes[index], dtypes[index])))
            for slot, out in enumerate(outs):
                arrays[(index, slot)] = out
                self.workspace.note_readers(out, tuple(readers.get((index, slot), ())))
            out = outs[0] if len(outs) == 1 else outs
            node_xp = products if products is not None and product_op(node) else xp
            calls = node.opdef.bind_calls(node_xp, params, args, out, self.workspace)
            if xp is np:  # large copies and ufuncs cut over parallel.threads() (default 1)
                calls = [jobs.pooled(parallel.split(call, spread), self.workspace)
                         for call in calls]
            self.steps.extend(Step(call, node) for call in calls)
        if xp is np:
            self.steps = _chain_expansions(self.steps)
        # steady runs replayed natively (`steady_walk`), where the pool runs jobs
        self._steady = SteadyWalk() if xp is np and spin_pool.available() else None
        self._heads = [arrays[(entry.node, entry.index)] for entry in graph.heads]
        self._input_buffers = [(name, buffer, self._pointers(graph, readers, name, buffer))
                               for name, buffer in self._inputs.items()]

    def _pointers(self, graph: Graph, readers: dict[tuple[int, int], list[Reader]], name: str,
                  buffer: Any) -> tuple[Callable[[int], None], ...]:
        """The calls pointing the readers of input ``name`` at another array
        (`Workspace.reads_where_pointed`), where every reader of it has one and no output of
        the plan is the input itself; else none, and a run copies the input in."""
        if self.xp is not np:
            return ()
        pointers = self.workspace.pointers(buffer)
        index = next((index for index, node in enumerate(graph.nodes) if node.name == name
                      and node.is_variable), None)
        read = readers.get((index, 0), [])
        if index is None or not pointers or len(pointers) != len(read) \
                or any(reader.op is None for reader in read):
            return ()
        return pointers

    def _variable(self, node: Node) -> Any:
        if node.name in self._inputs:
            return self._inputs[node.name]
        constant = self.graph.constants[node.name]
        if isinstance(constant, PackedWeight):
            return constant  # a dense weight held only packed, which its layers bind as it is
        if self.xp is np:
            # Read-only: bound ops may keep work derived from a constant (Winograd's weights).
            view = np.asarray(constant).view()
            view.flags.writeable = False
            return view
        array = self._constants.get(node.name)
        if array is None:
            array = self.device.asarray(constant)
            # Complete before other plans (other streams, other threads) may read it.
            self.xp.cuda.get_current_stream().synchronize()
            self._constants[node.name] = array
        return array

    @property
    def busy(self) -> bool:
        """Whether a thread is running this plan now (a caller may pick another replica)."""
        return self._lock.locked()

    def reserve(self, blocking: bool = True) -> Any:
        """On a GPU, this plan held for one run whose inputs the caller writes straight into
        its pinned buffers (an `engine.cuda.executor.PinnedRun`; release it when done). None
        on the CPU, or when ``blocking`` is False and another thread holds the plan."""
        if self._gpu is None or not self._lock.acquire(blocking):
            return None
        from engine.cuda.executor import PinnedRun

        return PinnedRun(self._gpu, self._lock)

    def run(self, feed: Mapping[str, Any], copy_outputs: bool = True) -> list[Any]:
        """Copy ``feed`` in, run every step, return the outputs in head order.

        ``feed`` holds arrays of the shapes and dtypes this plan was compiled for, or with
        fewer rows (a batch padded up to this plan's bucket): those fill the first rows of the
        input buffers and the rest are zeroed, with no padded copy made.

        With ``copy_outputs=False`` the plan's own output buffers are returned: no allocation
        at all, but they are overwritten by the next run.
        """
        token = quiet_floats()  # inf and nan are results here, as in MXNet, not warnings
        try:
            with self._lock:
                if self._gpu is not None:
                    return self._gpu.run(feed, copy_outputs)
                pointed = self._fill_inputs(feed)
                try:
                    self._run_on_cpu(self._run_cpu_steps)
                finally:
                    _point_back(pointed)
                return [head.copy() for head in self._heads] if copy_outputs else \
                    list(self._heads)
        finally:
            restore_floats(token)

    def walk(self, feed: Mapping[str, Any],
             clock: Callable[[], float] = time.perf_counter) -> list[float]:
        """Seconds by ``clock`` each step of one CPU run took, in order, the run made as `run`
        makes it (denormals flushed; armed over the cores, held to one thread or stuck as
        `run` would be): a profile of the run measured, not of steps called apart, which on
        several cores run with the spin pool's workers parked and BLAS's threads awake."""
        if self._gpu is not None:
            raise ValueError("walk times a CPU plan's steps; a GPU plan has `profile`")
        seconds: list[float] = []

        def timed_steps() -> None:
            for step in self.steps:
                start = clock()
                step.call()
                seconds.append(clock() - start)

        token = quiet_floats()
        try:
            with self._lock:
                if self._steady is not None:
                    self._steady.disturbed()  # its steps' objects touched outside a run
                pointed = self._fill_inputs(feed)
                try:
                    self._run_on_cpu(timed_steps, record=False)
                finally:
                    _point_back(pointed)
        finally:
            restore_floats(token)
        return seconds

    def _fill_inputs(self, feed: Mapping[str, Any]) -> list[tuple[Any, tuple[Any, ...]]]:
        """``feed`` into the input buffers; an input whose readers read where they are
        pointed (`_pointers`) and whose array is one they can read (`_readable_in_place`) is
        not copied: they are pointed at it (ResNet-18 int8 at batch 1 copied 600 KB, about
        65 µs of its run, before its quantize read them), unless it lies in one of the plan's
        own buffers (`_spans`). Returns the (buffer, pointers) pointed away, for
        `_point_back` after the run."""
        pointed = []
        for name, buffer, pointers in self._input_buffers:
            array = feed[name]
            address = array.ctypes.data if pointers and _readable_in_place(array, buffer) \
                else None
            if address is not None and not any(start < address + array.nbytes and address < end
                                               for start, end in self._spans):
                for point in pointers:
                    point(address)
                pointed.append((buffer, pointers))
            else:
                fill_rows(buffer, array)
        return pointed

    def _run_on_cpu(self, run_steps: Callable[[], None], record: bool = True) -> None:
        """``run_steps`` with denormals flushed, over the cores this plan's runs use."""
        threads = spin_pool.threads() if self._spins else 1
        with denormals.flushed():  # FTZ/DAZ while the kernels run (docs/threads.md)
            if threads > 1 and self._choosing:
                self._run_spinning(run_steps, record)
            elif threads > 1:
                spin_pool.stick(threads)
                start = time.perf_counter()
                run_steps()
                if record and len(self._stuck_times) < STUCK_TRIES:
                    self._note_stuck_run(time.perf_counter() - start)
            else:
                run_steps()

    def _note_stuck_run(self, seconds: float) -> None:
        """A stuck run's time: where even the quickest of the first `STUCK_TRIES` took
        `STUCK_SECONDS` or more, the plan's runs go armed or on one thread by `Choice` from
        then on, as a plan holding BLAS does. Sticking saves the arming's few microseconds a
        run (the seed MLP at batch 1: 11 µs stuck, 15 armed), nothing to a run of
        milliseconds, which on a loaded machine may run faster on one thread (ResNet-50 v2
        bf16 at load 5: 41 ms on every core, 32 on one), and only `Choice` notices that."""
        self._stuck_times.append(seconds)
        if len(self._stuck_times) == STUCK_TRIES:
            self._choosing = min(self._stuck_times) >= STUCK_SECONDS
            if self._choosing:  # else the workers would take one-thread runs' jobs too
                spin_pool.unstick()

    def _run_spinning(self, run_steps: Callable[[], None], record: bool) -> None:
        """The steps armed over every core BLAS may use, or on one thread, whichever this
        plan's runs measured faster (BLAS on one thread either way: its own spinning threads
        would be the other's noise). For plans with steps BLAS may spread, and those whose
        runs are long; the others `stick`. ``record``: whether this run's time counts
        towards that choice (not a walk's, slowed by its clock)."""
        armed = self._spin_choice.armed()
        start = time.perf_counter()
        with spin_pool.armed() if armed else blas_threads.one_thread():
            run_steps()
        if record:
            self._spin_choice.record(armed, time.perf_counter() - start)

    def _run_cpu_steps(self) -> None:
        """The steps, or their steady run replayed (`steady_walk`)."""
        if self._steady is None:
            self._call_steps(self.steps)
        else:
            self._steady.run(self.steps, self._call_steps)

    def _run_steps(self) -> None:
        self._call_steps(self.steps)

    @staticmethod
    def _call_steps(steps: Iterable[Step]) -> None:
        for step in steps:
            try:
                step.call()
            except EngineError as error:
                raise ExecutionError(f"while running {step.node.describe()}: {error}") \
                    from error
            except Exception as error:
                raise ExecutionError(f"while running {step.node.describe()}: "
                                     f"{type(error).__name__}: {error}") from error

    def execution_stats(self) -> dict[str, Any]:
        """Device, and on the GPU whether the plan replays as a CUDA graph (and if not, why)."""
        if self._gpu is None:
            return {"device": self.device.name, "cuda_graph": False, "cuda_graph_error": None}
        return self._gpu.stats()

    def profile(self, feed: Mapping[str, Any], repeat: int = 10) -> dict[str, float]:
        """Mean seconds per op type over ``repeat`` runs (steps timed one by one)."""
        totals: dict[str, float] = {}
        if self._gpu is None:
            for _ in range(repeat):
                for step, seconds in zip(self.steps, self.walk(feed), strict=True):
                    label = _label(step.node)
                    totals[label] = totals.get(label, 0.0) + seconds
            return {label: seconds / repeat for label, seconds in totals.items()}
        self.run(feed, copy_outputs=False)  # inputs now sit in the device buffers
        with self._lock, self.device.activate(), on_stream(self._stream):
            for _ in range(repeat):
                for step in self.steps:
                    start = time.perf_counter()
                    step.call()
                    if self._stream is not None:
                        self._stream.synchronize()
                    label = _label(step.node)
                    totals[label] = totals.get(label, 0.0) + time.perf_counter() - start
        return {label: seconds / repeat for label, seconds in totals.items()}


def capture_blocker(graph: Graph) -> str | None:
    """Why ``graph`` cannot be captured as a CUDA graph (its first node whose op cannot run
    inside stream capture, see `OpDef.uncapturable`), or None when every op can be."""
    for node in graph.nodes:
        if node.is_variable:
            continue
        ops = node.opdef.components(node.params)
        blocking = next((op for op in ops if not op.capturable), None)
        if blocking is not None:
            return (f"{node.describe()} cannot run inside a CUDA graph ({blocking.name} "
                    f"{blocking.uncapturable}), so the plan runs uncaptured")
    return None


def _device_convolutions(device: Device, stream: Any) -> Any:
    """The plan's cuDNN context on a GPU where cuDNN can be used (None elsewhere)."""
    if not device.is_gpu or not device.cudnn:
        return None
    from engine.cuda import cudnn_conv

    if cudnn_conv.unavailable_reason() is not None:
        return None
    return cudnn_conv.CudnnConvolutions(int(stream.ptr), device.tf32)


def _label(node: Node) -> str:
    """The node's op, or for a composite (a fused chain) its parts' names: "Convolution+relu"."""
    if node.opdef.parts is None:
        return node.op
    return "+".join(op.name for op in node.opdef.parts(node.params))


def _infer(graph: Graph, input_shapes: Mapping, input_dtypes: Mapping) -> tuple[list, list]:
    constant_shapes = {name: np.shape(value) for name, value in graph.constants.items()}
    # A dense weight held packed answers its dtype as it is (np.asarray would rebuild it).
    constant_dtypes = {name: value.dtype if isinstance(value, PackedWeight)
                       else np.asarray(value).dtype for name, value in graph.constants.items()}
    shapes = infer_shapes(graph, {**constant_shapes, **input_shapes})
    dtypes = infer_dtypes(graph, {**constant_dtypes, **input_dtypes})
    for index, node in enumerate(graph.nodes):
        for slot, (shape, dtype) in enumerate(zip(shapes[index], dtypes[index])):
            if not is_known(shape):
                raise ShapeError(f"{node.describe()}: shape of output {slot} is unknown ({shape})")
            if dtype is None:
                raise ShapeError(f"{node.describe()}: dtype of output {slot} is unknown")
    return shapes, dtypes


def _readable_in_place(array: Any, buffer: np.ndarray) -> bool:
    """Whether ``array`` can stand for the input ``buffer`` for readers pointed at it: a
    NumPy array of its shape and dtype, C-contiguous and aligned (the caller's batch as it
    is, no rows padded, nothing converted)."""
    return type(array) is np.ndarray and array.shape == buffer.shape and \
        array.dtype == buffer.dtype and array.flags.c_contiguous and array.flags.aligned


def _point_back(pointed: list[tuple[Any, tuple[Any, ...]]]) -> None:
    """The readers `Plan._fill_inputs` pointed away pointed at their buffers again: a
    step called outside a run reads the plan's own input."""
    for buffer, pointers in pointed:
        address = buffer.ctypes.data
        for point in pointers:
            point(address)


def _readers(graph: Graph) -> dict[tuple[int, int], list[Reader]]:
    """Per entry (node, output slot) of ``graph``: the inputs of nodes and the graph's
    outputs that read it (`Workspace.readers`)."""
    readers: dict[tuple[int, int], list[Reader]] = {}
    for node in graph.nodes:
        for position, entry in enumerate(node.inputs):
            readers.setdefault((entry.node, entry.index), []).append(
                Reader(node.op, node.params, position))
    for position, entry in enumerate(graph.heads):
        readers.setdefault((entry.node, entry.index), []).append(Reader(None, None, position))
    return readers


def _chain_expansions(steps: list[Step]) -> list[Step]:
    """The steps with each 1×1 expansion and the depthwise step after it that reads it made
    one step where they chain (`expansion_chain.pair`): armed, one job of the cores in place
    of two; named by the depthwise node."""
    chained: list[Step] = []
    for step in steps:
        call = expansion_chain.pair(chained[-1].call, step.call) if chained else None
        if call is None:
            chained.append(step)
        else:
            chained[-1] = Step(call, step.node)
    return chained


def _buffer_view(buffer: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    count = int(np.prod(shape, dtype=np.int64))
    return buffer[:count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


def _bind_view(arrays: dict, index: int, node: Node, params: Any, args: list, xp: Any) -> bool:
    """Bind a reshape-like output once, at compile time, when the kernel really returns a view."""
    outputs = node.opdef.compute(xp, params, args)
    if not xp.shares_memory(outputs[0], args[0]):
        return False
    arrays[(index, 0)] = outputs[0]
    return True


def _scratch_bytes(graph: Graph, shapes: list, dtypes: list) -> int:
    """The largest scratch any bound op of ``graph`` asks for (see `OpDef.scratch`)."""
    need = 0
    for node in graph.nodes:
        if node.is_variable:
            continue
        op = node.opdef
        if op.scratch is not None:
            entries = [(entry.node, entry.index) for entry in node.inputs]
            need = max(need, op.scratch(node.params, [shapes[n][i] for n, i in entries],
                                        dtypes[entries[0][0]][entries[0][1]]))
    return need
