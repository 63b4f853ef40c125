"""What a graph takes, found by asking shape inference: sample shapes and batch axes.

A ResNet exported from Gluon fixes its input's channels (through the first convolution's
weight) but not its height and width; a LeNet needs exactly 28×28 because a FullyConnected
follows the flatten; a time-major language model takes ``[steps, batch]``, so its batch is
axis 1. Shape inference cannot solve for such dimensions, but it can check a guess cheaply,
without allocating. `probe` tries, per input, each open dimension as the batch axis (axis 0
first), and for each choice a short list of sizes for the other open dimensions, smallest
first: the first sizes the whole graph accepts with every node's shape known make the sample
(one row at each batch axis). Shape inference at two batch sizes then shows which dimension of
each output follows the batch: that is the output's batch axis.

An input whose rank the graph does not fix (BERT's masked positions feed only a reshape) is
completed at the smallest rank shape inference accepts; where a node downstream is then left
without a shape (the masked positions' ``shape_array`` sliced past its end), the inputs behind
that node are tried one and two dimensions longer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from engine.serving.config import TensorConfig

# Small sizes first (the test run is cheapest there), then sizes common in exported models
# (image sides, sequence lengths, flattened widths).
CANDIDATE_SIZES = (*range(1, 33), 48, 56, 64, 96, 100, 112, 128, 160, 192, 224, 227, 256, 299,
                   320, 384, 448, 512, 768, 784, 1000, 1024)
# Choices of batch axes tried (those with the fewest, lowest axes first), and how much longer
# than the smallest rank an input is tried.
MAX_ASSIGNMENTS = 64
EXTRA_RANKS = 2
PROBE_ROWS = (2, 3)  # the two batch sizes whose outputs show which axis follows the batch

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Probe:
    """What `probe` found.

    `inputs`: the inputs (graph names) with their ranks settled and, when the graph batches,
    `batch_axis` set. `sample`: the test run's shapes (one row at each batch axis), None when
    none fits (`skipped` says why). `output_axes`: each output's batch axis by graph name; None
    when the inputs and outputs share no batch axis (the model is served without batching,
    ``max_batch_size`` 0). `batches`: whether the graph takes more than one row.
    """

    inputs: tuple[TensorConfig, ...]
    sample: Shapes | None
    output_axes: dict[str, int] | None
    batches: bool
    skipped: str | None = None


def probe(model: Any, inputs: Sequence[TensorConfig], *, batching: bool = True,
          flexible: frozenset[str] = frozenset(),
          output_axes: Mapping[str, int] | None = None) -> Probe:
    """Sample shapes and batch axes of `model` for `inputs` (graph names, open dimensions -1).

    `batching` False (``max_batch_size`` 0): no batch axis is looked for. `flexible`: inputs
    whose rank came from the graph, not the config, and may be tried longer. `output_axes`:
    batch axes the config gives for outputs, which must follow the batch. A model without
    ``output_shapes`` (no shape inference to ask) gets size 1 and axis 0 everywhere.
    """
    if getattr(model, "output_shapes", None) is None:
        axes = {tensor.name: tensor.axis for tensor in inputs} if batching else None
        return Probe(_with_axes(inputs, axes), _shapes(inputs, axes, 1, 1),
                     {name: 0 for name in model.output_names} if batching else None, batching)
    search = _Search(model, dict(output_axes or {}))
    tried: set[tuple[int, ...]] = set()
    inputs = tuple(_reaching_axis(tensor, flexible) for tensor in inputs)
    pending = [inputs]
    while pending:
        ranked = pending.pop(0)
        key = tuple(len(tensor.shape) for tensor in ranked)
        if key in tried:
            continue
        tried.add(key)
        found = search.ranked(ranked, batching)
        if found is not None:
            return found
        pending.extend(_longer(ranked, search.blamed, flexible, inputs))
    why = ("no small input shape tried fits the graph (see docs/models.md); give the "
           "variable dimensions in config.json to have it run")
    if search.unknown is not None:
        why = (f"no input shape tried leaves every node's shape known (last: "
               f"{search.unknown}); give the inputs' shapes in config.json to have it run")
    axes = {tensor.name: tensor.axis for tensor in inputs} if batching else None
    return Probe(_with_axes(inputs, axes), None, None, batching, why)


class _Search:
    """One probe's questions to shape inference, and what they showed."""

    def __init__(self, model: Any, given_outputs: dict[str, int]) -> None:
        self.model = model
        self.given_outputs = given_outputs
        self.check_known = (getattr(model, "unknown_shape", None) is not None
                            and getattr(model, "data_dependent", None) is None)
        self.blamed: set[str] = set()  # inputs behind a node left without a shape
        self.unknown: str | None = None
        self.refused_rows = False  # whether the last `following` found 2 rows refused

    def ranked(self, inputs: tuple[TensorConfig, ...], batching: bool) -> Probe | None:
        """The probe's answer at these ranks, or None when nothing tried fits."""
        if not batching:
            sample = self.sample(inputs, None)
            return None if sample is None else Probe(_with_axes(inputs, None), sample, None,
                                                     False)
        one_row: tuple[dict[str, int], Shapes] | None = None
        for axes in _assignments(inputs):
            sample = self.sample(inputs, axes)
            if sample is None:
                continue
            following = self.following(sample, axes)
            if following is not None:
                return Probe(_with_axes(inputs, axes), sample, following, True)
            if one_row is None and not any(axes.values()) and self.refused_rows \
                    and self.one_row(sample):
                one_row = axes, sample
        if one_row is not None:  # GluonCV's Faster R-CNN: one row, batch first
            return Probe(_with_axes(inputs, one_row[0]), one_row[1],
                         {name: 0 for name in self.model.output_names}, False)
        sample = self.sample(inputs, None)  # no common batch axis: whole shapes, no batching
        return None if sample is None else Probe(_with_axes(inputs, None), sample, None, False)

    def sample(self, inputs: Sequence[TensorConfig], axes: Mapping[str, int] | None
               ) -> Shapes | None:
        """Shapes with one row at `axes` and the first candidate size at every other open
        dimension that the graph accepts with every shape known, or None."""
        sizes = CANDIDATE_SIZES if any(
            dim < 0 and (axes is None or axis != axes[tensor.name])
            for tensor in inputs for axis, dim in enumerate(tensor.shape)) else (1,)
        for size in sizes:
            shapes = _shapes(inputs, axes, 1, size)
            if self.fits(shapes):
                return shapes
        return None

    def fits(self, shapes: Shapes) -> bool:
        try:
            if not self.check_known:
                self.model.output_shapes(shapes)
                return True
            unknown = self.model.unknown_shape(shapes)
        except EngineError:
            return False
        if unknown is not None:
            self.blamed.update(unknown.inputs)
            self.unknown = unknown.message
            return False
        return True

    def following(self, sample: Shapes, axes: Mapping[str, int]) -> dict[str, int] | None:
        """Each output's batch axis: the one dimension that is 2 at 2 rows and 3 at 3 (an
        output whose shape depends on the data counts as following at its unknown
        dimension), or None when some output does not follow the batch."""
        runs = []
        self.refused_rows = False
        for rows in PROBE_ROWS:
            shapes = {name: _at(shape, axes[name], rows) for name, shape in sample.items()}
            try:
                runs.append(self.model.output_shapes(shapes))
            except EngineError:
                self.refused_rows = True
                return None
        found = {}
        for name in self.model.output_names:
            axis = _following_axis(runs[0].get(name), runs[1].get(name))
            given = self.given_outputs.get(name)
            if axis is None or (given is not None and given != axis):
                return None
            found[name] = axis
        return found

    def one_row(self, sample: Shapes) -> bool:
        """Whether every output has one row (or a number the data sets) first at `sample`,
        for a graph that refuses two (GluonCV's Faster R-CNN bakes its batch of 1 in)."""
        try:
            outputs = self.model.output_shapes(sample)
        except EngineError:
            return False
        return all(shape is None or (len(shape) > 0 and shape[0] in (0, 1))
                   for shape in outputs.values())


