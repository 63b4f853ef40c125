"""The graph an ``int8`` model runs: its float32 graph quantized after calibration on inputs
(`engine.quantize`), the calibration run by the reference interpreter in float32; or, for an
int8 export (MXNet's quantized operators already in it), the graph as it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.graph.ir import Graph
from engine.ops.quantized import QUANTIZED_OPS
from engine.quantize import CalibrationSettings, calibrate_ranges, find_chains, quantize_graph
from engine.quantize.calibrate import watched_entries
from engine.runtime.interpreter import evaluate

_QUANTIZED = frozenset(QUANTIZED_OPS)


def is_int8_export(graph: Graph) -> bool:
    """Whether ``graph`` holds int8 operators of its own (an MXNet int8 export, or a graph
    quantized here), in a control-flow body too."""
    return any(node.op in _QUANTIZED or any(is_int8_export(body) for body in node.subgraphs)
               for node in graph.nodes)


def int8_graph(graph: Graph, params: Mapping[str, np.ndarray],
               calibration: Mapping[str, Any] | None,
               settings: CalibrationSettings | Mapping[str, Any] | None) -> Graph:
    """``graph`` with its Convolution and FullyConnected layers in int8, ranges calibrated on
    ``calibration`` (arrays by input name, rows along axis 0).

    Raises:
        ValueError: no calibration inputs, inputs the graph does not take, or bad settings.
    """
    inputs, settings = checked_calibration(graph, params, calibration, settings)
    chains = find_chains(graph)
    if not chains:
        return graph

    def run(watching: Graph, feed: Mapping[str, np.ndarray]) -> list[Any]:
        return evaluate(watching, {**params, **feed}, np)

    ranges = calibrate_ranges(graph, watched_entries(graph, chains), inputs, run, settings)
    return quantize_graph(graph, chains, ranges)


def checked_calibration(graph: Graph, params: Mapping[str, np.ndarray],
                        calibration: Mapping[str, Any] | None,
                        settings: CalibrationSettings | Mapping[str, Any] | None
                        ) -> tuple[dict[str, np.ndarray], CalibrationSettings]:
    """The calibration inputs as arrays and the settings, checked against ``graph`` (also where
    the model falls back to fp32, so that the same arguments are refused on every host).

    Raises:
        ValueError: no calibration inputs, inputs the graph does not take, or bad settings.
    """
    if settings is None or isinstance(settings, Mapping):
        settings = CalibrationSettings(**dict(settings or {}))
    if not calibration:
        raise ValueError("precision int8 needs calibration inputs (calibration={input name: "
                         "array}) to take each layer's range from")
    inputs = {name: np.asarray(value) for name, value in calibration.items()}
    known = set(graph.variable_names()) - set(params)
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise ValueError(f"calibration input {unknown[0]!r} is not an input of the graph "
                         f"(its inputs: {', '.join(sorted(known))})")
    return inputs, settings
