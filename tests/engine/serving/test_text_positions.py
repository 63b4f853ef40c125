"""The position-table check: position Embeddings found in the graph (their indices derive from
a range op), their indices computed on the dry run's rows, and rows reaching past the table
refused naming the node and the sizes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import engine
from engine.graph.ir import Entry, Graph, make_node
from engine.serving.errors import InvalidModel
from engine.serving.text_positions import check_positions, position_lookups
from tests.conformance.fixtures import model_files

FIELD = "inputs.0.preprocess.text"


def _bert() -> engine.Model:
    symbol, params = model_files("gluonnlp_bert_tiny")
    return engine.load_model(symbol, params)


def _rows(length: int) -> dict[str, np.ndarray]:
    return {"data0": np.ones((1, length), np.float32), "data1": np.zeros((1, length), np.float32),
            "data2": np.array([length], np.float32)}


def test_the_bert_fixture_s_position_table_bounds_the_length() -> None:
    model = _bert()
    assert [node.name for node in position_lookups(model.graph)] == ["bertencoder0_embedding0"]
    check_positions(model, _rows(32), 32, FIELD)  # the table's 32 rows: every position fits
    with pytest.raises(InvalidModel) as refused:
        check_positions(model, _rows(33), 33, FIELD)
    assert str(refused.value) == (
        f"{FIELD}.max_length: rows of 33 tokens take positions up to 32, but node "
        "'bertencoder0_embedding0' (Embedding) looks positions up in a table of 32 rows; "
        "positions past it would be clipped to its last row and the answers silently wrong: "
        "set max_length to at most 32, the longest the model was built for")


def test_the_clipping_it_prevents_changes_the_answer() -> None:
    # Why the check exists: past the table, positions 32 and 33 read the same row.
    model = _bert()
    sequence = next(iter(model.infer(_rows(34)).values()))
    np.testing.assert_allclose(sequence[0, 32], sequence[0, 33], rtol=1e-5, atol=1e-6)
    assert not np.allclose(sequence[0, 30], sequence[0, 31], rtol=1e-3, atol=1e-4)


def _offset_positions(start: float, table: int) -> SimpleNamespace:
    """ids [N, L] -> positions arange_like(ids, axis=1, start) -> Embedding over `table` rows:
    positions shifted as RoBERTa's are (padding index first)."""
    nodes = (make_node("null", "ids"),
             make_node("_contrib_arange_like", "positions", {"axis": "1", "start": str(start)},
                       (Entry(0),)),
             make_node("null", "position_weight"),
             make_node("Embedding", "position_embed",
                       {"input_dim": str(table), "output_dim": "4"}, (Entry(1), Entry(2))))
    graph = Graph(nodes, (Entry(3),))
    return SimpleNamespace(graph=graph,
                           params={"position_weight": np.zeros((table, 4), np.float32)})


def test_offset_positions_are_computed_not_assumed() -> None:
    model = _offset_positions(start=2, table=10)
    check_positions(model, {"ids": np.zeros((1, 8), np.float32)}, 8, FIELD)  # 2..9 fit
    with pytest.raises(InvalidModel, match=r"rows of 9 tokens take positions up to 10, but "
                                           r"node 'position_embed' \(Embedding\) looks positions "
                                           r"up in a table of 10 rows.*at most 8,"):
        check_positions(model, {"ids": np.zeros((1, 9), np.float32)}, 9, FIELD)


def test_word_embeddings_and_unknown_inputs_are_left_alone() -> None:
    model = _bert()
    # The word and token type embeddings read the inputs, not positions.
    names = {node.name for node in position_lookups(model.graph)}
    assert "bertmodel0_word_embed_embedding0_fwd" not in names
    # Positions that need an input the dry run does not give cannot be computed: no refusal.
    offset = _offset_positions(start=0, table=4)
    check_positions(offset, {"other": np.zeros((1, 9), np.float32)}, 9, FIELD)