def _following_axis(small: tuple[int, ...] | None, large: tuple[int, ...] | None
                    ) -> int | None:
    if small is None or large is None:
        return 0  # shape inference cannot tell (data-dependent): the batch is taken as first
    if len(small) != len(large):
        return None
    changed = [axis for axis, (a, b) in enumerate(zip(small, large)) if a != b]
    if len(changed) == 1 and (small[changed[0]], large[changed[0]]) == PROBE_ROWS:
        return changed[0]
    if not changed and 0 in small:
        return small.index(0)
    return None


def _assignments(inputs: Sequence[TensorConfig]) -> Iterator[dict[str, int]]:
    """Choices of one batch axis per input: the axis a config gives, else each open
    dimension (axis 0 where none is open); those with the fewest, lowest axes first."""
    choices = []
    for tensor in inputs:
        if tensor.batch_axis is not None:
            choices.append((tensor.batch_axis,))
            continue
        open_axes = tuple(axis for axis, dim in enumerate(tensor.shape) if dim < 0)
        choices.append(open_axes or (0,))
    combos = sorted(itertools.islice(itertools.product(*choices), 4096),
                    key=lambda axes: (sum(axes), axes))
    for axes in combos[:MAX_ASSIGNMENTS]:
        yield {tensor.name: axis for tensor, axis in zip(inputs, axes)}


