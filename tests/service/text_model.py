"""The tiny GluonNLP BERT fixture served with a text pipeline, and its reference outputs:
`engine.load_model` fed GluonNLP's own token ids (tests/fixtures/wordpiece, written by
tools/mxnet_fixtures/generate_wordpiece.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

import engine
from tests.conformance.fixtures import model_files

NAME = "bert"
FIXTURE = "gluonnlp_bert_tiny"
WORDPIECE = Path(__file__).resolve().parents[1] / "fixtures" / "wordpiece"
MAX_LENGTH = 16
CONFIG: dict[str, Any] = {"inputs": [
    {"name": "text", "source": "data0", "preprocess": {"text": {
        "vocab": "vocab.txt", "max_length": MAX_LENGTH, "token_types": "data1",
        "valid_length": "data2"}}},
    {"name": "data1"}, {"name": "data2"}],
    "outputs": [{"name": "sequence", "source": "bertmodel0_transpose1_output"},
                {"name": "pooled", "source": "bertmodel0_pooler_tanh_fwd_output"}],
    "max_batch_size": 8}


def cases() -> list[dict[str, Any]]:
    """GluonNLP's encodings (uncased, accents stripped) padded to `MAX_LENGTH`."""
    every = json.loads((WORDPIECE / "cases.json").read_text(encoding="utf-8"))
    return [case for case in every
            if case["lower_case"] and case["max_length"] == MAX_LENGTH]


def singles_and_pairs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cases of one text, and those of a pair."""
    chosen = cases()
    return ([case for case in chosen if len(case["texts"]) == 1],
            [case for case in chosen if len(case["texts"]) == 2])


def upload_files() -> dict[str, tuple[str, bytes]]:
    """The multipart files of an upload: symbol, params, config and the vocab part."""
    symbol, params = model_files(FIXTURE)
    return {"symbol": ("s.json", symbol.read_bytes()), "params": ("p.params", params.read_bytes()),
            "config": ("config.json", json.dumps(CONFIG).encode()),
            "vocab": ("vocab.txt", (WORDPIECE / "vocab.txt").read_bytes())}


def reference(chosen: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The model's outputs on GluonNLP's ids, types and valid lengths for `chosen`."""
    symbol, params = model_files(FIXTURE)
    model = engine.load_model(symbol, params)
    inputs = {"data0": np.array([case["ids"] for case in chosen], np.float32),
              "data1": np.array([case["types"] for case in chosen], np.float32),
              "data2": np.array([case["valid_length"] for case in chosen], np.float32)}
    sequence, pooled = model.infer(inputs).values()
    return {"sequence": sequence, "pooled": pooled}
