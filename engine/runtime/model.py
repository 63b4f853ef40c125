"""`Model`: an exported graph bound to its parameters, ready to run on named inputs."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from engine.compiler import optimize_graph, select_passes
from engine.compiler.plan_memory import naive_bytes
from engine.cpu import blas_threads
from engine.device import Device, get_device
from engine.errors import InputError, ModelFormatError, ShapeError
from engine.graph.complete import complete_input_shapes, upstream_inputs
from engine.graph.infer import NodeShapeError, declared_dtype, infer_dtypes, infer_shapes
from engine.graph.ir import Graph
from engine.runtime import batch_split
from engine.runtime.buffers import BatchBuffers, HostBatch, PlanBatch
from engine.runtime.floats import quiet_floats, restore_floats
from engine.runtime.interpreter import evaluate
from engine.runtime.lru import DEFAULT_CAPACITY, LRUCache
from engine.runtime.plan import Plan
from engine.runtime.signature import Signature
from engine.runtime.staged import StagedPlan, dynamic_nodes, shape_blocker

# Op input slots that only ever hold learned parameters or auxiliary states: a variable wired
# only into these and absent from the params file is a missing parameter, not a model input.
PARAMETER_SLOTS = frozenset({"weight", "bias", "gamma", "beta", "moving_mean", "moving_var",
                             "parameters"})


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (-1 where unknown, None when nothing is known) and dtype of an input/output."""

    name: str
    shape: tuple[int, ...] | None
    dtype: np.dtype


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
                 plan_cache_size: int = DEFAULT_CAPACITY, keep_batch: bool = False) -> None:
        self.graph = graph
        self.keep_batch = keep_batch
        self.backend: Device = get_device(device)
        self.device = self.backend.kind  # "cpu" or "gpu": what "auto" resolved to
        self.passes = select_passes(optimize)
        self._batch_buckets = _checked_buckets(batch_buckets)
        self.params = _bind_params(graph, params)
        self.input_names = [name for name in graph.variable_names() if name not in self.params]
        self.output_names = _unique(graph.output_names())
        self.param_bytes = sum(array.nbytes for array in self.params.values())
        self._param_shapes = {name: array.shape for name, array in self.params.items()}
        self._param_dtypes = {name: array.dtype for name, array in self.params.items()}
        self._declared_dtypes = _declared_input_dtypes(graph, self.input_names)
        # Inferred shapes and compiled plans are cached per input `Signature`, each cache
        # bounded (LRU) so that clients sending ever new shapes cannot exhaust memory.
        self._shape_cache: LRUCache[Signature, list] = LRUCache(plan_cache_size)
        self._plans: LRUCache[Signature, _SignaturePlans] = LRUCache(plan_cache_size)
        self._lock = threading.Lock()
        self.inputs, self.outputs = self._describe()
        self.optimized_graph = (optimize_graph(graph.replace(constants=self.params), self.passes)
                                if optimize is not False else None)
        # Why some output shapes depend on the input values (None: the input shapes fix them
        # all). Such a model compiles `StagedPlan`s, never pads a batch up to a bucket (padded
        # rows would change its results) and is not batched across requests by a server.
        self.data_dependent: str | None = shape_blocker(graph)
        self._plan_cache_size = plan_cache_size
        # With 2, a call finding its signature's plan running on another thread runs a spare
        # plan instead: on a GPU one batch's host copies and the next batch's arrival then
        # overlap the other's kernels.
        self.concurrent_runs = 1
        self._device_constants: dict[str, Any] = {}  # parameters on the GPU, shared by plans
        self._derived: dict = {}  # values ops derive from parameters (`Workspace.derived`)
        # A CPU batch may run as runs of rows on several cores (`batch_split`): the nodes
        # carrying the batch, why this model never splits (None: it may), and per signature
        # the batch's estimated work, 0 where its rows do not split.
        self._batch_nodes = batch_split.input_dependent(graph, set(self.input_names))
        self.split_blocker: str | None = self._find_split_blocker()
        self._batch_work: LRUCache[Signature, int] = LRUCache(plan_cache_size)
        batch_split.watch(self)

    @property
    def batch_buckets(self) -> tuple[int, ...] | None:
        """Batch sizes a batch is padded up to (the smallest that holds its rows), so that few
        plans serve every batch size; None runs each batch size exactly."""
        return self._batch_buckets

    @batch_buckets.setter
    def batch_buckets(self, buckets: Iterable[int] | None) -> None:
        self._batch_buckets = _checked_buckets(buckets)
        for _, entry in self._plans.items():  # the exact plans of bucketed sizes now go unused
            entry.checked = False

    def _describe(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        try:
            inputs = complete_input_shapes(self.graph, self._param_shapes, self.input_names)
            shapes = infer_shapes(self.graph, {**self._param_shapes, **inputs})
            dtypes = infer_dtypes(self.graph, {**self._param_dtypes, **self._declared_dtypes})
        except ShapeError as error:
            raise ModelFormatError(f"parameters do not fit the graph: {error}") from None
        index = {self.graph.nodes[i].name: i for i in self.graph.variable_indices()}
        inputs = [TensorSpec(name, _spec_shape(shapes[index[name]][0]),
                             np.dtype(dtypes[index[name]][0] or np.float32))
                  for name in self.input_names]
        outputs = [TensorSpec(name, _spec_shape(shapes[entry.node][entry.index]),
                              np.dtype(dtypes[entry.node][entry.index] or np.float32))
                   for name, entry in zip(self.output_names, self.graph.heads)]
        return inputs, outputs

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
            outputs = self._evaluate(feed, shapes)
        else:
            bounds, whole_while_blas_alone = self._row_runs(feed)
            if bounds is not None:
                outputs = self._run_rows(feed, bounds)
            else:
                outputs = self._run_plan(feed, key, whole_while_blas_alone)
        return [np.asarray(value) for value in outputs]

    def _evaluate(self, feed: dict[str, np.ndarray], shapes: list) -> list[np.ndarray]:
        """The reference interpreter, on this model's device."""
        token = quiet_floats()  # log(0) = -inf is a result here, as in MXNet, not a warning
        try:
            return self._evaluate_quietly(feed, shapes)
        finally:
            restore_floats(token)

    def _evaluate_quietly(self, feed: dict[str, np.ndarray], shapes: list) -> list[np.ndarray]:
        if not self.backend.is_gpu:
            return evaluate(self.graph, {**self.params, **feed}, np, shapes)
        with self.backend.activate():
            values = {name: self._device_constant(name) for name in self.params}
            values.update({name: self.backend.asarray(array) for name, array in feed.items()})
            outputs = evaluate(self.graph, values, self.backend.xp, shapes)
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

    def _entry(self, signature: Signature) -> _SignaturePlans:
        """The cached plans of ``signature``, compiling its plan on first use."""
        entry = self._plans.get(signature)
        if entry is None:
            with self._lock:
                entry = self._plans.get(signature)
                if entry is None:
                    entry = _SignaturePlans(signature, self._compile(signature))
                    self._plans.put(signature, entry)
        return entry

    def warm(self, inputs: Mapping[str, Any], runs: int | None = None) -> None:
        """Compile, and run ``runs`` times, every plan a call with these inputs may use (the
        spare too when `concurrent_runs` is 2), so that the first requests of this shape wait
        for no compilation (on a GPU: cuDNN graphs and, after the warm-up runs, CUDA graph
        capture). ``runs`` None: as many as make a plan ready, once on the CPU, on a GPU its
        warm-up runs and the one that captures."""
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
        spare = self._spare(self._entry(self._bucketed(Signature.of(feed))))
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
        if held is None and self.concurrent_runs > 1:
            held = self._spare(entry).reserve(blocking=False)
        return held or entry.plan.reserve()

    def _bucketed(self, signature: Signature) -> Signature:
        """The signature of the plan that runs inputs of ``signature``: padded to the
        smallest batch bucket holding their rows, or the signature itself."""
        if self.data_dependent is not None:
            return signature
        bucket = _bucket(self._batch_buckets, signature.rows())
        return signature if bucket is None else signature.with_rows(bucket)

    def _free(self, entry: _SignaturePlans) -> Plan | StagedPlan:
        """The entry's plan, or its spare when another thread runs it and `concurrent_runs`
        allows."""
        if self.concurrent_runs < 2 or not entry.plan.busy:
            return entry.plan
        return self._spare(entry)

    def _spare(self, entry: _SignaturePlans) -> Plan | StagedPlan:
        return self._replica(entry, 1)

    def _replica(self, entry: _SignaturePlans, index: int) -> Plan | StagedPlan:
        """The entry's plan (0), its spare (1) or a further copy, compiled on first use: runs
        of rows of one size in a split batch each take their own."""
        if index == 0:
            return entry.plan
        if len(entry.spares) < index:
            with self._lock:
                while len(entry.spares) < index:
                    entry.spares.append(self._compile(entry.signature))
        return entry.spares[index - 1]

    def _compile(self, signature: Signature) -> Plan | StagedPlan:
        assert self.optimized_graph is not None
        return self._compile_graph(self.optimized_graph, signature)

    def _compile_graph(self, graph: Graph, signature: Signature) -> Plan | StagedPlan:
        """A plan of ``graph`` for ``signature``: staged when some of its shapes depend on the
        data (each stage compiled here again, with the same options)."""
        if dynamic_nodes(graph):
            return StagedPlan(graph, signature, self._compile_graph, self._plan_cache_size,
                              self.backend.name)
        return Plan(graph, signature.shapes(), signature.dtypes(),
                    reuse_memory="plan_memory" in self.passes, device=self.backend,
                    constants=self._device_constants, derived=self._derived)

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
        return _run_bucketed(self._free(entry), feed, exact, signature)

    def _row_runs(self, feed: dict[str, np.ndarray]) -> tuple[list[tuple[int, int]] | None,
                                                              bool]:
        """The runs of rows to cut this CPU batch into (`batch_split`), or None to run it
        whole (rows not independent, one core allowed, too little work for each run); and
        whether a whole run stays whole only while BLAS keeps to one thread. Otherwise it
        stays whole until `batch_split.set_threads` is called (which makes a model check
        again), so later calls may skip the checks."""
        if self.split_blocker is not None:
            return None, False
        signature = Signature.of(feed)
        rows = signature.rows() or 0
        count = batch_split.parts(rows)
        if count < 2:  # where the count is not fixed, it follows BLAS's, now one
            return None, not batch_split.fixed(rows)
        work = self._batch_work.get(signature)
        if work is None:
            work = self._estimate_work(signature, rows)
            self._batch_work.put(signature, work)
        count = min(count, work // max(1, batch_split.MIN_PART_WORK))
        return (batch_split.part_bounds(rows, count) if count >= 2 else None), False

    def _estimate_work(self, signature: Signature, rows: int) -> int:
        """The work of a batch of ``signature`` that a split spreads (`batch_split.work`); 0
        when its rows do not split (shapes at one row do not follow the batch: `rows_follow`)."""
        whole = self._signature_shapes(signature)
        try:
            single = self._signature_shapes(signature.with_rows(1))
        except InputError:
            return 0
        if not batch_split.rows_follow(self.graph, self._batch_nodes, whole, rows, single, 1):
            return 0
        return batch_split.work(self.graph, self._batch_nodes, whole)

    def _run_rows(self, feed: dict[str, np.ndarray],
                  bounds: list[tuple[int, int]]) -> list[np.ndarray]:
        """Each run of rows through a plan of its own, all at once with one BLAS thread each;
        the outputs joined in row order."""
        feeds = [{name: array[start:stop] for name, array in feed.items()}
                 for start, stop in bounds]
        exact = [Signature.of(part) for part in feeds]
        planned = [self._bucketed(signature) for signature in exact]
        # Runs whose plans have one signature each take another copy of that plan.
        calls = [partial(self._run_part, part, signature, plan, planned[:index].count(plan))
                 for index, (part, signature, plan) in enumerate(zip(feeds, exact, planned))]
        with blas_threads.one_thread():
            results = batch_split.run_parts(calls)
        return [np.concatenate(column) for column in zip(*results)]

    def _run_part(self, feed: dict[str, np.ndarray], exact: Signature, signature: Signature,
                  replica: int) -> list[np.ndarray]:
        """``feed`` (a run of rows, of signature ``exact``) through copy ``replica`` of the
        plan for ``signature`` (``exact`` or its batch bucket)."""
        return _run_bucketed(self._replica(self._entry(signature), replica), feed, exact,
                             signature)

    def _find_split_blocker(self) -> str | None:
        """Why this model never runs a batch as runs of rows (see `batch_split`), or None."""
        if self.backend.is_gpu:
            return "it runs on a GPU"
        if self.optimized_graph is None:
            return "it runs the reference interpreter (optimize=False)"
        if self.data_dependent is not None:
            return f"its shapes depend on the data: {self.data_dependent}"
        return batch_split.split_blocker(self.graph, self._batch_nodes)

    def threads_changed(self) -> None:
        """`batch_split.set_threads` was called: batches of two rows or more go through the
        checks again, where whether they split is decided."""
        for signature, entry in self._plans.items():
            if (signature.rows() or 0) >= 2:
                entry.checked = False

    def stats(self) -> dict[str, Any]:
        """Node and step counts before/after optimisation and memory of each cached plan."""
        plans = [self._plan_stats(signature, entry.plan)
                 for signature, entry in self._plans.items()]
        operator_nodes = sum(1 for node in self.graph.nodes if not node.is_variable)
        optimized = self.optimized_graph
        return {"passes": list(self.passes), "param_bytes": self.param_bytes,
                "derived_bytes": self.derived_bytes,
                "device": self.backend.name,
                "nodes": operator_nodes,
                "optimized_nodes": operator_nodes if optimized is None else sum(
                    1 for node in optimized.nodes if not node.is_variable),
                "plans": plans, "caches": self.cache_stats()}

    def _plan_stats(self, signature: Signature, plan: Plan | StagedPlan) -> dict[str, Any]:
        return {"inputs": {name: list(shape) for name, shape in signature.shapes().items()},
                "steps": len(plan.steps),
                "planned_activation_bytes": plan.memory.planned_bytes,
                "optimized_graph_activation_bytes": plan.memory.naive_bytes,
                "workspace_bytes": plan.workspace.nbytes,
                "naive_activation_bytes": self._naive_bytes(signature),
                **plan.execution_stats()}

    def plan_signatures(self) -> list[tuple[tuple[str, tuple[int, ...]], ...]]:
        """Input shapes of the plans cached now, each as sorted (name, shape) pairs."""
        return [tuple(sorted(signature.shapes().items())) for signature in self._plans.keys()]

    def cache_stats(self) -> dict[str, dict[str, int]]:
        """Entries, capacity and evictions of the plan and shape caches (each LRU-bounded)."""
        caches = {"plans": self._plans, "shapes": self._shape_cache}
        return {name: {"entries": len(cache), "capacity": cache.capacity,
                       "evictions": cache.evictions} for name, cache in caches.items()}

    @property
    def derived_bytes(self) -> int:
        """Bytes of values derived from parameters when plans bind (Winograd's weights)."""
        return sum(int(value.nbytes) for _, value in list(self._derived.values()))

    def _naive_bytes(self, signature: Signature) -> int:
        """Activation bytes of the unoptimised graph with no reuse: the imperative baseline."""
        shapes, dtypes = signature.shapes(), signature.dtypes()
        return naive_bytes(self.graph, infer_shapes(self.graph, {**self._param_shapes, **shapes}),
                           infer_dtypes(self.graph, {**self._param_dtypes, **dtypes}))

    def estimate_activation_bytes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> int:
        """An upper bound on activation bytes for these shapes, from shape inference alone.

        Nothing is allocated or compiled, so a server can refuse a model whose shapes would need
        more memory than it may use before trying. (The unoptimised graph's total, no reuse.)
        """
        return self._naive_bytes(Signature.from_specs(
            {spec.name: input_shapes[spec.name] for spec in self.inputs},
            {spec.name: spec.dtype for spec in self.inputs}))

    def output_shapes(self, input_shapes: Mapping[str, tuple[int, ...]]
                      ) -> dict[str, tuple[int, ...] | None]:
        """Output shapes for these input shapes, from shape inference alone (not cached).

        Raises:
            InputError: the shapes do not fit; names the inputs, the node, its op and shapes.
        """
        known = {**self._param_shapes, **{name: tuple(shape)
                                          for name, shape in input_shapes.items()}}
        try:
            shapes = infer_shapes(self.graph, known)
        except ShapeError as error:
            raise InputError(self._misfit(known, error, list(input_shapes))) from None
        return {name: shapes[entry.node][entry.index]
                for name, entry in zip(self.output_names, self.graph.heads)}

    def activation_bytes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> int:
        """Planned activation bytes for these input shapes, with the plan's working memory
        (compiles the plan if needed); 0 for shapes the model does not take, as no plan for
        them can exist."""
        feed = {spec.name: np.zeros(input_shapes[spec.name], spec.dtype) for spec in self.inputs}
        if self.optimized_graph is None:
            return 0
        try:
            self._shapes_for(feed)
        except InputError:
            return 0
        plan = self.plan_for(feed)
        return plan.memory.planned_bytes + plan.workspace.nbytes

    def profile(self, inputs: Mapping[str, Any], repeat: int = 10) -> dict[str, float]:
        """Mean seconds per op type for these inputs (needs ``optimize`` other than False)."""
        if self.optimized_graph is None:
            raise ValueError("profiling times plan steps; load the model with optimize=True")
        feed = self._check_inputs(inputs)
        self._shapes_for(feed)
        return self.plan_for(feed).profile(feed, repeat)

    def _check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        unknown = [name for name in inputs if name not in self.input_names]
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are: "
                             f"{', '.join(self.input_names)}")
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise InputError(f"missing input {missing[0]!r}; the model's inputs are: "
                             f"{', '.join(self.input_names)}")
        feed = {}
        for spec in self.inputs:
            array = np.asarray(inputs[spec.name])
            feed[spec.name] = _coerce(spec, array, spec.name in self._declared_dtypes)
        return feed

    def _shapes_for(self, feed: Mapping[str, np.ndarray]) -> list:
        """Shape inference for these inputs' shapes, once per signature (cached)."""
        return self._signature_shapes(Signature.of(feed))

    def _signature_shapes(self, signature: Signature) -> list:
        shapes = self._shape_cache.get(signature)
        if shapes is None:
            known = {**self._param_shapes, **signature.shapes()}
            try:
                shapes = infer_shapes(self.graph, known)
            except ShapeError as error:
                raise InputError(self._misfit(known, error, signature.names())) from None
            if self.keep_batch:
                self._check_batch(known, shapes, signature.names())
            self._shape_cache.put(signature, shapes)
        return shapes

    def _check_batch(self, known: Mapping[str, tuple[int, ...]], shapes: list,
                     inputs: list[str]) -> None:
        """With `keep_batch`, refuse shapes that would give an output another number of rows
        than the inputs have (a reshape folding features into the batch): a server splits
        outputs by rows, so such a request cannot be answered."""
        rows = {known[name][0] for name in inputs if known[name]}
        if len(rows) != 1:
            return
        want = rows.pop()
        for name, entry in zip(self.output_names, self.graph.heads):
            shape = shapes[entry.node][entry.index]
            if shape and shape[0] and shape[0] != want:
                given = ", ".join(f"{key!r} shape {list(known[key])}" for key in inputs)
                raise InputError(f"input(s) {given} would give output {name!r} shape "
                                 f"{list(shape)}: {shape[0]} rows for {want}; outputs must keep "
                                 "the inputs' batch dimension first")

    def _misfit(self, known: Mapping[str, tuple[int, ...]], error: ShapeError,
                inputs: list[str]) -> str:
        """Why these input shapes do not fit: the inputs behind the failing node with their
        shapes, the node and its op (in `error`), and the shapes the node was given."""
        names = inputs
        seen = ""
        if isinstance(error, NodeShapeError):
            names = [name for name in upstream_inputs(self.graph, error.node_name)
                     if name in inputs] or inputs
            seen = f" (its inputs there: {error.input_shapes})"
        shapes = ", ".join(f"{name!r} shape {list(known[name])}" for name in names)
        verb = "does" if len(names) == 1 else "do"
        noun = "input" if len(names) == 1 else "inputs"
        return f"{noun} {shapes} {verb} not fit the model: {error}{seen}"


def _bucket(buckets: tuple[int, ...] | None, rows: int | None) -> int | None:
    """The smallest configured batch bucket holding ``rows`` (None: run the exact shape)."""
    if not buckets or rows is None:
        return None
    return next((size for size in buckets if size >= rows), None)


def _checked_buckets(buckets: Iterable[int] | None) -> tuple[int, ...] | None:
    """``buckets`` sorted, refused unless they are positive integers; None for none."""
    if buckets is None:
        return None
    sizes = tuple(buckets)
    wrong = [size for size in sizes
             if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1]
    if wrong:
        raise ValueError(f"batch_buckets must be positive integers; got {wrong[0]!r} in "
                         f"{list(sizes)}")
    return tuple(sorted({int(size) for size in sizes})) or None


class _SignaturePlans:
    """What a model keeps for one input signature: its plan, spare plans (the first compiled
    when a call finds the plan busy and `Model.concurrent_runs` allows two runs, more for the
    runs of rows of one size in a split batch), and whether inputs with exactly this signature
    were checked once (later ones then skip the checks, some only while BLAS keeps to one
    thread: `still_whole`)."""

    __slots__ = ("signature", "plan", "spares", "checked", "whole_while_blas_alone")

    def __init__(self, signature: Signature, plan: Plan | StagedPlan) -> None:
        self.signature = signature
        self.plan = plan
        self.spares: list[Plan | StagedPlan] = []
        self.checked = False
        self.whole_while_blas_alone = False

    def still_whole(self) -> bool:
        """Whether a checked batch still runs whole: always, or for a batch that would be
        cut into runs of rows on more BLAS threads, while BLAS keeps to one (0.2 µs to read;
        threadpoolctl may change it at any time)."""
        return not self.whole_while_blas_alone or blas_threads.threads() == 1

    @property
    def spare(self) -> Plan | StagedPlan | None:
        """The first spare plan, or None before one is compiled."""
        return self.spares[0] if self.spares else None


def _run_bucketed(plan: Plan | StagedPlan, feed: Mapping[str, np.ndarray], exact: Signature,
                  signature: Signature) -> list[np.ndarray]:
    """``feed`` (of signature ``exact``) through ``plan``, compiled for ``signature``: the
    same, or padded to a batch bucket, whose rows past the feed's are dropped."""
    if signature == exact:
        return plan.run(feed)
    # The plan for the bucket takes the rows as they are and zeroes the rest of its buffers.
    rows, bucket = exact.rows(), signature.rows()
    outputs = plan.run(feed, copy_outputs=False)
    return [out[:rows].copy() if out.ndim and out.shape[0] == bucket else out.copy()
            for out in outputs]


def _coerce(spec: TensorSpec, array: np.ndarray, declared: bool) -> np.ndarray:
    if array.dtype == spec.dtype:
        return array
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number)
                                     or array.dtype == np.bool_):
        raise InputError(f"input {spec.name!r}: dtype {array.dtype} is not numeric; "
                         f"expected {spec.dtype.name}")
    if declared and not np.can_cast(array.dtype, spec.dtype, "same_kind"):
        raise InputError(f"input {spec.name!r}: dtype {array.dtype.name} cannot be converted to "
                         f"the declared {spec.dtype.name}")
    if declared or array.dtype == np.float64:
        return array.astype(spec.dtype)
    return array


