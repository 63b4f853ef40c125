"""A plan's int8 array handed from its writer to its readers channels-last.

An int8/uint8 array written by a fused convolution (`fused`), an int8 max pooling (`layers`)
or a calibrated quantize (`convert`), that only ops able to read it channels-last read (fused
int8 convolutions as data or residual, int8 max pooling, dequantize: each registers which of
its readers can, `register_reader`), is written N, H, W, C in its (N, C, H, W) buffer, so that
neither side transposes it. The writer offers a `Handoff` for its output in the plan's
workspace when every reader the plan binds is of those kinds; each reader that binds a path
able to read either layout takes it; the writer lays the bytes channels-last only when all
have, and says at each run which layout it wrote (a writer on the NumPy path writes NCHW).

A reader that rescales the array per channel into an array of its own (`rescale`: ResNet v2's
pre-activation BatchNorm and relu of a residual sum) may ask its writer, through the same
hand-off, to write that rescaled array too (`Rescale`): a fused convolution whose requantize
runs in its product's epilogue, or as an AVX2 host's vector pass, writes both at once, and
says at each run whether it did; the reader then runs no pass of its own, and nothing reads
the array again for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TAG = "int8 channels-last hand-off"

# op name -> whether a reader of that op (a `workspace.Reader`) binds a path taking either layout
_readers_by_op: dict[str, Callable[[Any], bool]] = {}


def register_reader(op: str, accepts: Callable[[Any], bool]) -> None:
    """Say that readers of ``op`` for which ``accepts`` holds take a hand-off at bind."""
    _readers_by_op[op] = accepts


def can_read(reader: Any) -> bool:
    """Whether ``reader`` is one an op registered (`register_reader`) as taking a hand-off."""
    accepts = _readers_by_op.get(reader.op)
    return accepts is not None and accepts(reader)


def gains(reader: Any) -> bool:
    """Whether ``reader`` gains from a hand-off: every taker but a dequantize, which would
    transpose the bytes in the writer's stead."""
    return reader.op != "_contrib_dequantize"


class Handoff:
    """What a writer and its readers share about one array."""

    def __init__(self, readers: int) -> None:
        self.readers = readers  # inputs the plan binds to the array
        self.takers = 0  # those bound to read either layout, that took this hand-off
        self.laid = False  # what the last run of the writer wrote
        self.rescale: Rescale | None = None  # one reader's ask for its rescaled bytes too
        self.noted: int | None = None  # the workspace's outputs noted when it was offered
        # whether the writer runs an asking reader's step at the end of its own (`Rescale`)
        self.runs_follower = False

    @property
    def taken(self) -> bool:
        """Whether every reader took the hand-off (one bound otherwise, as an op's plain
        kernel, would read the bytes as NCHW): the writer lays them channels-last only then."""
        return self.takers == self.readers


def offer(workspace: Any, array: Any) -> Handoff | None:
    """The writer's hand-off for ``array`` where the plan noted its readers, each can read
    it (`can_read`) and one at least gains from it (`gains`); else None."""
    readers = workspace.readers(array) if hasattr(workspace, "readers") else None
    if not readers or not all(map(can_read, readers)) or not any(map(gains, readers)):
        return None
    handoff = workspace.shared(array, TAG, lambda: Handoff(len(readers)))
    handoff.noted = getattr(workspace, "noted", None)
    return handoff


def take(workspace: Any, array: Any) -> Handoff | None:
    """A reader's: the hand-off its writer offered for ``array``, counted as taken; None
    where there is none (the bytes are NCHW)."""
    if workspace is None or not hasattr(workspace, "shared"):
        return None
    handoff = workspace.shared(array, TAG)
    if handoff is not None:
        handoff.takers += 1
    return handoff


class Rescale:
    """A reader's ask that the writer of a hand-off's array also write the reader's own
    output: ``out`` = saturate(rint(x · scale[c] + shift[c])) of each value x, channels-last,
    with ``terms(low, high)`` the reader's (scale, shift) for the array's range. ``out_handoff``
    is the reader's own output's hand-off: the writer writes ``out`` only where it is taken
    (every reader of ``out`` reads it channels-last)."""

    def __init__(self, terms: Callable[[Any, Any], tuple[Any, Any]], out: Any,
                 out_handoff: Handoff) -> None:
        self.terms, self.out, self.out_handoff = terms, out, out_handoff
        # the (low, high) range the writer's last run wrote ``out`` for; None where it did not
        self.written: tuple[float, float] | None = None
        # the reader's whole step, where it binds none in the plan: the writer, whose hand-off
        # `runs_follower`, runs it at the end of its own step (the reader's next anyway), so
        # a run where the writer wrote ``out`` calls no idle step of the reader's
        self.follow: Callable[[], None] | None = None


def ask_rescaled(workspace: Any, handoff: Handoff | None, rescale: Rescale,
                 outputs: int) -> Rescale | None:
    """``rescale`` asked of ``handoff``'s writer (a reader's, at bind, the reader having
    ``outputs`` outputs); None where there is no hand-off, another reader asked first, or
    the reader is not the node bound right after the writer (the reader then runs its own
    pass). The writer writes ``rescale.out`` a step early: where the reader's step comes
    next, the only arrays that buffer may have held and that are still read then are the
    writer's own inputs, which the writer checks; a node between them
    could read or write that buffer in the meantime."""
    noted = getattr(workspace, "noted", None)
    if handoff is None or handoff.rescale is not None or noted is None or \
            handoff.noted is None or noted != handoff.noted + outputs:
        return None
    handoff.rescale = rescale
    return rescale
