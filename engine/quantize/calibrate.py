"""Calibration: the float32 graph run on calibration inputs, each tensor an int8 graph
quantizes watched, and its range taken (`thresholds`).

The inputs run in slices of ``batch_rows`` rows along axis 0 (a large calibration set never
holds every layer's activations at once); ``entropy`` runs them twice, once for each tensor's
extremes and once for its histogram over them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.graph.ir import Entry, Graph
from engine.quantize.chains import Chain, is_global_average
from engine.quantize.thresholds import MODES, TensorStats, entropy_range, naive_range

# Runs a graph on inputs by name and returns its head values (the reference interpreter).
GraphRunner = Callable[[Graph, Mapping[str, np.ndarray]], Sequence[np.ndarray]]


@dataclass(frozen=True)
class CalibrationSettings:
    """How ranges are calibrated: ``mode`` naive (min/max) or entropy, the entropy
    histogram's bins (MXNet's default 8001), the rows run at once."""

    mode: str = "naive"
    num_bins: int = 8001
    batch_rows: int = 16

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"calibration mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.num_bins < 2 * 255 + 1 or self.num_bins % 2 == 0:
            raise ValueError(f"calibration num_bins must be odd and at least 511; "
                             f"got {self.num_bins}")
        if self.batch_rows < 1:
            raise ValueError(f"calibration batch_rows must be positive; got {self.batch_rows}")


def watched_entries(graph: Graph, chains: Sequence[Chain]) -> list[Entry]:
    """Every value whose range the int8 graph needs: what each chain reads as data or
    residual, what each chain writes, and what a global average pooling whose value a chain
    reads (flattened or not) pools: the relu before a pre-activation network's head then
    writes uint8 into it (`rewrite`)."""
    found: dict[Entry, None] = {}
    for chain in chains:
        data = graph.nodes[chain.main].inputs[0]
        found[Entry(data.node, data.index)] = None
        if chain.summand is not None:
            found[chain.summand] = None
        found[Entry(chain.last, 0)] = None
    read = set(found)
    flattened = {Entry(node.inputs[0].node, node.inputs[0].index)
                 for index, node in enumerate(graph.nodes)
                 if node.op == "Flatten" and node.inputs and Entry(index, 0) in read}
    for index, node in enumerate(graph.nodes):
        if is_global_average(node) and node.inputs and (
                Entry(index, 0) in read or Entry(index, 0) in flattened):
            found[Entry(node.inputs[0].node, node.inputs[0].index)] = None
    return list(found)


def calibrate_ranges(graph: Graph, entries: Sequence[Entry], inputs: Mapping[str, np.ndarray],
                     run: GraphRunner, settings: CalibrationSettings
                     ) -> dict[Entry, tuple[float, float]]:
    """The calibrated ``(low, high)`` of each of ``entries`` over ``inputs``.

    Raises:
        ValueError: no calibration inputs, or inputs of different row counts.
    """
    rows = _row_count(inputs)
    watching = graph.replace(heads=tuple(entries))
    stats = {entry: TensorStats() for entry in entries}
    for feed in _slices(inputs, rows, settings.batch_rows):
        for entry, value in zip(entries, run(watching, feed), strict=True):
            stats[entry].see_extremes(np.asarray(value, dtype=np.float32))
    if settings.mode == "naive":
        return {entry: naive_range(found) for entry, found in stats.items()}
    for feed in _slices(inputs, rows, settings.batch_rows):
        for entry, value in zip(entries, run(watching, feed), strict=True):
            stats[entry].see_histogram(np.asarray(value, dtype=np.float32), settings.num_bins)
    return {entry: entropy_range(found) for entry, found in stats.items()}


def _row_count(inputs: Mapping[str, np.ndarray]) -> int:
    if not inputs:
        raise ValueError("calibration needs at least one input array")
    counts = {name: np.shape(array)[0] if np.ndim(array) else 0
              for name, array in inputs.items()}
    if len(set(counts.values())) != 1 or not next(iter(counts.values())):
        raise ValueError(f"calibration inputs must share a positive row count (axis 0); got "
                         f"{counts}")
    return next(iter(counts.values()))


def _slices(inputs: Mapping[str, np.ndarray], rows: int, step: int
            ) -> Iterator[dict[str, np.ndarray]]:
    for start in range(0, rows, step):
        yield {name: np.asarray(array)[start:start + step] for name, array in inputs.items()}
