"""Text pipelines checked at upload: the vocabulary (uploaded as part 'vocab', or beside
config.json in a repository folder), the inputs they fill, the graph's embedding, a dry run."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.serving.repository import ModelRepository
from engine.serving.text import TextPipeline
from tests.conformance.fixtures import model_files
from tests.engine.serving.helpers import run
from tests.engine.serving.test_repository import write_version
from tests.service.helpers import AUTH, serving, settings_for
from tests.service.text_model import CONFIG, FIXTURE, NAME, WORDPIECE, upload_files

VOCAB = (WORDPIECE / "vocab.txt").read_bytes()


def _config(**text: Any) -> dict[str, Any]:
    config = copy.deepcopy(CONFIG)
    config["inputs"][0]["preprocess"]["text"].update(text)
    return config


def _upload(tmp_path: Path, config: dict[str, Any], vocab: bytes | None = VOCAB,
            ) -> tuple[int, dict[str, Any]]:
    files = upload_files()
    files["config"] = ("config.json", json.dumps(config).encode())
    if vocab is None:
        del files["vocab"]
    else:
        files["vocab"] = ("vocab.txt", vocab)

    async def scenario() -> tuple[int, dict[str, Any]]:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            response = await client.post(f"/models/{NAME}", files=files, headers=AUTH)
            return response.status_code, response.json()

    return run(scenario())


def test_the_upload_answers_the_check_and_serves_the_completed_pipeline(tmp_path: Path) -> None:
    status, answer = _upload(tmp_path, CONFIG)
    assert status == 201, answer
    assert answer["checks"]["preprocess"] == {
        "ran": True, "inputs": {"text": [16], "data1": [16], "data2": []}, "reason": None,
        "warnings": []}
    text = answer["config"]["inputs"][0]["preprocess"]["text"]
    assert (text["max_length"], text["lower_case"], text["padding"]) == (16, True, "max_length")
    assert (tmp_path / NAME / "1" / "vocab.txt").read_bytes() == VOCAB  # kept with the version


@pytest.mark.parametrize("change, vocab, message", [
    ({}, None, "inputs.0.preprocess.text.vocab: no file 'vocab.txt' in the version's folder or "
     "beside config.json; upload it as part 'vocab'"),
    ({}, b"[PAD]\n[UNK]\n[CLS]\nthe\n", "'vocab.txt': it lacks the special token(s) [SEP]"),
    ({}, VOCAB + b"".join(b"extra%d\n" % index for index in range(10)),
     "the vocabulary has 60 tokens, but node 'bertmodel0_word_embed_embedding0_fwd' "
     "(Embedding) embeds only 50 (input_dim)"),
    ({"token_types": "segments"}, VOCAB, "names input 'segments' for the token types; the "
     "model's inputs are ['text', 'data1', 'data2']"),
    ({"token_types": "data2", "valid_length": "data1"}, VOCAB,
     "input 'data2' has shape [-1] (FP32); the token types need a numeric [-1, L]"),
    ({"padding": "fixed"}, VOCAB, "inputs.0.preprocess.text.padding"),
    ({"max_length": 33}, VOCAB, "inputs.0.preprocess.text.max_length: rows of 33 tokens take "
     "positions up to 32, but node 'bertencoder0_embedding0' (Embedding) looks positions up in "
     "a table of 32 rows"),
    ({"max_length": 40, "padding": "longest"}, VOCAB, "set max_length to at most 32"),
])
def test_pipelines_that_cannot_serve_are_refused(tmp_path: Path, change: dict[str, Any],
                                                 vocab: bytes | None, message: str) -> None:
    status, answer = _upload(tmp_path, _config(**change), vocab)
    assert status == 422, answer
    assert message in answer["error"]


def test_a_fixed_sequence_length_pads_to_it_and_bounds_max_length(tmp_path: Path) -> None:
    config = _config(max_length=8)
    config["inputs"][0]["shape"] = [-1, 12]
    status, answer = _upload(tmp_path / "ok", config)
    assert status == 201, answer
    assert answer["checks"]["preprocess"]["inputs"]["text"] == [12]
    config = _config(max_length=16)
    config["inputs"][0]["shape"] = [-1, 12]
    status, answer = _upload(tmp_path / "long", config)
    assert status == 422
    assert "fixes the sequence length at 12" in answer["error"]


def test_a_vocabulary_beside_config_json_serves(tmp_path: Path) -> None:
    symbol, params = model_files(FIXTURE)
    write_version(tmp_path, NAME, 1, symbol.read_bytes(), params.read_bytes())
    (tmp_path / NAME / "config.json").write_text(json.dumps(_config(padding="longest")))
    (tmp_path / NAME / "vocab.txt").write_bytes(VOCAB)

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        try:
            pipeline = repo.get(NAME).pipelines["text"]
            assert isinstance(pipeline, TextPipeline) and pipeline.pad_to is None
            encoded = pipeline.encode([("the cat",), ("a dog", "it sat")])
            np.testing.assert_array_equal(encoded["text"],
                                          [[2, 11, 14, 3, 0, 0, 0], [2, 12, 15, 3, 19, 16, 3]])
        finally:
            await repo.close()

    run(main())
