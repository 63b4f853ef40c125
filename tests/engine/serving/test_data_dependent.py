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
from engine.serving.validate import checks_of, load_and_validate
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


def _unique_counts(config: ModelConfig) -> Any:
    case = next(case for case in op_cases() if case["id"] == "npi_unique_counts")

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return engine.load_model(case["symbol"], device=device, keep_batch=True)

    return load_and_validate(Path("unused"), config, loader=loader, device="cpu",
                             where="upload")


def test_a_graph_whose_output_rows_are_set_by_the_data_is_served_whole() -> None:
    """No row per input row to answer with, so no batch: whole shapes, one request a run."""
    validated = _unique_counts(ModelConfig())
    assert validated.config.max_batch_size == 0
    checks = checks_of(validated.model)
    assert checks is not None
    reason = checks.as_dict()["batch_axes"]["reason"]
    assert reason.startswith("output 'op_output0' has a row count set by the data (node 'op' "
                             "(_npi_unique) returns one entry per distinct value")
    assert reason.endswith("requests run one at a time with whole shapes (max_batch_size 0)")


def test_a_graph_whose_output_rows_are_set_by_the_data_refuses_a_stated_batch() -> None:
    with pytest.raises(InvalidModel, match=r"upload: output 'op_output0' has a row count set by "
                                           r"the data \(node 'op' \(_npi_unique\) returns one "
                                           r"entry per distinct value.*must not ask for "
                                           r"max_batch_size 4; set max_batch_size 0"):
        _unique_counts(ModelConfig(max_batch_size=4))


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
