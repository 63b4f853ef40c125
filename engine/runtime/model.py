"""`Model`: an exported graph bound to its parameters, ready to run on named inputs.

The facade over the parts that each do one job: `Binding` (parameters, inputs, outputs),
`InputChecker` (names, dtypes, shapes per signature), `PlanCache` (plans per signature, batch
buckets, spares), `RowSplitter` (CPU batches over cores), `ModelStats` (memory and counts) and
the compile step (`engine.runtime.compile`). `Model` runs calls through them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from engine.compiler import optimize_graph, select_passes
from engine.compiler.layout_weights import column_major_weights
from engine.compiler.pack_weights import pack_dense_weights, packed_dense_weights
from engine.device import Device, get_device
from engine.graph.ir import Graph
from engine.runtime.binding import Binding, TensorSpec, own_parameters
from engine.runtime.buffers import BatchBuffers, HostBatch, PlanBatch
from engine.runtime.compile import CompileReport, CompileTarget, PlanCompiler
from engine.runtime.floats import quiet_floats, restore_floats
from engine.runtime.inputs import InputChecker, UnknownShape
from engine.runtime.int8 import checked_calibration, int8_graph, is_int8_export
from engine.runtime.interpreter import evaluate
from engine.runtime.lru import DEFAULT_CAPACITY, LRUCache
from engine.runtime.parameters import Parameters
from engine.runtime.plan import Plan
from engine.runtime.plan_cache import PlanCache, checked_buckets, run_bucketed
from engine.runtime.precision import check_name
from engine.runtime.precision import resolve as resolve_precision
from engine.runtime.row_split import RowSplitter
from engine.runtime.signature import Signature
from engine.runtime.staged import StagedPlan, dynamic_nodes, shape_blocker
from engine.runtime.stats import ModelStats


class Model:
    """A graph with bound parameters; `infer` runs it on a dict of named numpy arrays.

    Build one with `engine.load_model`. `infer` is thread-safe. On the CPU a batch whose rows
    are independent runs over several cores (`engine.runtime.batch_split`, docs/threads.md).

    Example:
        >>> model = engine.load_model("mlp-symbol.json", "mlp-0000.params")
        >>> model.infer({"data": np.zeros((1, 512), np.float32)})["dense2_fwd_output"].shape
        (1, 2)
    """

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray], *,
                 device: str | Device | Any = "cpu", optimize: bool | list[str] = True,
                 batch_buckets: Iterable[int] | None = None,
                 plan_cache_size: int = DEFAULT_CAPACITY, keep_batch: bool = False,
                 precision: str = "fp32", calibration: Mapping[str, Any] | None = None,
                 calibration_settings: Any = None) -> None:
        self.graph = graph
        self.keep_batch = keep_batch
        self.backend: Device = get_device(device)
        self.device = self.backend.kind  # "cpu" or "gpu": what "auto" resolved to
        # What the matrix products compute in: asked for, and run (fp32 where the host has
        # no bf16 path, or a float32 model no int8 kernels).
        self.requested_precision = check_name(precision)
        self.precision = resolve_precision(
            precision, self.device, int8_export=precision == "int8" and is_int8_export(graph))
        self.passes = select_passes(optimize)
        buckets = checked_buckets(batch_buckets)
        binding = Binding(graph, params)
        # What runs: the graph itself, or (int8) its quantized form; `reference` runs `graph`.
        self.run_graph = graph if self.precision != "int8" else int8_graph(
            graph, binding.params, calibration, calibration_settings)
        if self.requested_precision == "int8" and self.precision != "int8":
            # Fallen back to fp32: the calibration arguments are still refused as int8 would.
            checked_calibration(graph, binding.params, calibration, calibration_settings)
        # Why some output shapes depend on the input values (None: the input shapes fix them
        # all). Such a model compiles `StagedPlan`s, never pads a batch up to a bucket (padded
        # rows would change its results) and is not batched across requests by a server.
        self.data_dependent: str | None = shape_blocker(graph)
        packs = self._packs_dense_weights()
        if packs:
            # Held only as our GEMM's panels from here on, packed from the arrays as read:
            # never laid out anew, never a second copy (`pack_weights`).
            binding.params.update(packed_dense_weights(
                self.run_graph.replace(constants=binding.params)))
        if "layout_weights" in self.passes:
            # Bound in the order the pass lays them out in: one copy of each weight, not two.
            binding.params.update(column_major_weights(
                self.run_graph.replace(constants=binding.params)))
        own_parameters(binding.params)
        self.input_names = binding.input_names
        self.output_names = binding.output_names
        self.inputs: list[TensorSpec] = binding.inputs
        self.outputs: list[TensorSpec] = binding.outputs
        optimized = (optimize_graph(self.run_graph.replace(constants=binding.params), self.passes)
                     if optimize is not False else None)
        # The passes may leave a dense weight of their own (a BatchNorm folded into it).
        self.optimized_graph = pack_dense_weights(optimized) if packs else optimized
        # Each parameter in the one form the model holds it in (`Parameters`).
        self.params = binding.params = Parameters.packed_where(
            binding.params, optimized.constants, self.optimized_graph.constants) \
            if packs else Parameters(binding.params)
        # Inferred shapes and compiled plans are cached per input `Signature`, each cache
        # bounded (LRU) so that clients sending ever new shapes cannot exhaust memory.
        self._checker = InputChecker(binding, keep_batch, plan_cache_size)
        self._cache = PlanCache(self.optimized_graph, passes=self.passes, backend=self.backend,
                                capacity=plan_cache_size, data_dependent=self.data_dependent,
                                buckets=buckets,
                                precision="fp32" if self.precision == "int8" else self.precision)
        # A CPU batch may run as runs of rows on several cores (`RowSplitter`); why this model
        # never splits (None: it may).
        self._splitter = RowSplitter(self.run_graph, self.input_names, self._checker, self._cache)
        self.split_blocker: str | None = self._splitter.blocker
        self._stats = ModelStats(binding, self._checker, self._cache, self.passes,
                                 self.optimized_graph)
        self._bind_call_paths()

    def _packs_dense_weights(self) -> bool:
        """Whether this model holds its dense weights that our GEMM multiplies as the GEMM's
        panels alone: on the CPU, its plans computing in float32 (int8's too, for the dense
        layers left in float32) over shapes the input shapes fix (`pack_weights`)."""
        return ("pack_weights" in self.passes and not self.backend.is_gpu
                and self.precision in ("fp32", "int8") and self.data_dependent is None
                and not dynamic_nodes(self.run_graph))

    @property
    def param_bytes(self) -> int:
        """Bytes the parameters hold: each array's, a dense weight held packed its panels'."""
        return self.params.nbytes

    def _bind_call_paths(self) -> None:
        """What the per-call paths use, bound once: each is one attribute of the model, as it
        was before the parts were split out (`infer` at batch 1 takes microseconds)."""
        self._plans = self._cache.plans
        self._device_constants = self._cache.device_constants
        self._free = self._cache.free
        self._entry = self._cache.entry
        self._bucketed = self._cache.bucketed
        self._check_inputs = self._checker.check
        self._shapes_for = self._checker.shapes_for
        self._row_runs = self._splitter.row_runs
        self._run_rows = self._splitter.run_rows

    @property
    def batch_buckets(self) -> tuple[int, ...] | None:
        """Batch sizes a batch is padded up to (the smallest that holds its rows), so that few
        plans serve every batch size; None runs each batch size exactly."""
        return self._cache.buckets

    @batch_buckets.setter
    def batch_buckets(self, buckets: Iterable[int] | None) -> None:
        self._cache.buckets = buckets

    @property
    def concurrent_runs(self) -> int:
        """Runs of one signature at once, each in its own copy of the plan: with n >= 2, a call
        finding its signature's plan running on another thread runs a free one of n - 1
        spares instead (on a GPU each on its own stream: one batch's host copies and the next
        batch's arrival then overlap the other's kernels; the server's instances)."""
        return self._cache.concurrent_runs

    @concurrent_runs.setter
    def concurrent_runs(self, runs: int) -> None:
        self._cache.concurrent_runs = runs

    @property
    def batch_axes(self) -> dict[str, int] | None:
        """Where the batch lies in each input and output, by name (absent: axis 0), as
        ``keep_batch`` checks it; None: no batch dimension (nothing is checked)."""
        return self._checker.batch_axes

    @batch_axes.setter
    def batch_axes(self, axes: Mapping[str, int] | None) -> None:
        self._checker.batch_axes = None if axes is None else dict(axes)
        self._checker.shape_cache = LRUCache(self._checker.shape_cache.capacity)
        self._cache.uncheck(0)  # every signature goes through the checks again
        if axes is None or any(axes.values()):
            # Runs of rows are cut along axis 0, which is not this model's batch.
            self._splitter.blocker = "its batch is not axis 0 of every tensor"
            self.split_blocker = self._splitter.blocker

    def unknown_shape(self, input_shapes: Mapping[str, tuple[int, ...]]
                      ) -> UnknownShape | None:
        """The node whose output shape these input shapes leave unknown (no plan compiles for
        them), or None (see `InputChecker.unknown_shape`)."""
        return self._checker.unknown_shape(input_shapes)

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the model; return outputs by name, in head order.

        Raises:
            InputError: unknown or missing input names, or shapes/dtypes the model cannot take.
            ExecutionError: a kernel failed (names the node).
        """
        # Inputs with the exact signature of a previous call's unconverted, checked arrays
        # need no checks: one lookup finds the plan. (`run` without the names, inlined: this
        # is the batch-1 path.)
        key = Signature.lookup_key(inputs)
        entry = self._plans.get(key)  # type: ignore[arg-type]
        if entry is not None and entry.checked and entry.still_whole():
            outputs = self._free(entry).run(inputs)
        else:
            outputs = self._run_checked(inputs, key)
        if len(outputs) == 1:  # a dict display: 0.3 µs less than dict(zip()) at batch 1
            return {self.output_names[0]: outputs[0]}
        return dict(zip(self.output_names, outputs))

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The reference interpreter's outputs on ``inputs``: the graph as written, run op by
        op in float32 with no compiled plan, whatever the model's `precision` (what a bf16
        model is checked against). Same checks and errors as `infer`."""
        feed = self._check_inputs(inputs)
        outputs = self._evaluate(feed, self._shapes_for(feed))
        return dict(zip(self.output_names, (np.asarray(value) for value in outputs)))

    def run(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """`infer`'s outputs as a list in head order (`output_names`), for callers that know
        the order (a hybridized block); the same checks, conversions and cached plans."""
        key = Signature.lookup_key(inputs)
        entry = self._plans.get(key)  # type: ignore[arg-type]
        if entry is not None and entry.checked and entry.still_whole():
            return self._free(entry).run(inputs)
        return self._run_checked(inputs, key)

    def _run_checked(self, inputs: Mapping[str, Any], key: tuple | None) -> list[np.ndarray]:
        """Check and convert ``inputs`` (whose `Signature.lookup_key` is ``key``), then run
        them through the interpreter or their plan."""
        feed = self._check_inputs(inputs)
        shapes = self._shapes_for(feed)
        if self.optimized_graph is None:
            # (the shapes are the float graph's nodes'; an int8 graph infers its own)
            outputs = (self._evaluate(feed, shapes) if self.run_graph is self.graph
                       else self._evaluate(feed, None, self.run_graph))
        else:
            bounds, whole_while_blas_alone = self._row_runs(feed)
            if bounds is not None:
                outputs = self._run_rows(feed, bounds)
            else:
                outputs = self._run_plan(feed, key, whole_while_blas_alone)
        return [np.asarray(value) for value in outputs]

    def _run_plan(self, feed: dict[str, np.ndarray], key: tuple | None,
                  whole_while_blas_alone: bool = False) -> list[np.ndarray]:
        """Run ``feed`` (checked inputs) through its plan. ``key`` is the lookup key of the
        arrays the caller passed: when it is ``feed``'s signature (nothing was converted) and
        the plan is for exactly these shapes, later calls with that key skip the checks (with
        ``whole_while_blas_alone``, only while BLAS keeps to one thread, as the batch would
        split on more)."""
        exact = Signature.of(feed)
        signature = self._bucketed(exact)
        entry = self._entry(signature)
        if signature == exact and key == exact:
            entry.checked = True
            entry.whole_while_blas_alone = whole_while_blas_alone
        return run_bucketed(self._free(entry), feed, exact, signature)

    def _evaluate(self, feed: dict[str, np.ndarray], shapes: list | None,
                  graph: Graph | None = None) -> list[np.ndarray]:
        """The reference interpreter, on this model's device (on ``graph``, else the float
        graph)."""
        token = quiet_floats()  # log(0) = -inf is a result here, as in MXNet, not a warning
        try:
            return self._evaluate_quietly(feed, shapes, graph or self.graph)
        finally:
            restore_floats(token)

    def _evaluate_quietly(self, feed: dict[str, np.ndarray], shapes: list | None,
                          graph: Graph) -> list[np.ndarray]:
        if not self.backend.is_gpu:
            return evaluate(graph, {**self.params, **feed}, np, shapes)
        with self.backend.activate():
            values = {name: self._device_constant(name) for name in self.params}
            values.update({name: self.backend.asarray(array) for name, array in feed.items()})
            outputs = evaluate(graph, values, self.backend.xp, shapes)
            return [self.backend.to_host(output) for output in outputs]

    def _device_constant(self, name: str) -> Any:
        array = self._device_constants.get(name)
        if array is None:
            array = self._device_constants[name] = self.backend.asarray(self.params[name])
        return array

    def plan_for(self, feed: Mapping[str, np.ndarray]) -> Plan | StagedPlan:
        """The compiled plan for these inputs' shapes and dtypes (compiled on first use)."""
        if self.optimized_graph is None:
            raise ValueError("a model loaded with optimize=False runs the reference "
                             "interpreter and has no plans")
        return self._entry(Signature.of(feed)).plan

    def compile(self, targets: Iterable[CompileTarget]) -> CompileReport:
        """Compile now the plans each target needs (see `CompileTarget`), each once, and
        report them with their purposes, seconds and bytes (`engine.runtime.compile`).

        Raises:
            CompileFailed: names the target whose shapes do not fit or whose plan failed.
        """
        splitter = self._splitter
        return PlanCompiler(self._checker, self._cache, splitter.row_runs,
                            splitter.part_plans).compile(targets)

    def warm(self, inputs: Mapping[str, Any], runs: int | None = None) -> None:
        """Compile, and run ``runs`` times, every plan a call with these inputs may use (the
        spares too when `concurrent_runs` is 2 or more), so that the first requests of this
        shape wait for no compilation (on a GPU: cuDNN graphs and, after the warm-up runs,
        CUDA graph capture). ``runs`` None: as many as make a plan ready, once on the CPU, on
        a GPU its warm-up runs and the one that captures."""
        if runs is None:
            runs = 1
            if self.backend.is_gpu:
                from engine.cuda.executor import WARMUP_RUNS

                runs = WARMUP_RUNS + 1
        for _ in range(runs):
            self.infer(inputs)
        if self.concurrent_runs < 2 or self.optimized_graph is None:
            return
        feed = self._check_inputs(inputs)
        entry = self._entry(self._bucketed(Signature.of(feed)))
        for index in range(1, self.concurrent_runs):
            spare = self._cache.replica(entry, index)
            for _ in range(runs):
                spare.run(feed, copy_outputs=False)

    def batch_buffers(self, example: Mapping[str, np.ndarray], rows: int) -> BatchBuffers:
        """Where to join a batch of ``rows`` rows of requests shaped like ``example`` (one of
        them), and the run of it: on a GPU the first rows of a free plan's pinned input
        buffers, held until the `BatchBuffers` is left (so the rows are copied once, straight
        to where the device reads them); elsewhere fresh host arrays run by `infer`.

        Raises:
            InputError: names, dtypes or shapes the model cannot take (as `infer` would).
        """
        held = self._reserve_plan(example, rows) if self.backend.is_gpu else None
        if held is None:
            return HostBatch(example, rows, self.infer)
        return PlanBatch(held, rows, self.output_names)

    def _reserve_plan(self, example: Mapping[str, np.ndarray], rows: int) -> Any:
        """A free plan (or its spare) for ``rows`` rows like ``example``, held; None where the
        model has no plan with pinned buffers to hold (interpreter, data-dependent shapes)."""
        if self.optimized_graph is None or self.data_dependent is not None \
                or any(not np.ndim(array) for array in example.values()):
            return None
        # Check names and dtypes on empty views (nothing converted), shapes at the batch's size.
        feed = self._check_inputs({name: np.asarray(array)[:0] for name, array in example.items()})
        joined = {name: np.broadcast_to(np.zeros((), array.dtype), (rows, *array.shape[1:]))
                  for name, array in feed.items()}
        self._shapes_for(joined)
        entry = self._entry(self._bucketed(Signature.of(joined)))
        if not isinstance(entry.plan, Plan):
            return None
        held = entry.plan.reserve(blocking=False)
        for index in range(1, self.concurrent_runs):
            if held is not None:
                break
            held = self._cache.replica(entry, index).reserve(blocking=False)
        return held or entry.plan.reserve()

    def threads_changed(self) -> None:
        """`batch_split.set_threads` was called: batches of two rows or more go through the
        checks again, where whether they split is decided."""
        self._splitter.threads_changed()

    def stats(self) -> dict[str, Any]:
        """Node and step counts before/after optimisation and memory of each cached plan."""
        return self._stats.stats()

    def plan_signatures(self) -> list[tuple[tuple[str, tuple[int, ...]], ...]]:
        """Input shapes of the plans cached now, each as sorted (name, shape) pairs."""
        return self._cache.signatures()

    def release_plans(self) -> None:
        """Forget every compiled plan and the values derived for them, a plan at a time, so
        that other threads (a server's event loop) run between (`PlanCache.release`): for a
        model leaving service. A later `infer` compiles its plans again."""
        self._cache.release()

    def cache_stats(self) -> dict[str, dict[str, int]]:
        """Entries, capacity and evictions of the plan and shape caches (each LRU-bounded)."""
        return self._stats.cache_stats()

    @property
    def derived_bytes(self) -> int:
        """Bytes of values derived from parameters when plans bind (Winograd's weights)."""
        return self._cache.derived_bytes

    def estimate_activation_bytes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> int:
        """An upper bound on activation bytes for these shapes, from shape inference alone
        (nothing allocated or compiled; see `ModelStats.estimate_activation_bytes`)."""
        return self._stats.estimate_activation_bytes(input_shapes)

    def output_shapes(self, input_shapes: Mapping[str, tuple[int, ...]]
                      ) -> dict[str, tuple[int, ...] | None]:
        """Output shapes for these input shapes, from shape inference alone (not cached).

        Raises:
            InputError: the shapes do not fit; names the inputs, the node, its op and shapes.
        """
        return self._checker.output_shapes(input_shapes)

    def activation_bytes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> int:
        """Planned activation bytes for these input shapes, with the plan's working memory
        (compiles the plan if needed; `compile` it first to measure without compiling); 0 for
        shapes the model does not take, as no plan for them can exist."""
        return self._stats.activation_bytes(input_shapes)

    def profile(self, inputs: Mapping[str, Any], repeat: int = 10) -> dict[str, float]:
        """Mean seconds per op type for these inputs (needs ``optimize`` other than False)."""
        if self.optimized_graph is None:
            raise ValueError("profiling times plan steps; load the model with optimize=True")
        feed = self._check_inputs(inputs)
        self._shapes_for(feed)
        return self.plan_for(feed).profile(feed, repeat)
