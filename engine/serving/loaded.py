"""`LoadedVersion`: one model version in memory, with its batcher and memory accounting."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from engine.serving.batcher import DynamicBatcher
from engine.serving.config import ModelConfig
from engine.serving.postprocess_config import Postprocess, tensor_owners
from engine.serving.preprocess_config import ImagePreprocess
from engine.serving.priority_queue import Scheduling
from engine.serving.sequences import SequenceControl, SequenceScheduler
from engine.serving.text import TextPipeline
from engine.serving.text_check import pipelines_of
from engine.serving.validate import ServableModel, input_shapes, labels_of


class VersionState(StrEnum):
    """Where a version stands, as reported by the repository index."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class VersionStatus:
    """One row of the repository index."""

    name: str
    version: int
    state: VersionState
    reason: str = ""


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes a loaded version holds: parameters (with values derived from them, such as Winograd
    weights), and planned activations and working memory over its cached plans."""

    param_bytes: int
    activation_bytes: int

    @property
    def total(self) -> int:
        """Parameters plus activations."""
        return self.param_bytes + self.activation_bytes


class LoadedVersion:
    """A validated model version that serves requests through its own `DynamicBatcher`."""

    def __init__(self, name: str, version: int, model: ServableModel, config: ModelConfig,
                 batcher: DynamicBatcher, *, manifest_digest: str | None,
                 config_digest: str | None) -> None:
        self.name = name
        self.version = version
        self.model = model
        self.config = config
        self.batcher = batcher
        self.manifest_digest = manifest_digest
        self.config_digest = config_digest
        self._activation_cache: dict[Any, int] = {}
        # What eviction under a memory budget asks: requests queued or running here, and when
        # a request last looked this version up or ran on it.
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.on_idle: Callable[[], None] | None = None  # called as the last request finishes
        assert config.inputs is not None and config.outputs is not None  # completed on load
        # A sequence model's implicit states are the server's: clients neither send nor see
        # them (None: requests stand alone).
        self.sequences = (None if config.sequence_batching is None else SequenceScheduler(
            config, self._submit, name=f"model {name!r} version {version}"))
        hidden_inputs = self.sequences.state_inputs if self.sequences else frozenset()
        hidden_outputs = self.sequences.state_outputs if self.sequences else frozenset()
        # Looked up on every request: built once here, not from the config each time. Clients
        # see the config's names; the graph's differ where an entry renames (`source`).
        self.input_specs = {tensor.name: tensor for tensor in config.inputs
                            if tensor.name not in hidden_inputs}
        # The tensors clients send and receive, as metadata lists them.
        self.served_inputs = tuple(self.input_specs.values())
        self.served_outputs = tuple(tensor for tensor in config.outputs
                                    if tensor.name not in hidden_outputs)
        self.input_dtypes = {tensor.name: tensor.dtype for tensor in self.input_specs.values()}
        # Inputs that also take encoded images or texts (BYTES, one a row); empty for most
        # models, so requests to them skip the preprocessing path with one truth test.
        self.pipelines: dict[str, ImagePreprocess | TextPipeline] = {
            tensor.name: tensor.preprocess.image for tensor in config.inputs
            if tensor.preprocess is not None and tensor.preprocess.image is not None}
        self.pipelines.update(pipelines_of(model))
        renamed = {tensor.graph_name: tensor.name for tensor in config.outputs}
        self.output_names = [renamed[name] for name in model.output_names
                             if renamed[name] not in hidden_outputs]
        self._to_graph = {tensor.name: tensor.source for tensor in config.inputs
                          if tensor.source not in (None, tensor.name)}
        self._from_graph = {source: name for source, name in renamed.items() if source != name}
        self.labels = labels_of(model)
        # Outputs with a postprocess ({} for most models), and every tensor V2 may answer
        # with mapped to the output computing it.
        self.postprocesses: dict[str, Postprocess] = {
            tensor.name: tensor.postprocess for tensor in config.outputs
            if tensor.postprocess is not None}
        self.tensor_owners = tensor_owners(config.outputs)
        self.largest_plan = _signature(input_shapes(config.inputs, config.max_batch_size, model))

    @property
    def identity(self) -> tuple[str | None, str | None]:
        """What must change on disk for this version to be reloaded."""
        return self.manifest_digest, self.config_digest

    @property
    def idle(self) -> bool:
        """No request queued or running on this version, and no sequence under way (its
        implicit state lives here)."""
        return (self.in_flight == 0 and self.batcher.queue_depth == 0
                and (self.sequences is None or self.sequences.live == 0))

    def touch(self) -> None:
        """A request looked this version up: it was used now."""
        self.last_used = time.monotonic()

    async def infer(self, inputs: Mapping[str, Any], *, timeout_s: float | None = None,
                    rows: int | None = None, sequence: SequenceControl | None = None,
                    scheduling: Scheduling | None = None) -> dict[str, np.ndarray]:
        """Queue one request on this version's batcher and wait for its outputs; inputs and
        outputs go by the config's names, the graph's stay inside (the one place they map).
        ``rows``: see `DynamicBatcher.submit`. ``sequence``: the request's place in its
        sequence, for a model with ``sequence_batching`` (ignored by others, as Triton's
        schedulers without sequences ignore it; see `SequenceScheduler.step`). ``scheduling``:
        the request's priority and own timeout (see `DynamicBatcher.submit`); a sequence's
        steps have no priority (as in Triton's sequence batcher), and its timeout is theirs."""
        self.in_flight += 1
        self.last_used = time.monotonic()
        try:
            if self.sequences is not None:
                if scheduling is not None and scheduling.timeout_s is not None:
                    timeout_s = (scheduling.timeout_s if timeout_s is None
                                 else min(timeout_s, scheduling.timeout_s))
                return await self.sequences.step(inputs, sequence, timeout_s=timeout_s,
                                                 rows=rows)
            return await self._submit(inputs, timeout_s, rows, scheduling)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self.on_idle is not None:
                self.on_idle()

    async def _submit(self, inputs: Mapping[str, Any], timeout_s: float | None,
                      rows: int | None, scheduling: Scheduling | None = None
                      ) -> dict[str, np.ndarray]:
        if self._to_graph:
            inputs = {self._to_graph.get(name, name): array for name, array in inputs.items()}
        outputs = await self.batcher.submit(inputs, timeout_s=timeout_s, rows=rows,
                                            scheduling=scheduling)
        if self._from_graph:
            return {self._from_graph.get(name, name): array for name, array in outputs.items()}
        return outputs

    def memory(self) -> MemoryUsage:
        """Parameter bytes plus activation bytes of the largest plan and of every plan the model
        still caches (a model that reports no plan cache holds only the largest)."""
        # Evicted plans are not memory any more (and recompiling them here would churn the cache).
        cached = getattr(self.model, "plan_signatures", None)
        signatures = {self.largest_plan, *(cached() if cached else ())}
        for stale in self._activation_cache.keys() - signatures:
            self._activation_cache.pop(stale, None)
        activations = sum(self._activation_bytes(signature) for signature in signatures)
        # After the plans are compiled: compiling is what derives values from parameters.
        derived = int(getattr(self.model, "derived_bytes", 0))
        return MemoryUsage(int(self.model.param_bytes) + derived, activations)

    def _activation_bytes(self, signature: tuple[tuple[str, tuple[int, ...]], ...]) -> int:
        cached = self._activation_cache.get(signature)
        if cached is None:
            estimate = getattr(self.model, "activation_bytes", None)
            cached = int(estimate(dict(signature))) if estimate is not None else 0
            self._activation_cache[signature] = cached
        return cached


def _signature(shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted(shapes.items()))
