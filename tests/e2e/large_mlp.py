"""MLP exports of about 100 MB of parameters, written in MXNet's format for memory tests.

The symbol is MXNet 1.x JSON as Gluon exports a `HybridSequential` of `Dense` layers; the
parameters are random, so each model's outputs differ and a test can tell them apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engine.graph.params import save_params
from engine.serving.manifest import write_manifest

# 1024 -> 4096 -> 4096 -> 1024: 25.2 M float32 parameters, 100.7 MB.
WIDTHS = (1024, 4096, 4096, 1024)
INPUT = "data"


def param_bytes(widths: tuple[int, ...] = WIDTHS) -> int:
    """Bytes of the parameters (weights and biases) of an MLP of these widths."""
    return 4 * sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(widths, widths[1:]))


def _symbol(widths: tuple[int, ...]) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"op": "null", "name": INPUT, "inputs": []}]
    arg_nodes, previous = [0], 0
    for layer, units in enumerate(widths[1:]):
        for part in ("weight", "bias"):
            arg_nodes.append(len(nodes))
            nodes.append({"op": "null", "name": f"mlp_dense{layer}_{part}", "inputs": []})
        nodes.append({"op": "FullyConnected", "name": f"mlp_dense{layer}_fwd",
                      "attrs": {"flatten": "True", "no_bias": "False",
                                "num_hidden": str(units)},
                      "inputs": [[previous, 0, 0], [len(nodes) - 2, 0, 0],
                                 [len(nodes) - 1, 0, 0]]})
        previous = len(nodes) - 1
        if layer < len(widths) - 2:
            nodes.append({"op": "Activation", "name": f"mlp_dense{layer}_relu_fwd",
                          "attrs": {"act_type": "relu"}, "inputs": [[previous, 0, 0]]})
            previous = len(nodes) - 1
    return {"nodes": nodes, "arg_nodes": arg_nodes,
            "node_row_ptr": list(range(len(nodes) + 1)), "heads": [[previous, 0, 0]],
            "attrs": {"mxnet_version": ["int", 10901]}}


def probe(widths: tuple[int, ...] = WIDTHS) -> np.ndarray:
    """The input every test sends: two rows."""
    return np.linspace(-1, 1, 2 * widths[0], dtype=np.float32).reshape(2, widths[0])


def write_mlp(model_dir: Path, seed: int, *, widths: tuple[int, ...] = WIDTHS,
              max_batch_size: int = 4, pinned: bool = False) -> np.ndarray:
    """Version 1 of an MLP (symbol, params, manifest) and its config.json under `model_dir`;
    returns its output for `probe()`, computed here in float64."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for layer, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        scale = np.float32(1 / np.sqrt(fan_in))
        arrays[f"arg:mlp_dense{layer}_weight"] = (
            rng.standard_normal((fan_out, fan_in), dtype=np.float32) * scale)
        arrays[f"arg:mlp_dense{layer}_bias"] = rng.standard_normal(fan_out, dtype=np.float32)
    expected = probe(widths).astype(np.float64)
    for layer in range(len(widths) - 1):
        expected = (expected @ arrays[f"arg:mlp_dense{layer}_weight"].T.astype(np.float64)
                    + arrays[f"arg:mlp_dense{layer}_bias"])
        if layer < len(widths) - 2:
            expected = np.maximum(expected, 0)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model-symbol.json").write_text(json.dumps(_symbol(widths)))
    save_params(version_dir / "model-0000.params", arrays)
    write_manifest(version_dir)
    config = {"max_batch_size": max_batch_size, "batch_buckets": [max_batch_size],
              "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [-1, widths[0]]}],
              "dynamic_batching": {"max_queue_delay_us": 500}}
    if pinned:
        config["pinned"] = True
    (model_dir / "config.json").write_text(json.dumps(config))
    return expected