def _declared_input_dtypes(graph: Graph, input_names: list[str]) -> dict[str, np.dtype]:
    declared = {}
    for index in graph.variable_indices():
        node = graph.nodes[index]
        dtype = declared_dtype(node)
        if node.name in input_names and dtype is not None:
            declared[node.name] = dtype
    return declared


def _spec_shape(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if shape is None else tuple(dim if dim > 0 else -1 for dim in shape)


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}{count}")
    return unique


def _bind_params(graph: Graph, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Match parameter arrays to graph variables; refuse extra and missing parameters."""
    variables = set(graph.variable_names())
    extra = sorted(name for name in params if name not in variables)
    if extra:
        raise ModelFormatError(f"parameter {extra[0]!r} is not a variable of the graph "
                               f"({len(extra)} unused parameter(s))")
    for name, array in params.items():
        if array.dtype.kind not in "biuf":
            raise ModelFormatError(f"parameter {name!r} has dtype {array.dtype}; parameters "
                                   "must be numeric")
    if params:
        for name, node, slot in _parameter_slots(graph):
            if name not in params:
                raise ModelFormatError(f"parameter {name!r} (input {slot!r} of "
                                       f"{node.describe()}) is missing from the params file")
    return dict(params)


def _parameter_slots(graph: Graph) -> list[tuple[str, Any, str]]:
    """Variables that feed only parameter slots: (variable name, consuming node, slot name)."""
    feeds: dict[str, list[tuple[Any, str]]] = {}
    for node in graph.nodes:
        if node.is_variable:
            continue
        for slot, entry in zip(node.opdef.input_names(node.params), node.inputs):
            source = graph.nodes[entry.node]
            if source.is_variable:
                feeds.setdefault(source.name, []).append((node, slot))
    return [(name, uses[0][0], uses[0][1]) for name, uses in feeds.items()
            if all(slot in PARAMETER_SLOTS for _, slot in uses)]
