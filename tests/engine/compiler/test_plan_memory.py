"""Memory planning's rule for ``writes_ahead`` ops: a reader of such an op's output, whose
output the op's step may write while it still reads its own input 0, takes no buffer of that
input, though the input dies at the op."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.compiler.plan_memory import plan_memory
from engine.graph.ir import Entry, Graph, make_node
from engine.ops import registry
from engine.ops.attrs import parse_bool

PLAIN, AHEAD = "_plan_test_plain", "_plan_test_writes_ahead"


@pytest.fixture(autouse=True)
def _test_ops(monkeypatch):
    """Two elementwise test ops that never write over their input: one plain, one
    ``writes_ahead`` for nodes whose ``ahead`` attribute is set."""
    base = registry.get_op("relu")
    plain = dataclasses.replace(base, name=PLAIN, aliases=(), inplace=False,
                                params=(registry.Param("ahead", parse_bool, False),))
    ahead = dataclasses.replace(plain, name=AHEAD, writes_ahead=lambda attrs: attrs.ahead)
    monkeypatch.setitem(registry._REGISTRY, PLAIN, plain)
    monkeypatch.setitem(registry._REGISTRY, AHEAD, ahead)


def _chain(writer: str, ahead: bool = True, writes_ahead: tuple[int, ...] = ()):
    """data → first → writer → reader → last, every value (64,) float32; ``writes_ahead``:
    the nodes the caller says write ahead."""
    nodes = (make_node("null", "data"),
             make_node(PLAIN, "first", {}, (Entry(0),)),
             make_node(writer, "writer", {"ahead": str(ahead)}, (Entry(1),)),
             make_node(PLAIN, "reader", {}, (Entry(2),)),
             make_node(PLAIN, "last", {}, (Entry(3),)))
    graph = Graph(nodes, (Entry(4),))
    shapes = [[(64,)]] * len(nodes)
    dtypes = [[np.dtype(np.float32)]] * len(nodes)
    return plan_memory(graph, shapes, dtypes, writes_ahead=writes_ahead).buffer_of


def test_a_plain_writers_reader_takes_the_buffer_its_input_freed():
    buffer_of = _chain(PLAIN)
    assert buffer_of[(3, 0)] == buffer_of[(1, 0)]


def test_the_reader_of_a_writer_ahead_keeps_apart_from_the_writers_input():
    buffer_of = _chain(AHEAD)
    assert buffer_of[(3, 0)] not in (buffer_of[(1, 0)], buffer_of[(2, 0)])
    # the rule binds only that reader: the next node takes the freed buffer again
    assert buffer_of[(4, 0)] == buffer_of[(1, 0)]


def test_a_node_the_caller_names_writes_ahead_as_an_op_saying_so_does():
    """A plan's caller may name nodes of any op that write ahead (`expansion_chain`'s
    expansions): their readers keep apart from their input as a ``writes_ahead`` op's do."""
    assert _chain(PLAIN, writes_ahead=(2,)) == _chain(AHEAD)


def test_a_node_of_the_op_whose_attrs_say_no_leaves_the_plan_as_it_was():
    assert _chain(AHEAD, ahead=False) == _chain(PLAIN)


def test_a_reader_with_a_node_between_it_and_the_writer_takes_the_freed_buffer():
    """Only the node right after the writer may be written ahead (`handoff.ask_rescaled`
    grants no other), so a reader further on plans as any node."""
    nodes = (make_node("null", "data"),
             make_node(PLAIN, "first", {}, (Entry(0),)),
             make_node(AHEAD, "writer", {"ahead": "True"}, (Entry(1),)),
             make_node(PLAIN, "between", {}, (Entry(2),)),
             make_node(PLAIN, "reader", {}, (Entry(2),)),
             make_node(PLAIN, "last", {}, (Entry(3),)))
    graph = Graph(nodes, (Entry(4), Entry(5)))
    buffer_of = plan_memory(graph, [[(64,)]] * len(nodes),
                            [[np.dtype(np.float32)]] * len(nodes)).buffer_of
    assert buffer_of[(3, 0)] != buffer_of[(1, 0)]  # the node right after keeps apart
    assert buffer_of[(4, 0)] == buffer_of[(1, 0)]  # the one after it need not
