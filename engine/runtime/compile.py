"""The compile step: the plans a model should have ready, compiled now, by name, and timed.

Otherwise a plan compiles on its signature's first call (`PlanCache.entry`): a server's first
requests of each batch size would wait for it, and measuring a model's memory would compile
as a side effect. `Model.compile` takes `CompileTarget`s instead, each the shapes of a call to
come (padded to its batch bucket and cut into runs of rows as `Model.infer` would) or exactly
the shapes to measure, compiles every plan they need once, and returns a `CompileReport`: each
plan's inputs, batch bucket, what it is for, seconds to compile and bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import EngineError, InputError
from engine.runtime.inputs import InputChecker
from engine.runtime.plan_cache import PlanCache
from engine.runtime.signature import Signature

# What a model running the reference interpreter says of every target: it has no plans.
INTERPRETER = "the model runs the reference interpreter (optimize=False): it compiles no plans"


@dataclass(frozen=True)
class CompileTarget:
    """Shapes to have a plan ready for, and what for (``purpose``: a name for reports).

    ``dtypes`` (by input; None, or one left out: the model's input dtype) are converted as a
    call's would be. ``as_called``: the plans a call with these inputs runs (padded to its
    batch bucket; on the CPU cut into runs of rows where such a call would be), and with
    ``spare`` the spare plans a batch runs while the plan is busy (`Model.concurrent_runs`
    less one);
    False: exactly these shapes' plan, the one `Model.activation_bytes` measures. A target the
    model cannot take is an error (`CompileFailed`) unless ``required`` is False: then it is
    reported as skipped.
    """

    purpose: str
    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, Any] | None = None
    as_called: bool = True
    spare: bool = False
    required: bool = True


@dataclass(frozen=True)
class CompiledPlan:
    """One plan the compile step has ready: its input shapes and dtypes, the batch bucket it
    is the plan of (None: not a bucket), the purposes of the targets that needed it, how many
    copies of it this step compiled (the plan, spares; 0: all were compiled before) and in how
    many seconds, and its planned activation and working memory in bytes."""

    inputs: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    bucket: int | None
    purposes: tuple[str, ...]
    copies: int
    seconds: float
    planned_bytes: int
    workspace_bytes: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, shapes as lists."""
        return {"purposes": list(self.purposes),
                "inputs": {name: list(shape) for name, shape in self.inputs.items()},
                "dtypes": dict(self.dtypes), "bucket": self.bucket, "copies": self.copies,
                "seconds": round(self.seconds, 6), "planned_bytes": self.planned_bytes,
                "workspace_bytes": self.workspace_bytes}


