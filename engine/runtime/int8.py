"""The graph an ``int8`` model runs: its float32 graph quantized after calibration on inputs
(`engine.quantize`), the calibration run by the reference interpreter in float32."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.graph.ir import Graph
from engine.quantize import CalibrationSettings, calibrate_ranges, find_chains, quantize_graph
from engine.quantize.calibrate import watched_entries
from engine.runtime.interpreter import evaluate


def int8_graph(graph: Graph, params: Mapping[str, np.ndarray],
               calibration: Mapping[str, Any] | None,
               settings: CalibrationSettings | Mapping[str, Any] | None) -> Graph:
    """``graph`` with its Convolution and FullyConnected layers in int8, ranges calibrated on
    ``calibration`` (arrays by input name, rows along axis 0).

    Raises:
        ValueError: no calibration inputs, inputs the graph does not take, or bad settings.
    """
    if settings is None or isinstance(settings, Mapping):
        settings = CalibrationSettings(**dict(settings or {}))
    if not calibration:
        raise ValueError("precision int8 needs calibration inputs (calibration={input name: "
                         "array}) to take each layer's range from")
    chains = find_chains(graph)
    inputs = {name: np.asarray(value) for name, value in calibration.items()}
    known = set(graph.variable_names()) - set(params)
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise ValueError(f"calibration input {unknown[0]!r} is not an input of the graph "
                         f"(its inputs: {', '.join(sorted(known))})")
    if not chains:
        return graph

    def run(watching: Graph, feed: Mapping[str, np.ndarray]) -> list[Any]:
        return evaluate(watching, {**params, **feed}, np)

    ranges = calibrate_ranges(graph, watched_entries(graph, chains), inputs, run, settings)
    return quantize_graph(graph, chains, ranges)
