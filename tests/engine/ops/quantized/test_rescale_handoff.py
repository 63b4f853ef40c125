"""`handoff.Rescale`: a reader's ask that its data's writer write the reader's rescaled output
too, granted only to the node bound right after the writer, and written by a fused
convolution only where that output's buffer cannot hold a value the product still reads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.ops.quantized import fused, handoff


class _Workspace:
    """The parts of a plan's workspace the hand-off reads: its readers and the count of the
    outputs it noted (each node's, before the node is bound)."""

    def __init__(self, readers: int) -> None:
        self.noted = 0
        self._readers = readers
        self._shared: dict = {}

    def note(self, outputs: int) -> None:
        self.noted += outputs

    def readers(self, array):
        return (SimpleNamespace(op="_sg_mkldnn_conv"),) * self._readers

    def shared(self, array, tag, make=None):
        key = (id(array), tag)
        if key not in self._shared and make is not None:
            self._shared[key] = make()
        return self._shared.get(key)


def _offered(monkeypatch, workspace, array):
    monkeypatch.setattr(handoff, "can_read", lambda reader: True)
    workspace.note(3)  # the writer's outputs (values, min, max)
    return handoff.offer(workspace, array)


def _rescale():
    return handoff.Rescale(lambda low, high: (None, None), np.zeros(4, np.uint8),
                           handoff.Handoff(1))


def test_the_node_bound_right_after_the_writer_gets_its_ask(monkeypatch):
    workspace = _Workspace(2)
    offered = _offered(monkeypatch, workspace, np.zeros(4, np.int8))
    workspace.note(3)  # the reader's outputs
    first, second = _rescale(), _rescale()
    assert handoff.ask_rescaled(workspace, offered, first, 3) is first
    assert offered.rescale is first
    assert handoff.ask_rescaled(workspace, offered, second, 3) is None  # one ask a hand-off


def test_a_node_bound_between_them_refuses_the_ask(monkeypatch):
    """A node between the writer and the reader might read or write the buffer the plan
    gives the reader's output while the writer's early write sits there."""
    workspace = _Workspace(2)
    offered = _offered(monkeypatch, workspace, np.zeros(4, np.int8))
    workspace.note(1)  # another node's output
    workspace.note(3)  # the reader's
    assert handoff.ask_rescaled(workspace, offered, _rescale(), 3) is None
    assert offered.rescale is None


def test_no_hand_off_no_ask():
    assert handoff.ask_rescaled(_Workspace(1), None, _rescale(), 3) is None
    assert handoff.ask_rescaled(SimpleNamespace(), handoff.Handoff(1), _rescale(), 3) is None


def test_the_second_output_may_share_only_a_residual_or_a_copied_datas_bytes():
    """The plan may give the rescaled output the buffer of an input dying at the writer:
    the residual's own bytes (each read just before its place is written), or the data's
    where the product reads a copy; never data read where they lie, nor part of a buffer."""
    buffer = np.zeros(64, np.int8)
    out = buffer[:32].view(np.uint8)
    in_place, copied = (SimpleNamespace(reads_data_in_place=flag) for flag in (True, False))
    may_share = fused._FusedInt8Conv._may_share
    assert may_share("sum", buffer[:32], out, in_place)
    assert not may_share("sum", buffer[16:48], out, in_place)  # shifted: read after written
    assert not may_share("sum", buffer, out, in_place)  # longer
    assert may_share("data", buffer[:32], out, copied)
    assert not may_share("data", buffer[:32], out, in_place)
    assert not may_share("min_data", buffer[:1], out, copied)
    assert may_share("data", np.zeros(32, np.uint8), out, in_place)  # apart