@dataclass(frozen=True)
class CompileReport:
    """What a compile step did: each plan once, in the order first needed; the targets that
    got none, each as (purpose, why); and the seconds the whole step took."""

    plans: tuple[CompiledPlan, ...]
    skipped: tuple[tuple[str, str], ...]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: total seconds, the plans and the skipped targets."""
        return {"seconds": round(self.seconds, 6),
                "plans": [plan.as_dict() for plan in self.plans],
                "skipped": [{"purpose": purpose, "reason": why} for purpose, why in self.skipped]}

    def summary(self) -> str:
        """One line for a log: the plans compiled and the step's seconds, then each plan's
        purposes, shapes, copies compiled and milliseconds, and each target skipped."""
        plans = "; ".join(
            f"{' + '.join(plan.purposes)} ("
            + ", ".join(f"{name} {list(shape)}" for name, shape in plan.inputs.items())
            + f"): {plan.copies} in {plan.seconds * 1e3:.1f} ms" for plan in self.plans)
        compiled = sum(plan.copies for plan in self.plans)
        return (f"compiled {compiled} plan(s) in {self.seconds:.3f} s"
                + (f": {plans}" if plans else "")
                + "".join(f"; skipped {purpose}: {why}" for purpose, why in self.skipped))


class CompileFailed(EngineError):
    """A target's plan did not compile (or its shapes do not fit the model); ``target`` says
    which, ``error`` why."""

    def __init__(self, target: CompileTarget, error: BaseException) -> None:
        super().__init__(f"compiling the plan for {target.purpose} failed: {error}")
        self.target = target
        self.error = error


RowRuns = Callable[[dict[str, np.ndarray]], tuple[list[tuple[int, int]] | None, bool]]
PartPlans = Callable[..., tuple[list, list, list[Signature], list[int]]]


class PlanCompiler:
    """Compiles targets into one model's `PlanCache`; ``row_runs`` and ``part_plans`` are its
    `RowSplitter`'s (how a CPU call of some rows would be cut, and the plan copies it runs)."""

    def __init__(self, checker: InputChecker, cache: PlanCache, row_runs: RowRuns,
                 part_plans: PartPlans) -> None:
        self._checker = checker
        self._cache = cache
        self._row_runs = row_runs
        self._part_plans = part_plans

    def compile(self, targets: Iterable[CompileTarget]) -> CompileReport:
        """Compile each target's plans that are not compiled yet, in order.

        Raises:
            CompileFailed: a required target's shapes do not fit, or a plan failed to compile.
        """
        start = time.perf_counter()
        records: dict[Signature, _Record] = {}
        skipped: list[tuple[str, str]] = []
        for target in targets:
            if self._cache.graph is None:
                skipped.append((target.purpose, INTERPRETER))
                continue
            try:
                copies = self._copies(target)
            except InputError as error:
                if target.required:
                    raise CompileFailed(target, error) from error
                skipped.append((target.purpose, str(error)))
                continue
            for signature, index in copies:
                if signature not in records:
                    records[signature] = _Record(signature)
                self._compile_copy(target, records[signature], index)
        plans = tuple(record.done(self._cache.buckets) for record in records.values())
        return CompileReport(plans, tuple(skipped), time.perf_counter() - start)

    def _copies(self, target: CompileTarget) -> list[tuple[Signature, int]]:
        """The plans ``target`` needs: (signature, copy) pairs, copy 0 the plan itself."""
        dtypes = target.dtypes or {}
        specs = {spec.name: spec.dtype for spec in self._checker.inputs}
        # Zeros broadcast to the shapes: checked and cut like a call's, nothing allocated.
        arrays = {name: np.broadcast_to(np.zeros((), dtypes.get(name, specs.get(name))), shape)
                  for name, shape in target.shapes.items()}
        feed = self._checker.check(arrays)
        self._checker.shapes_for(feed)
        exact = Signature.of(feed)
        if not target.as_called:
            return [(exact, 0)]
        cache = self._cache
        bounds, _ = self._row_runs(feed)
        if bounds is None:
            copies = [(cache.bucketed(exact), 0)]
        else:
            _, _, planned, replicas = self._part_plans(feed, bounds)
            copies = list(zip(planned, replicas))
        if target.spare:  # the spares a batch of this size runs while the plan is busy
            copies.extend((cache.bucketed(exact), index)
                          for index in range(1, cache.concurrent_runs))
        return copies

    def _compile_copy(self, target: CompileTarget, record: _Record, index: int) -> None:
        """Copy ``index`` of the record's plan (and the copies before it), timed."""
        cache = self._cache
        fresh = cache.plans.get(record.signature) is None
        start = time.perf_counter()
        try:
            entry = cache.entry(record.signature)
            spares = len(entry.spares)
            cache.replica(entry, index)
        except Exception as error:  # noqa: BLE001 - whatever failed, the target names it
            raise CompileFailed(target, error) from error
        compiled = int(fresh) + len(entry.spares) - spares
        if compiled:
            record.seconds += time.perf_counter() - start
            record.copies += compiled
        if target.purpose not in record.purposes:
            record.purposes.append(target.purpose)
        record.plan = entry.plan


@dataclass
class _Record:
    """A `CompiledPlan` being gathered."""

    signature: Signature
    purposes: list[str] = field(default_factory=list)
    copies: int = 0
    seconds: float = 0.0
    plan: Any = None

    def done(self, buckets: tuple[int, ...] | None) -> CompiledPlan:
        rows = self.signature.rows()
        return CompiledPlan(
            inputs=self.signature.shapes(),
            dtypes={name: dtype.name for name, dtype in self.signature.dtypes().items()},
            bucket=rows if buckets and rows in buckets else None,
            purposes=tuple(self.purposes), copies=self.copies, seconds=self.seconds,
            planned_bytes=int(self.plan.memory.planned_bytes),
            workspace_bytes=int(self.plan.workspace.nbytes))
