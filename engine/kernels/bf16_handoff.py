"""A bf16 plan's float32 array handed from a depthwise layer to the AMX products reading it as
the bf16 pairs they take, so that no pairing pass runs between them.

A product on AMX reads its activation as bf16 words paired down its columns (`bf16`), which
a pass makes from the float32 array on every run. Where the array's writer is the vector
depthwise kernel (`depthwise_vector`) at batch 1, it offers a `PairedHandoff` for its output
in the plan's workspace; each reader that binds a 1×1 convolution's AMX product on it takes
it (`take`): the words it reads, one buffer for every taker, kept for this array alone. The
writer binds first and learns last whether every reader took: at each run it writes the
words in place of the float32 array only where all have (`taken`), and says so (``laid``);
a taker then skips its pairing, and pairs the float32 array as before otherwise. The words
are the pairing pass's to the bit: the same clamped float32 values, rounded to bf16 the
same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

TAG = "bf16 paired hand-off"


class PairedHandoff:
    """What a depthwise writer and the products reading its output share."""

    def __init__(self, readers: int) -> None:
        self.readers = readers  # inputs the plan binds to the array
        self.takers = 0  # those bound to read the words
        self.words: np.ndarray | None = None  # the words the takers read (float32-viewed)
        self.laid = False  # whether the writer's last run wrote the words (not the array)

    @property
    def taken(self) -> bool:
        """Whether every reader reads the words: the writer writes them only then."""
        return self.words is not None and self.takers == self.readers


def offer(workspace: Any, array: Any) -> PairedHandoff | None:
    """The writer's hand-off for ``array`` in a bf16 plan whose readers the plan noted, none
    of them the plan's output; else None."""
    if getattr(workspace, "precision", "fp32") != "bf16" or not hasattr(workspace, "readers"):
        return None
    readers = workspace.readers(array)
    if not readers or any(reader.op is None for reader in readers):
        return None
    return workspace.shared(array, TAG, lambda: PairedHandoff(len(readers)))


def offered(workspace: Any, array: Any) -> PairedHandoff | None:
    """The hand-off ``array``'s writer offered, not yet taken; None where there is none."""
    if workspace is None or not hasattr(workspace, "shared"):
        return None
    return workspace.shared(array, TAG)


def words_for(handoff: PairedHandoff, shape: tuple[int, int],
              workspace: Any) -> np.ndarray | None:
    """The words (``shape``, float32-viewed, zeroed once) a reader of the hand-off would
    read; None where a taker before it reads words of another shape."""
    if handoff.words is None:
        handoff.words = workspace.zeroed(shape, np.float32, (TAG, id(handoff)))
    return handoff.words if handoff.words.shape == shape else None


def take(handoff: PairedHandoff, pair: Callable[[], Any]) -> Callable[[], Any]:
    """A reader's, once its product reads `words_for`'s words: counted as taken, and its
    pairing ``pair`` as it then runs, only where the writer's run left the float32 array."""
    handoff.takers += 1
    return _PairUnlessLaid(handoff, pair)


class _PairUnlessLaid:
    def __init__(self, handoff: PairedHandoff, pair: Callable[[], Any]) -> None:
        self.handoff, self.pair = handoff, pair

    def __call__(self) -> None:
        if not self.handoff.laid:
            self.pair()
