"""`ModelStats`: what a model's plans and caches hold, and what shapes would need.

Memory accounting reads the plans (compiling one it is asked about first: a server's compile
step compiles the plans it measures at load, `engine.runtime.compile`); estimates from shape
inference alone allocate and compile nothing, so that a server can refuse a model before
trying.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.compiler.plan_memory import naive_bytes
from engine.errors import InputError
from engine.graph.infer import infer_dtypes, infer_shapes
from engine.graph.ir import Graph
from engine.runtime.binding import Binding
from engine.runtime.inputs import InputChecker
from engine.runtime.plan import Plan
from engine.runtime.plan_cache import PlanCache
from engine.runtime.signature import Signature
from engine.runtime.staged import StagedPlan


class ModelStats:
    """Counts, bytes and cache statistics of one model (its graph before and after the
    compiler passes, its parameters, its `PlanCache` and the `InputChecker`'s shape cache)."""

    def __init__(self, binding: Binding, checker: InputChecker, cache: PlanCache,
                 passes: list[str], optimized_graph: Graph | None) -> None:
        self._binding = binding
        self._checker = checker
        self._cache = cache
        self._passes = passes
        self._optimized = optimized_graph

    def stats(self) -> dict[str, Any]:
        """Node and step counts before/after optimisation and memory of each cached plan."""
        plans = [self.plan_stats(signature, entry.plan)
                 for signature, entry in self._cache.plans.items()]
        graph = self._binding.graph
        operator_nodes = sum(1 for node in graph.nodes if not node.is_variable)
        optimized = self._optimized
        return {"passes": list(self._passes), "param_bytes": self._binding.param_bytes,
                "derived_bytes": self._cache.derived_bytes,
                "device": self._cache.backend.name,
                "nodes": operator_nodes,
                "optimized_nodes": operator_nodes if optimized is None else sum(
                    1 for node in optimized.nodes if not node.is_variable),
                "plans": plans, "caches": self.cache_stats()}

    def plan_stats(self, signature: Signature, plan: Plan | StagedPlan) -> dict[str, Any]:
        """One plan's inputs, step count, memory and execution stats."""
        return {"inputs": {name: list(shape) for name, shape in signature.shapes().items()},
                "steps": len(plan.steps),
                "planned_activation_bytes": plan.memory.planned_bytes,
                "optimized_graph_activation_bytes": plan.memory.naive_bytes,
                "workspace_bytes": plan.workspace.nbytes,
                "naive_activation_bytes": self.naive_bytes(signature),
                **plan.execution_stats()}

    def cache_stats(self) -> dict[str, dict[str, int]]:
        """Entries, capacity and evictions of the plan and shape caches (each LRU-bounded)."""
        caches = {"plans": self._cache.plans, "shapes": self._checker.shape_cache}
        return {name: {"entries": len(cache), "capacity": cache.capacity,
                       "evictions": cache.evictions} for name, cache in caches.items()}

    def naive_bytes(self, signature: Signature) -> int:
        """Activation bytes of the unoptimised graph with no reuse: the imperative baseline."""
        binding = self._binding
        graph = binding.graph
        shapes, dtypes = signature.shapes(), signature.dtypes()
        return naive_bytes(graph, infer_shapes(graph, {**binding.param_shapes, **shapes}),
                           infer_dtypes(graph, {**binding.param_dtypes, **dtypes}))

    def estimate_activation_bytes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> int:
        """An upper bound on activation bytes for these shapes, from shape inference alone.

        Nothing is allocated or compiled, so a server can refuse a model whose shapes would need
        more memory than it may use before trying. (The unoptimised graph's total, no reuse.)
        """
        inputs = self._binding.inputs
        return self.naive_bytes(Signature.from_specs(
            {spec.name: input_shapes[spec.name] for spec in inputs},
            {spec.name: spec.dtype for spec in inputs}))

    def activation_bytes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> int:
        """Planned activation bytes for these input shapes, with the plan's working memory
        (compiles the plan if needed); 0 for shapes the model does not take, as no plan for
        them can exist."""
        feed = {spec.name: np.zeros(input_shapes[spec.name], spec.dtype)
                for spec in self._binding.inputs}
        if self._cache.graph is None:
            return 0
        try:
            self._checker.shapes_for(feed)
        except InputError:
            return 0
        plan = self._cache.entry(Signature.of(feed)).plan
        return plan.memory.planned_bytes + plan.workspace.nbytes
