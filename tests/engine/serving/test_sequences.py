"""Stateful sequences (issue #38, Triton's sequence batcher): the time-major GluonNLP LSTM
language model fed one token a request, its h and c states kept by the server, answers what
MXNet answers for the whole sentence from zero states; concurrent sequences run in batches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import InputError
from engine.serving.config import parse_config
from engine.serving.errors import InvalidModel
from engine.serving.loaded import LoadedVersion
from engine.serving.repository import ModelRepository
from engine.serving.sequences import SequenceControl
from tests.conformance.fixtures import assert_close, model_files
from tests.engine.serving.helpers import run
from tests.engine.serving.sequence_lstm import (
    LSTM,
    STATES,
    TENSORS,
    TOLERANCE,
    reference,
    sequence_config,
)


@asynccontextmanager
async def served(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[LoadedVersion]:
    symbol, params = model_files(LSTM)
    repo = ModelRepository(tmp_path / "repo")
    await repo.start()
    try:
        await repo.add_version(LSTM, symbol.read_bytes(), params.read_bytes(), config=config)
        yield repo.get(LSTM)
    finally:
        await repo.close()


def token(tokens: np.ndarray, step: int, sentence: int) -> dict[str, np.ndarray]:
    """One step's request: one token of one sentence, time-major ``[1, 1]``."""
    return {"tokens": tokens[step:step + 1, sentence:sentence + 1]}


async def feed(handle: LoadedVersion, tokens: np.ndarray, sentence: int, sequence_id: Any
               ) -> list[dict[str, np.ndarray]]:
    """A sentence token by token as one sequence; every step's outputs."""
    steps = len(tokens)
    return [await handle.infer(token(tokens, step, sentence), rows=1, sequence=SequenceControl(
        sequence_id, start=step == 0, end=step == steps - 1)) for step in range(steps)]


def check_sentence(answers: list[dict[str, np.ndarray]], logits: np.ndarray,
                   sentence: int) -> None:
    for step, outputs in enumerate(answers):
        assert list(outputs) == ["logits"], "the states stay in the server"
        assert_close(outputs["logits"], logits[step:step + 1, sentence:sentence + 1],
                     TOLERANCE, f"sentence {sentence} step {step}")