def _reaching_axis(tensor: TensorConfig, flexible: frozenset[str]) -> TensorConfig:
    """`tensor` long enough to have the batch axis the config gives it, where its rank came
    from the graph (the smallest shape inference accepts, perhaps shorter)."""
    axis = tensor.batch_axis
    if axis is None or tensor.name not in flexible or axis < len(tensor.shape):
        return tensor
    return tensor.model_copy(update={
        "shape": (*tensor.shape, *(-1,) * (axis + 1 - len(tensor.shape)))})


def _longer(ranked: tuple[TensorConfig, ...], blamed: set[str], flexible: frozenset[str],
            original: Sequence[TensorConfig]) -> Iterator[tuple[TensorConfig, ...]]:
    """`ranked` with one blamed, flexible input one dimension longer (up to `EXTRA_RANKS`
    over its first rank)."""
    first = {tensor.name: len(tensor.shape) for tensor in original}
    for index, tensor in enumerate(ranked):
        if tensor.name in blamed and tensor.name in flexible and tensor.shape is not None \
                and len(tensor.shape) < first[tensor.name] + EXTRA_RANKS:
            longer = tensor.model_copy(update={"shape": (*tensor.shape, -1)})
            yield (*ranked[:index], longer, *ranked[index + 1:])


def _with_axes(inputs: Sequence[TensorConfig], axes: Mapping[str, int] | None
               ) -> tuple[TensorConfig, ...]:
    """`inputs` with their batch axes set and open there (-1); None: no batch axis."""
    if axes is None:
        return tuple(tensor.model_copy(update={"batch_axis": None}) for tensor in inputs)
    return tuple(tensor.model_copy(update={
        "batch_axis": axes[tensor.name], "shape": _at(tensor.shape, axes[tensor.name], -1)})
        for tensor in inputs)


def _at(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return (*shape[:axis], size, *shape[axis + 1:])


def _shapes(inputs: Sequence[TensorConfig], axes: Mapping[str, int] | None, rows: int,
            size: int) -> Shapes:
    """Every input's shape with `rows` at its batch axis and `size` at its other open
    dimensions."""
    shapes = {}
    for tensor in inputs:
        batch = None if axes is None else axes[tensor.name]
        shapes[tensor.name] = tuple(rows if axis == batch else dim if dim > 0 else size
                                    for axis, dim in enumerate(tensor.shape))
    return shapes


def with_rows(tensors: Sequence[TensorConfig], shapes: Mapping[str, tuple[int, ...]],
              rows: int | None) -> Shapes:
    """`shapes` (keyed like `tensors`' names) with `rows` at each tensor's batch axis (axis 0
    where it gives none); `rows` None: the tensors have no batch dimension (``max_batch_size``
    0), and the shapes stay as they are."""
    if rows is None:
        return dict(shapes)
    axes = {tensor.name: tensor.axis for tensor in tensors}
    return {name: _at(shape, axes.get(name, 0), rows) for name, shape in shapes.items()}


def sample_or_ones(inputs: Sequence[TensorConfig],
                   sample: Mapping[str, tuple[int, ...]] | None) -> Shapes:
    """`sample`'s shapes for `inputs`, or where there is none one row with every open
    dimension 1 (what memory is estimated and measured at)."""
    if sample is not None:
        return {tensor.name: tuple(sample[tensor.name]) for tensor in inputs}
    return {tensor.name: tuple(dim if dim > 0 else 1 for dim in tensor.shape)
            for tensor in inputs}
