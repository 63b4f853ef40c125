"""`SequenceScheduler`: stateful sequences over a version's batcher (Triton's sequence batcher).

A sequence is the requests sharing one ``sequence_id``, from the one with ``sequence_start``
to the one with ``sequence_end``. The scheduler keeps each sequence's implicit state (the
``sequence_batching.state`` pairs of `engine.serving.sequence_config`): a step's state inputs
are zeros on its start and the state outputs of its sequence's previous step after, and the
state outputs it computes are kept, not answered. One step of a sequence runs at a time, in
the order they came; steps of different sequences meet in the version's `DynamicBatcher`,
which joins them along each tensor's batch axis, so concurrent sequences run as one batch.

At most `SequenceBatchingConfig.active_limit` sequences are active at once (the direct
strategy's slots, the oldest strategy's candidates); a later start waits for a place. A
sequence with no request for ``max_sequence_idle_microseconds`` is dropped, and counted.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from engine.errors import ExecutionError, InputError
from engine.serving.config import DATATYPES, ModelConfig, TensorConfig
from engine.serving.errors import InvalidModel, TimedOut

Arrays = dict[str, np.ndarray]
# (inputs, timeout in seconds, rows) -> outputs: one request through the version's batcher.
Run = Callable[[Mapping[str, np.ndarray], float | None, int | None], Awaitable[Arrays]]
# Sequences dropped for idling that a late request is still told about.
REMEMBERED_DROPS = 1024


@dataclass(frozen=True)
class SequenceControl:
    """A request's place in its sequence: V2's ``sequence_id`` (a non-zero integer or a
    non-empty string), ``sequence_start`` and ``sequence_end``."""

    id: int | str
    start: bool = False
    end: bool = False


@dataclass(frozen=True)
class StateSpec:
    """One implicit state: the input fed, the output kept, and the zeros a sequence starts
    with (one row, at the input's batch axis where the model has a batch)."""

    input_name: str
    output_name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def zeros(self) -> np.ndarray:
        """The state of a sequence's first step."""
        return np.zeros(self.shape, self.dtype)


@dataclass
class SequenceStats:
    """Counts for the metrics endpoint."""

    started: int = 0
    ended: int = 0
    dropped_idle: int = 0
    active: int = 0
    waiting: int = 0  # starts waiting for a place among the active sequences


@dataclass(eq=False)
class _Sequence:
    id: int | str
    state: Arrays | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: int = 0  # its requests inside `step` now: a sequence with one is never idle
    last_seen: float = field(default_factory=time.monotonic)
    placed: bool = False  # holds one of the active places
    closed: bool = False  # ended or dropped: requests queued behind it must look again


def state_specs(config: ModelConfig, where: str) -> list[StateSpec]:
    """The states of a completed config's ``sequence_batching``, checked against its inputs
    and outputs (on load: a config's names and batch size are final only once completed).

    Raises:
        InvalidModel: a state names no input or output, its datatype differs from theirs, or
            its shape is not fixed; or a preferred batch size exceeds max_batch_size (naming
            the field).
    """
    sequences = config.sequence_batching
    assert sequences is not None and config.inputs is not None and config.outputs is not None
    too_big = [size for size in sequences.preferred_batch_sizes(config.max_batch_size)
               if size > config.max_batch_size]
    if too_big:
        raise InvalidModel(f"{where}: sequence_batching.oldest.preferred_batch_size {too_big} "
                           f"exceed max_batch_size {config.max_batch_size}")
    inputs = {tensor.name: tensor for tensor in config.inputs}
    outputs = {tensor.name: tensor for tensor in config.outputs}
    batched = config.max_batch_size > 0
    specs = []
    for index, state in enumerate(sequences.state):
        field_name = f"{where}: sequence_batching.state.{index}"
        tensor = inputs.get(state.input_name)
        output = outputs.get(state.output_name)
        if tensor is None or output is None:
            kind, name, names = (("input", state.input_name, list(inputs)) if tensor is None
                                 else ("output", state.output_name, list(outputs)))
            raise InvalidModel(f"{field_name}: the model has no {kind} {name!r}; its "
                               f"{kind}s are {names}")
        if len(inputs) == len(sequences.state):
            raise InvalidModel(f"{field_name}: every input is a state; a request must send "
                               "at least one input")
        dtype = _state_dtype(state.data_type, tensor, field_name)
        if output.datatype != tensor.datatype:
            raise InvalidModel(f"{field_name}: output {output.name!r} is {output.datatype} but "
                               f"input {tensor.name!r} is {tensor.datatype}; a state's output "
                               "feeds its input")
        specs.append(StateSpec(tensor.name, output.name, dtype,
                               _state_shape(state.dims, tensor, batched, field_name)))
    return specs


def _state_dtype(data_type: str | None, tensor: TensorConfig, where: str) -> np.dtype:
    if data_type is not None:
        name = data_type.upper().removeprefix("TYPE_")
        if DATATYPES.get(name) != tensor.dtype:
            raise InvalidModel(f"{where}: data_type {data_type!r} differs from input "
                               f"{tensor.name!r}'s {tensor.datatype}")
    return tensor.dtype


def _state_shape(dims: tuple[int, ...] | None, tensor: TensorConfig, batched: bool,
                 where: str) -> tuple[int, ...]:
    """One sequence's state shape: `dims` (else the input's shape) with one row inserted at
    the batch axis where the model batches."""
    assert tensor.shape is not None
    axis = tensor.axis if batched else None
    config_dims = [dim for index, dim in enumerate(tensor.shape) if index != axis]
    if dims is None:
        if -1 in config_dims:
            raise InvalidModel(f"{where}: input {tensor.name!r} has shape {list(tensor.shape)}, "
                               "with a variable dimension besides the batch; give the state's "
                               "dims")
        dims = tuple(config_dims)
    elif len(dims) != len(config_dims) or any(want not in (-1, got)
                                              for want, got in zip(config_dims, dims)):
        raise InvalidModel(f"{where}: dims {list(dims)} do not fit input {tensor.name!r}'s "
                           f"shape {list(tensor.shape)}"
                           + (f" less its batch axis {axis}" if axis is not None else ""))
    if axis is None:
        return tuple(dims)
    return (*dims[:axis], 1, *dims[axis:])


class SequenceScheduler:
    """The sequences of one model version: their states, order and places.

    Args:
        config: the version's completed config, with ``sequence_batching``.
        run: one request through the version's batcher (see `Run`).
        name: used in error messages (``"model 'lm' version 1"``).
    """

    def __init__(self, config: ModelConfig, run: Run, *, name: str) -> None:
        sequences = config.sequence_batching
        assert sequences is not None
        self.name = name
        self.states = state_specs(config, name)
        self.state_inputs = frozenset(spec.input_name for spec in self.states)
        self.state_outputs = frozenset(spec.output_name for spec in self.states)
        self.idle_s = sequences.max_sequence_idle_microseconds / 1e6
        self.limit = sequences.active_limit(config.max_batch_size)
        self.stats = SequenceStats()
        self._run = run
        self._batched = config.max_batch_size > 0
        self._axes = {tensor.name: tensor.axis for tensor in config.inputs or ()}
        self._sequences: dict[int | str, _Sequence] = {}
        self._dropped: OrderedDict[int | str, None] = OrderedDict()
        self._places: asyncio.Semaphore | None = None  # made on the event loop, when first used
        self._sweep: asyncio.TimerHandle | None = None

    @property
    def live(self) -> int:
        """Sequences started and not yet ended or dropped (those waiting for a place too)."""
        return len(self._sequences)

    async def step(self, inputs: Mapping[str, np.ndarray], control: SequenceControl | None,
                   *, timeout_s: float | None = None, rows: int | None = None) -> Arrays:
        """Run one request of a sequence: its state fed in, its new state kept; the outputs
        less the states.

        Raises:
            InputError: no `control` (the model serves sequences only), a state input sent,
                more than one row, or a sequence_id that has not started.
            TimedOut: `timeout_s` passed while the step waited for its turn or its batch.
        """
        self._check(inputs, control, rows)
        assert control is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        sequence = self._enter(control)
        sequence.pending += 1
        try:
            return await self._take_turn(sequence, inputs, control, deadline, rows)
        finally:
            sequence.pending -= 1
            sequence.last_seen = time.monotonic()
            self._arm_sweep()

    def _check(self, inputs: Mapping[str, np.ndarray], control: SequenceControl | None,
               rows: int | None) -> None:
        if control is None:
            raise InputError(f"{self.name} serves sequences (sequence_batching): send the "
                             "sequence_id parameter, with sequence_start true on a sequence's "
                             "first request and sequence_end true on its last")
        sent = sorted(self.state_inputs & inputs.keys())
        if sent:
            raise InputError(f"{self.name}: input {sent[0]!r} is a sequence's implicit state, "
                             "which the server keeps between its requests; leave it out")
        if not self._batched:
            return
        if rows is None:
            rows = next((array.shape[self._axes.get(name, 0)] for name, array in inputs.items()
                         if np.ndim(array) > self._axes.get(name, 0)), 1)
        if rows != 1:
            raise InputError(f"{self.name}: a sequence's request holds one row (batch size 1), "
                             f"got {rows}; send each sequence with its own sequence_id")

    def _enter(self, control: SequenceControl) -> _Sequence:
        """The sequence a request belongs to; a start registers it at once, so that its later
        steps, sent before it is answered, queue behind it."""
        sequence = self._sequences.get(control.id)
        if sequence is not None:
            return sequence
        if not control.start:
            self._refuse_unknown(control.id)
        sequence = self._sequences[control.id] = _Sequence(control.id)
        self._dropped.pop(control.id, None)
        self.stats.started += 1
        return sequence

    def _refuse_unknown(self, sequence_id: int | str) -> None:
        dropped = (f"; it was dropped after {self.idle_s:g} s without a request "
                   "(max_sequence_idle_microseconds)" if sequence_id in self._dropped else "")
        raise InputError(f"{self.name}: sequence_id {sequence_id!r} has not started{dropped}; "
                         "its first request must set sequence_start true")

    async def _take_turn(self, sequence: _Sequence, inputs: Mapping[str, np.ndarray],
                         control: SequenceControl, deadline: float | None,
                         rows: int | None) -> Arrays:
        if not await _within(sequence.lock.acquire(), deadline):
            raise TimedOut(f"{self.name}: sequence_id {control.id!r}: no turn within the "
                           "request's timeout (its earlier requests are still running)")
        try:
            if sequence.closed:
                # Ended or dropped while this request waited behind it: a start begins the
                # id afresh, anything else finds it gone.
                if not control.start:
                    self._refuse_unknown(control.id)
                replacement = self._enter(control)  # a new sequence: this one is closed
                replacement.pending += 1
                try:
                    return await self._take_turn(replacement, inputs, control, deadline, rows)
                finally:
                    replacement.pending -= 1
                    replacement.last_seen = time.monotonic()
            if not sequence.placed:
                await self._place(sequence, deadline)
            if control.start or sequence.state is None:
                sequence.state = {spec.input_name: spec.zeros() for spec in self.states}
            outputs = await self._run({**inputs, **sequence.state}, _left(deadline), rows)
            sequence.state = self._kept(outputs)
            if control.end:
                self.stats.ended += 1
                self._leave(sequence)
            return {name: array for name, array in outputs.items()
                    if name not in self.state_outputs}
        finally:
            sequence.lock.release()

    async def _place(self, sequence: _Sequence, deadline: float | None) -> None:
        """Wait for one of the active places (a direct slot, an oldest candidate)."""
        if self._places is None:
            self._places = asyncio.Semaphore(self.limit)
        self.stats.waiting += 1
        try:
            placed = await _within(self._places.acquire(), deadline)
        finally:
            self.stats.waiting -= 1
        if not placed:
            self._leave(sequence)
            raise TimedOut(f"{self.name}: sequence_id {sequence.id!r} found no free place "
                           f"within the request's timeout ({self.limit} sequences active)")
        sequence.placed = True
        self.stats.active += 1

    def _kept(self, outputs: Mapping[str, np.ndarray]) -> Arrays:
        """The state outputs of a step, copied (they may be rows of a batch's arrays), as the
        next step's state inputs."""
        state = {}
        for spec in self.states:
            array = outputs[spec.output_name]
            if array.shape != spec.shape:
                raise ExecutionError(f"{self.name}: state output {spec.output_name!r} has "
                                     f"shape {list(array.shape)}; input {spec.input_name!r} "
                                     f"takes {list(spec.shape)}")
            state[spec.input_name] = np.array(array, spec.dtype, copy=True)
        return state

    def _leave(self, sequence: _Sequence) -> None:
        """End a sequence: forget its state and give its place back."""
        sequence.closed = True
        sequence.state = None
        if self._sequences.get(sequence.id) is sequence:
            del self._sequences[sequence.id]
        if sequence.placed:
            sequence.placed = False
            self.stats.active -= 1
            assert self._places is not None
            self._places.release()

    def _arm_sweep(self) -> None:
        """Look for idle sequences when the earliest could first be idle."""
        if self._sweep is not None or not self._sequences:
            return
        waiting = [sequence.last_seen for sequence in self._sequences.values()
                   if not sequence.pending]
        if not waiting:
            return
        delay = max(0.0, min(waiting) + self.idle_s - time.monotonic())
        self._sweep = asyncio.get_running_loop().call_later(delay, self._drop_idle)

    def _drop_idle(self) -> None:
        """Drop the sequences idle for longer than the limit (none of their requests inside)."""
        self._sweep = None
        limit = time.monotonic() - self.idle_s
        for sequence in list(self._sequences.values()):
            if not sequence.pending and sequence.last_seen <= limit:
                self._leave(sequence)
                self.stats.dropped_idle += 1
                self._dropped[sequence.id] = None
                while len(self._dropped) > REMEMBERED_DROPS:
                    self._dropped.popitem(last=False)
        self._arm_sweep()


async def _within(acquire: Awaitable[bool], deadline: float | None) -> bool:
    """Await `acquire` until `deadline` (None: no limit); False when it passed first."""
    if deadline is None:
        return await acquire
    try:
        return await asyncio.wait_for(acquire, max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return False


def _left(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (at least a millisecond, so that a step given its turn
    late still gets its batch's answer or a clear timeout)."""
    return None if deadline is None else max(0.001, deadline - time.monotonic())
