"""MXNet 1.9.1's own int8 exports (tools/mxnet_fixtures/generate_quantized.py) and the values
MXNet computed for them: the model outputs on fixed inputs, and every node's outputs."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

from engine.graph.ir import Graph
from engine.graph.json_format import graph_from_json
from engine.graph.params import load_params

ROOT = Path(__file__).resolve().parents[3] / "fixtures" / "mxnet_quantized"
MODELS = ("resnet18_v1_naive", "resnet50_v1_thin_entropy", "mobilenet_v2_naive",
          "bert_encoder_naive", "concat_bn_int8_naive", "plain_symbol_naive",
          "resnet18_v1_uncalibrated")


def paths(name: str) -> tuple[Path, Path]:
    """The model's symbol file and params file."""
    return ROOT / name / f"{name}-symbol.json", ROOT / name / f"{name}-0000.params"


@cache
def graph(name: str) -> Graph:
    """The exported graph as the engine reads it."""
    return graph_from_json(paths(name)[0].read_text())


@cache
def params(name: str) -> dict[str, np.ndarray]:
    """The exported parameters by variable name (``arg:``/``aux:`` dropped)."""
    raw = load_params(paths(name)[1].read_bytes()).as_dict()
    return {key.split(":", 1)[-1]: value for key, value in raw.items()}


@cache
def io(name: str) -> dict[str, np.ndarray]:
    """``data``, MXNet's ``int8_output`` and the float model's ``float_output``."""
    return dict(np.load(ROOT / name / "io.npz"))


@cache
def internals(name: str) -> dict[str, np.ndarray]:
    """MXNet's value of every node output on ``io(name)["data"]``, keyed ``node:index``."""
    return dict(np.load(ROOT / name / "internals.npz"))


def meta(name: str) -> dict:
    """How the fixture was made (see its meta.json)."""
    return json.loads((ROOT / name / "meta.json").read_text())
