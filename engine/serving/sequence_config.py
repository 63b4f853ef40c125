"""``sequence_batching`` of a ``config.json``: stateful sequences, in Triton's field names.

Pure data, validated when the config is parsed; `engine.serving.sequences` runs it. Example
(an LSTM language model whose begin states are inputs and whose last states are outputs)::

    {"sequence_batching": {
        "max_sequence_idle_microseconds": 5000000,
        "oldest": {"max_candidate_sequences": 8, "max_queue_delay_microseconds": 2000},
        "state": [{"input_name": "data1", "output_name": "out1"},
                  {"input_name": "data2", "output_name": "out2"}]}}

Each ``state`` pairs an input the server feeds with an output it keeps: on a sequence's first
request the input is zeros, on each later one it is what the output was on the one before.
Clients never send or see these tensors. ``direct`` (the default) and ``oldest`` choose how
sequences take their places in a batch (see `engine.serving.sequences`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

# Triton's default: a sequence with no request for a second is dropped.
DEFAULT_IDLE_US = 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InitialState(_Strict):
    """Triton's ``initial_state`` entry; only ``zero_data`` (zeros) is served."""

    name: str | None = None
    data_type: str | None = None
    dims: tuple[StrictInt, ...] | None = None
    zero_data: StrictBool = True
    data_file: str | None = None

    @model_validator(mode="after")
    def _zeros(self) -> InitialState:
        if self.data_file is not None or not self.zero_data:
            raise ValueError("only zero_data: true is supported (the state starts as zeros); "
                             "data_file is not")
        return self


class SequenceState(_Strict):
    """One implicit state: the input the server feeds and the output it keeps for it.

    `data_type` and `dims` (without the batch dimension, as Triton writes them) default to the
    input's datatype and shape; `dims` must be given where the input's shape has a variable
    dimension besides the batch.
    """

    input_name: str = Field(min_length=1, max_length=256)
    output_name: str = Field(min_length=1, max_length=256)
    data_type: str | None = None
    dims: tuple[StrictInt, ...] | None = Field(None, max_length=32)
    initial_state: tuple[InitialState, ...] = Field((), max_length=1)

    @model_validator(mode="after")
    def _dims(self) -> SequenceState:
        if self.dims is not None and any(dim < 1 for dim in self.dims):
            raise ValueError(f"dims {list(self.dims)}: a state's dimensions are fixed sizes "
                             ">= 1 (the batch dimension is left out)")
        return self


class DirectStrategy(_Strict):
    """Each active sequence holds one of ``max_batch_size`` slots of the batch. As in
    Triton, a step waits for the other slots' steps only with a `minimum_slot_utilization`
    above 0: until that share of the slots has a step, for at most
    `max_queue_delay_microseconds`; with 0 the delay is ignored and steps run as they come."""

    max_queue_delay_microseconds: StrictInt = Field(0, ge=0, le=60_000_000)
    minimum_slot_utilization: float = Field(0.0, ge=0.0, le=1.0)


class OldestStrategy(_Strict):
    """Up to `max_candidate_sequences` sequences are active at once; their next steps are
    batched oldest first, as the dynamic batcher batches requests."""

    max_candidate_sequences: StrictInt | None = Field(None, ge=1, le=65536)
    preferred_batch_size: tuple[StrictInt, ...] = ()
    max_queue_delay_microseconds: StrictInt = Field(0, ge=0, le=60_000_000)

    @model_validator(mode="after")
    def _preferred(self) -> OldestStrategy:
        if any(size < 1 for size in self.preferred_batch_size):
            raise ValueError(f"preferred_batch_size {list(self.preferred_batch_size)}: sizes "
                             "must be >= 1")
        return self


class SequenceBatchingConfig(_Strict):
    """Triton's ``sequence_batching``: idle limit, strategy (one of `direct`, `oldest`;
    `direct` when neither is given) and the implicit states."""

    max_sequence_idle_microseconds: StrictInt = Field(DEFAULT_IDLE_US, ge=0,
                                                      le=86_400_000_000)
    direct: DirectStrategy | None = None
    oldest: OldestStrategy | None = None
    state: tuple[SequenceState, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _zero_idle(cls, data: Any) -> Any:
        # Triton reads 0 as "not set": its default of one second.
        if isinstance(data, dict) and data.get("max_sequence_idle_microseconds") == 0:
            return {**data, "max_sequence_idle_microseconds": DEFAULT_IDLE_US}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SequenceBatchingConfig:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("give one strategy, direct or oldest, not both")
        for field in ("input_name", "output_name"):
            names = [getattr(state, field) for state in self.state]
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                raise ValueError(f"state: each {field} once; {repeated} repeated")
        return self

    @property
    def max_queue_delay_us(self) -> int:
        """How long a step waits for the steps of other sequences to join its batch."""
        if self.oldest is not None:
            return self.oldest.max_queue_delay_microseconds
        direct = self.direct
        if direct is None or not direct.minimum_slot_utilization:
            return 0
        return direct.max_queue_delay_microseconds

    def preferred_batch_sizes(self, max_batch_size: int) -> tuple[int, ...]:
        """Batch sizes dispatched at once: the oldest strategy's ``preferred_batch_size``;
        for the direct strategy every size from its minimum slot utilization up."""
        if self.oldest is not None:
            return tuple(sorted(set(self.oldest.preferred_batch_size)))
        if self.direct is None or not self.direct.minimum_slot_utilization or not max_batch_size:
            return ()
        least = max(1, math.ceil(self.direct.minimum_slot_utilization * max_batch_size))
        return tuple(range(least, max_batch_size + 1))

    def active_limit(self, max_batch_size: int) -> int:
        """Sequences active at once: one a batch slot (direct), or the oldest strategy's
        candidates (by default as many as the batch holds); later ones wait for a place."""
        if self.oldest is not None and self.oldest.max_candidate_sequences is not None:
            return self.oldest.max_candidate_sequences
        return max(1, max_batch_size)