def in_loop(tmp_path: Path, config: dict[str, Any],
            body: Callable[[LoadedVersion], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        async with served(tmp_path, config) as handle:
            await body(handle)
    run(main(), timeout=240)


@pytest.mark.parametrize("strategy", [{"direct": {"max_queue_delay_microseconds": 20_000,
                                                   "minimum_slot_utilization": 0.25}},
                                      {"oldest": {"max_candidate_sequences": 8,
                                                  "max_queue_delay_microseconds": 20_000}}])
def test_eight_sentences_token_by_token_answer_mxnets_whole_sentences_in_batches(
        tmp_path: Path, strategy: dict[str, Any]) -> None:
    tokens, logits = reference()

    async def body(handle: LoadedVersion) -> None:
        assert list(handle.input_specs) == ["tokens"] and handle.output_names == ["logits"]
        answers = await asyncio.gather(*(feed(handle, tokens, sentence, 100 + sentence)
                                         for sentence in range(8)))
        for sentence, answer in enumerate(answers):
            check_sentence(answer, logits, sentence)
        stats = handle.batcher.stats
        joined = stats.batch_rows.count - stats.batch_rows.counts[0]  # batches above 1 row
        assert joined > 0 and stats.batch_rows.total == 80, stats.batch_rows
        sequences = handle.sequences
        assert sequences is not None
        assert (sequences.stats.started, sequences.stats.ended, sequences.live) == (8, 8, 0)

    in_loop(tmp_path, sequence_config(**strategy), body)


def test_string_ids_and_a_sequence_restarted_begin_from_zeros(tmp_path: Path) -> None:
    tokens, logits = reference()

    async def body(handle: LoadedVersion) -> None:
        check_sentence(await feed(handle, tokens[:4], 2, "sentence-two"), logits, 2)
        # Started again without ending: the same id begins afresh, from zero states.
        half = [await handle.infer(token(tokens, 0, 3), sequence=SequenceControl(
            "again", start=True))]
        check_sentence(half, logits, 3)
        check_sentence(await feed(handle, tokens, 3, "again"), logits, 3)

    in_loop(tmp_path, sequence_config(), body)


def test_requests_outside_a_started_sequence_are_refused(tmp_path: Path) -> None:
    tokens, _ = reference()

    async def body(handle: LoadedVersion) -> None:
        step = token(tokens, 0, 0)
        with pytest.raises(InputError, match=r"sequence_id 7 has not started.*sequence_start"):
            await handle.infer(step, sequence=SequenceControl(7))
        with pytest.raises(InputError, match=r"serves sequences .* sequence_id"):
            await handle.infer(step)
        with pytest.raises(InputError, match=r"input 'h_in' is a sequence's implicit state"):
            await handle.infer({**step, "h_in": np.zeros((2, 1, 32), np.float32)},
                               sequence=SequenceControl(1, start=True))
        with pytest.raises(InputError, match=r"one row \(batch size 1\), got 2"):
            await handle.infer({"tokens": tokens[:1, :2]}, sequence=SequenceControl(
                1, start=True))
        await handle.infer(step, sequence=SequenceControl(3, start=True, end=True))
        with pytest.raises(InputError, match=r"sequence_id 3 has not started"):
            await handle.infer(step, sequence=SequenceControl(3))

    in_loop(tmp_path, sequence_config(), body)


def test_an_idle_sequence_is_dropped_and_counted(tmp_path: Path) -> None:
    tokens, _ = reference()

    async def body(handle: LoadedVersion) -> None:
        sequences = handle.sequences
        assert sequences is not None
        await handle.infer(token(tokens, 0, 0), sequence=SequenceControl(5, start=True))
        assert sequences.live == 1
        for _ in range(600):  # the sweep runs 0.2 s after the last request; allow 60 s
            if sequences.stats.dropped_idle:
                break
            await asyncio.sleep(0.1)
        assert (sequences.stats.dropped_idle, sequences.live) == (1, 0)
        with pytest.raises(InputError, match=r"sequence_id 5 has not started; it was dropped "
                                             r"after 0.2 s without a request"):
            await handle.infer(token(tokens, 1, 0), sequence=SequenceControl(5))

    in_loop(tmp_path, sequence_config(max_sequence_idle_microseconds=200_000), body)


def test_a_start_waits_for_a_place_among_the_candidates(tmp_path: Path) -> None:
    """One candidate: a second sequence starts only once the first has ended."""
    tokens, logits = reference()

    async def body(handle: LoadedVersion) -> None:
        sequences = handle.sequences
        assert sequences is not None
        await handle.infer(token(tokens, 0, 0), sequence=SequenceControl(1, start=True))
        second = asyncio.ensure_future(feed(handle, tokens, 1, 2))
        for _ in range(600):
            if sequences.stats.waiting:
                break
            await asyncio.sleep(0.05)
        assert sequences.stats.waiting == 1 and not second.done()
        with pytest.raises(Exception, match="no free place"):
            await handle.infer(token(tokens, 0, 2), timeout_s=0.05,
                               sequence=SequenceControl(3, start=True))
        await handle.infer(token(tokens, 1, 0), sequence=SequenceControl(1, end=True))
        check_sentence(await second, logits, 1)

    in_loop(tmp_path, sequence_config(oldest={"max_candidate_sequences": 1}), body)


def test_without_a_batch_dimension_each_step_runs_alone(tmp_path: Path) -> None:
    """max_batch_size 0: the states have whole shapes (dims given, the LSTM's state being
    open in its second dimension), and each step runs as it is."""
    tokens, logits = reference()
    states = [{**state, "dims": [2, 1, 32]} for state in STATES]
    config = {**sequence_config(), "max_batch_size": 0}
    config["sequence_batching"] = {**config["sequence_batching"], "state": states}

    async def body(handle: LoadedVersion) -> None:
        answers = await asyncio.gather(*(feed(handle, tokens, sentence, sentence + 1)
                                         for sentence in range(2)))
        for sentence, answer in enumerate(answers):
            check_sentence(answer, logits, sentence)
        stats = handle.batcher.stats
        assert stats.batch_rows.counts[0] == stats.batches == 20  # every step alone

    in_loop(tmp_path, config, body)


def test_config_names_triton_fields_and_refuses_what_it_cannot_serve() -> None:
    config = parse_config(sequence_config(
        max_sequence_idle_microseconds=0,
        oldest={"max_candidate_sequences": 4, "preferred_batch_size": [4, 2],
                "max_queue_delay_microseconds": 100}), "test")
    sequences = config.sequence_batching
    assert sequences is not None
    assert sequences.max_sequence_idle_microseconds == 1_000_000  # Triton's 0: one second
    assert sequences.preferred_batch_sizes(32) == (2, 4) and sequences.max_queue_delay_us == 100
    assert sequences.active_limit(config.max_batch_size) == 4
    direct = parse_config(sequence_config(direct={"max_queue_delay_microseconds": 100}), "t")
    assert direct.sequence_batching is not None
    assert direct.sequence_batching.active_limit(32) == 32
    # As in Triton, the direct strategy's delay needs a minimum slot utilization.
    assert direct.sequence_batching.max_queue_delay_us == 0
    direct = parse_config(sequence_config(direct={"max_queue_delay_microseconds": 100,
                                                  "minimum_slot_utilization": 0.5}), "t")
    assert direct.sequence_batching is not None
    assert direct.sequence_batching.max_queue_delay_us == 100
    assert direct.sequence_batching.preferred_batch_sizes(8) == (4, 5, 6, 7, 8)
    for bad, message in [
            ({"direct": {}, "oldest": {}}, "one strategy, direct or oldest"),
            ({"state": [{**STATES[0], "initial_state": [{"data_file": "h.bin"}]}]},
             "only zero_data"),
            ({"state": [STATES[0], STATES[0]]}, r"each input_name once; \['h_in'\] repeated")]:
        with pytest.raises(InvalidModel, match=message):
            parse_config({**TENSORS, "sequence_batching": {"state": STATES, **bad}}, "test")


@pytest.mark.parametrize("sequence_batching, message", [
    ({"state": [{"input_name": "h_in", "output_name": "h", "dims": [3, 32]}]},
     r"sequence_batching.state.0: dims \[3, 32\] do not fit input 'h_in''s shape "
     r"\[2, -1, 32\] less its batch axis 1"),
    ({"state": [{"input_name": "h_in", "output_name": "h", "data_type": "TYPE_INT32"}]},
     r"sequence_batching.state.0: data_type 'TYPE_INT32' differs from input 'h_in''s FP32"),
    ({"state": STATES, "oldest": {"preferred_batch_size": [64]}},
     r"sequence_batching.oldest.preferred_batch_size \[64\] exceed max_batch_size 32"),
    ({"state": [{"input_name": "nope", "output_name": "h"}]},
     r"sequence_batching.state.0: the model has no input 'nope'; its inputs are "
     r"\['tokens', 'h_in', 'c_in'\]"),
    ({"state": [*STATES, {"input_name": "tokens", "output_name": "logits"}]},
     r"sequence_batching.state.0: every input is a state; a request must send at least one")])
def test_a_state_that_does_not_fit_the_completed_config_is_refused_on_load(
        tmp_path: Path, sequence_batching: dict[str, Any], message: str) -> None:
    async def main() -> None:
        symbol, params = model_files(LSTM)
        repo = ModelRepository(tmp_path / "repo")
        await repo.start()
        try:
            with pytest.raises(InvalidModel, match=message):
                await repo.add_version(LSTM, symbol.read_bytes(), params.read_bytes(),
                                       config={**TENSORS,
                                               "sequence_batching": sequence_batching})
        finally:
            await repo.close()

    run(main(), timeout=240)


def test_a_state_naming_no_tensor_of_the_graph_is_refused_on_load(tmp_path: Path) -> None:
    """Without inputs and outputs in config.json the names are checked once they are
    completed from the graph."""
    async def main() -> None:
        symbol, params = model_files(LSTM)
        repo = ModelRepository(tmp_path / "repo")
        await repo.start()
        try:
            with pytest.raises(InvalidModel, match=r"sequence_batching.state.0: the model has "
                                                   r"no input 'h_in'; its inputs are \['data0', "
                                                   r"'data1', 'data2'\]"):
                await repo.add_version(LSTM, symbol.read_bytes(), params.read_bytes(),
                                       config={"sequence_batching": {"state": STATES}})
        finally:
            await repo.close()

    run(main(), timeout=240)
