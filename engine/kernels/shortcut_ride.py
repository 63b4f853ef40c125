"""A downsampling block's 1×1 stride-2 shortcut run inside its stride-2 3×3's step, over
the 3×3's grid of bf16 pairs.

ResNet v1's downsampling block reads its input twice: a 3×3 convolution of stride 2 and
padding 1 (`conv_amx`, its input paired into 2 × 2 phase planes of a zero-bordered grid)
and a 1×1 convolution of stride 2, no padding (the shortcut), whose pixels ``(2y, 2x)`` are
exactly what the 3×3's tap (1, 1) reads: one phase plane of that grid. Alone, the shortcut
pairs every other pixel of every other row again (im2col's pairing) into words of its own.
Where it is the node bound right after the 3×3 and reads the same array, its product is
instead a direct product of that one tap over the 3×3's grid (`conv_amx.shortcut_riders`),
run in the 3×3's step right after each chunk's pairing, while the chunk's grid is in cache
(a batch's chunks share one grid buffer, so no later step could read it). The shortcut's
own step then does nothing.

The 3×3 binds first and notes its chunks' grids (`offer`); the shortcut finds them
(`offered`) and adds a product to each chunk's ``riders``. The shortcut's output must lie
apart from everything the 3×3's step reads or writes: its step is the one after, so no step
between could use its memory, but the 3×3's own operands could.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import parts

TAG = "stride-2 grid riders"


class ChunkGrid:
    """One chunk of a stride-2 direct convolution: its input ``data`` (a chunk of images),
    its `conv_amx._Grid` ``grid``, the grid of pairs ``words`` (``plane`` words a phase
    plane), the operands of its product, and the products run after its pairing
    (``riders``, filled as shortcuts bind)."""

    def __init__(self, data: Any, grid: Any, words: np.ndarray, plane: int,
                 operands: tuple[Any, ...]) -> None:
        self.data, self.grid, self.words, self.plane = data, grid, words, plane
        self.operands = operands
        self.riders: list[Any] = []


class Offer:
    """The chunks of a stride-2 convolution over ``data``, in order of their images, and
    ``noted``: the plan's nodes bound when it bound."""

    def __init__(self, data: Any, chunks: list[ChunkGrid], noted: int | None) -> None:
        self.data, self.chunks, self.noted = data, chunks, noted
        self.taken = False


def may_offer(data: Any, geometry: Any, lines: bool) -> bool:
    """Whether a direct convolution of ``geometry`` over ``data`` notes its grids: 2-D,
    stride 2 both ways, no dilation, over a grid of pairs (not channels-last)."""
    kernel, stride, dilate, pad = geometry
    return (not lines and len(kernel) == 2 and tuple(stride) == (2, 2)
            and tuple(dilate) == (1, 1) and getattr(data, "ndim", 0) == 4)


def offer(workspace: Any, data: Any, chunks: list[ChunkGrid]) -> None:
    """Note ``chunks`` (a stride-2 direct convolution's, covering ``data``) for a shortcut
    bound right after it."""
    if workspace is None or not hasattr(workspace, "shared"):
        return
    noted = getattr(workspace, "noted", None)
    made = workspace.shared(data, TAG, lambda: Offer(data, chunks, noted))
    # bound again (its earlier calls dropped): the shortcut rides the calls made now
    made.chunks, made.noted, made.taken = chunks, noted, False


def offered(workspace: Any, data: Any, out: Any) -> Offer | None:
    """The chunks a stride-2 convolution over ``data`` noted, where the node now binding
    (writing ``out``) is the one bound right after it, none took them yet, and ``out``
    shares no memory with any chunk's operands or grid; else None."""
    made = None if workspace is None or not hasattr(workspace, "shared") else \
        workspace.shared(data, TAG)
    if (made is None or made.taken or made.data is not data or made.noted is None
            or getattr(workspace, "noted", None) != made.noted + 1
            or np.may_share_memory(out, data)
            or any(np.may_share_memory(out, operand) for chunk in made.chunks
                   for operand in (chunk.words, *chunk.operands)
                   if isinstance(operand, np.ndarray))):
        return None
    return made


# the shortcut's step where the stride-2 convolution's step runs its products
ridden_by_writer = parts.DoneByItsWriter()
