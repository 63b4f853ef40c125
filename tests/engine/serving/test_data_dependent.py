"""A model whose output shapes depend on the data is served one request at a time: configless
completion gives ``max_batch_size`` 1 and says why when a config asks for batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.config import ModelConfig
from engine.serving.errors import InvalidModel
from engine.serving.validate import load_and_validate
from tests.conformance.fixtures import assert_close, model_io_sets, op_cases
from tests.engine.serving.helpers import run
from tests.engine.serving.test_configless import _validate

NAME = "boolean_mask_tiny"


def test_completion_serves_a_data_dependent_model_one_request_at_a_time() -> None:
    validated = _validate(NAME)
    assert validated.config.max_batch_size == 1
    assert validated.config.batch_buckets is None
    assert validated.model.data_dependent.startswith(
        "node 'maskedscores0_boolean_mask0' (_contrib_boolean_mask) keeps the rows")


def test_a_config_asking_a_data_dependent_model_for_batches_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidModel, match=r"upload of boolean_mask_tiny: its output shapes "
                                           r"depend on the data \(node 'maskedscores0_boolean_"
                                           r"mask0' \(_contrib_boolean_mask\) keeps the rows.*\), "
                                           r"so rows of different requests must not share a "
                                           r"batch, so config.json must not ask for "
                                           r"max_batch_size 4"):
        _validate(NAME, ModelConfig(max_batch_size=4))


def test_a_graph_whose_output_rows_are_set_by_the_data_is_refused_at_load() -> None:
    case = next(case for case in op_cases() if case["id"] == "npi_unique_counts")

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return engine.load_model(case["symbol"], device=device, keep_batch=True)

    with pytest.raises(InvalidModel, match=r"upload: output 'op_output0' has a row count set by "
                                           r"the data \(node 'op' \(_npi_unique\) returns one "
                                           r"entry per distinct value.*cannot serve this graph"):
        load_and_validate(Path("unused"), ModelConfig(), loader=loader, device="cpu",
                          where="upload")


def test_concurrent_requests_each_get_their_own_answer() -> None:
    validated = _validate(NAME)
    sets = [(inputs, expected) for inputs, expected in model_io_sets(NAME)
            if inputs["data"].shape[0] == 1]
    assert len(sets) >= 2

    async def serve() -> list[dict[str, np.ndarray]]:
        import asyncio

        policy = BatchingPolicy.from_config(validated.config)
        async with DynamicBatcher(validated.model.infer, policy, name=NAME) as batcher:
            return await asyncio.gather(*(batcher.submit(inputs) for inputs, _ in sets))

    for answer, (_, expected) in zip(run(serve()), sets, strict=True):
        for actual, reference in zip(answer.values(), expected, strict=True):
            assert_close(actual, reference, {"rtol": 1e-4, "atol": 1e-5}, NAME)
