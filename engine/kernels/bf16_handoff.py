"""A bf16 plan's float32 array handed from its writer to the AMX products reading it as the
bf16 pairs they take, so that no pairing pass runs between them.

A product on AMX reads its activation as bf16 words paired down its columns (`bf16`), which
a pass makes from the float32 array on every run. Where the array's writer is the vector
depthwise kernel (`depthwise_vector`) or the BatchNorm pass (`batchnorm_kernel`: ResNet v2's
pre-activation BatchNorm and ReLU before a block's 1×1 convolutions) at batch 1, it offers a
`PairedHandoff` for its output in the plan's workspace, reserving the words (`offer`); each
reader that binds a 1×1 convolution's AMX product on it takes it (`take`) and reads those
words, one buffer for every taker (`gemm_bind`, which lets such a product run on AMX from K
32; a strided one copies its share into its own words, `bf16.word_copying`). The writer binds
first and learns last whether every reader took: at each run it writes the words in place of
the float32 array only where all have (`taken`), and says so (``laid``); a taker then skips
its pairing, and pairs the float32 array otherwise (a pooled writer: `EitherJob`). The words
are the pairing pass's to the bit: the same clamped float32 values, rounded to bf16 the same
way.

On a host with the AVX-512 BF16 tile and no AMX, the writers that say so offer (``bf16_tile``):
the depthwise kernel and the BatchNorm pass their words, which only 1×1 products on that tile
take (`gemm_bind`), reading them as AMX lays them, their rows where they lie, where their own
pairing pass would lay the tile's panels (in bf16 at batch 1, one Zen 5 core, against each
reader pairing the float32 array: MobileNet v2 3.03 ms against 3.30–3.43, ResNet-50 v2
23.1–23.6 against 24.4–24.7); a 1×1 product on a register tile its planes, for a depthwise
reader (`gemm_tile_handoff`); and a direct convolution's product on that tile, or the
BatchNorm pass, a direct reader's grid (`conv_amx`).

A writer that can lay its pairs in a grid (`offer` with ``grids``: the BatchNorm pass, any
grid; a direct convolution's product, one as wide as its own; a 1×1 product on AMX,
`gemm_amx_handoff`, one of stride 1) may instead hand a direct 3×3
convolution (`conv_amx`) the zero-bordered grid it reads (`grid_for`): the reader says
where each of the array's runs of pixels lies in the grid, the writer writes them there,
and the border stays zero. One hand-off has one
layout, the first taker's: a reader wanting another does not take it. A grid is a buffer of
the hand-off's slot, tagged with the reader's geometry, so that layers of one shape never
share one while a hand-off waits for its reader (the convolution's own grid is shared).

A 1×1 product on AMX, or a stem's batch of row products (`gemm_amx_handoff`), may lay the
words themselves (``columns``) where only 1×1 products read its output, storing them from
its epilogue in place of its float32 output (`gemm_preact.words_job`).

A 1×1 product on AMX (`gemm_amx_handoff`) may offer its output as bf16 planes (``planes``):
the array's planes, each value rounded to bf16 and stored as its 16 bits, which a depthwise
layer (`depthwise_vector`) reads in place of the float32 array where the writer laid them
(`take_planes`), in a buffer of the plan's kept for planes of their shape or in the first
half of the float32 array's own memory. Unlike the pairs, these change what the reader sums:
the values rounded to bf16, as an AMX product's operands are.

A 1×1 product adding a residual lays nothing of its own hand-off, but names itself on it
(``residual_writer``) so that a BatchNorm reading its sum may ask it to write that BatchNorm's
words in its stead (``preact``; `gemm_preact`), the ask kept on the BatchNorm's own
hand-off too (``written_by``).

A writer that heads a fused chain whose later steps its epilogue could not take (a sigmoid
after a convolution) has its hand-off withdrawn (`withdraw`): those steps change the float32
array after it, which its readers then read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.cpu import steady_walk
from engine.kernels import bf16, gemm_kernel

TAG = "bf16 paired hand-off"


class PairedHandoff:
    """What a writer and the products reading its output share."""

    def __init__(self, readers: int, shape: tuple[int, int], slot: tuple[int, int],
                 source: tuple[int, ...] = (), grids: Any = False,
                 columns: bool = True, planes: bool = False) -> None:
        self.readers = readers  # inputs the plan binds to the array
        self.takers = 0  # those bound to read the words
        self.shape, self.slot = shape, slot  # the words' shape, and which buffer of it (K, n)
        self.source = source  # the array's shape
        # the layouts the writer writes (`offer`)
        self.grids, self.columns, self.planes = grids, columns, planes
        # the words the takers read (float32-viewed); for "planes", the bf16 halves (uint16)
        self.words: np.ndarray | None = None
        self.layout: Any = None  # the takers' layout: "words", "planes", or a grid's tag
        # Where the pairs go: None for the words' columns end to end; for a grid, the
        # reader's `conv_amx._Grid` (its ``phase_runs`` over a float32 array of `source`).
        self.grid: Any = None
        self.laid = False  # whether the writer's last run wrote the words (not the array)
        self.withdrawn = False  # steps after the writer change the array (`withdraw`)
        # The array itself where its planes are laid in its own memory (`take_planes`).
        self.array: Any = None
        self.noted: int | None = None  # the workspace's outputs noted as it was offered
        # A residual 1×1 product writing the array, and a BatchNorm reader's ask that it
        # write that reader's words too (`gemm_preact`); ``written_by``: on a reader's
        # own hand-off, the ask its writer's writer granted.
        self.residual_writer: Any = None
        self.preact: Any = None
        self.written_by: Any = None
        # Whether every reader reads the words: the writer writes them only then. A writer
        # reads it at each run, in a plan's walk with its objects out of cache, so it is an
        # attribute kept as binding changes what it is made of (`note`), not worked out then.
        self.taken = False

    def note(self) -> None:
        """``taken`` anew, after a reader or `withdraw` changed what it is made of."""
        self.taken = (self.words is not None and self.takers == self.readers
                      and not self.withdrawn)


def offer(workspace: Any, array: Any, grids: bool | Callable[[Any], bool] = False,
          columns: bool = True, planes: bool = False,
          planes_in_place: bool = False, bf16_tile: bool = False) -> PairedHandoff | None:
    """The writer's hand-off for ``array`` (one sample's planes) in a bf16 plan on AMX (or,
    with ``bf16_tile``, on the AVX-512 BF16 tile alone) whose readers the plan noted, none of
    them the plan's output; else None. ``grids``: whether
    the writer can write a reader's grid (`grid_for`), or which (a test of the reader's
    `conv_amx._Grid`); ``columns``: whether it can write the words down their columns
    (`words_for`: a 1×1 product's); ``planes``: whether it can write the array's planes as
    bf16 halves (`take_planes`: a depthwise reader's); ``planes_in_place``: whether they lie
    in the first half of ``array``'s own memory rather than in a buffer of the plan's kept
    for planes of their shape. ``bf16_tile``: whether it offers its output on a host with
    the AVX-512 BF16 tile and no AMX too: there the words to that tile's 1×1 products
    (`gemm_bind`), the grids to its direct convolutions, and the planes to a depthwise
    reader.

    The words are a buffer of the plan's kept for hand-offs of their shape and K (the pad
    past K must stay zero: writers of one K write the same cells), one the writer reserves
    as it binds: a plan binds its steps in the order they run, so a buffer whose last
    hand-off every reader took (all bound, so all run before this writer) is free, and
    another is made where none is."""
    if (getattr(workspace, "precision", "fp32") != "bf16" or not hasattr(workspace, "readers")
            or getattr(array, "ndim", 0) != 4 or array.shape[0] != 1):
        return None
    shape = words_shape(array.shape, bf16_tile)
    readers = workspace.readers(array)
    if shape is None or not readers or any(reader.op is None for reader in readers):
        return None
    on_amx = gemm_kernel.available(gemm_kernel.AMX)

    def reserve() -> PairedHandoff:
        kind = (shape, array.shape[1])
        holders = workspace.shared(workspace.scratch, TAG, dict).setdefault(kind, [])
        slot = next((slot for slot, holder in enumerate(holders)
                     if holder.takers == holder.readers), len(holders))
        handoff = PairedHandoff(len(readers), shape, (array.shape[1], slot), array.shape,
                                grids if on_amx or bf16_tile else False, columns, planes)
        if planes and planes_in_place:
            handoff.array = array
        holders[slot:slot + 1] = [handoff]
        handoff.noted = getattr(workspace, "noted", None)
        return handoff

    return workspace.shared(array, TAG, reserve)


def words_shape(source: tuple[int, ...], bf16_tile: bool = False) -> tuple[int, int] | None:
    """The words (float32-viewed) of a hand-off of one sample's planes ``source``, as AMX
    reads them: where the process may use AMX, or where it has the AVX-512 BF16 tile alone
    and the writer offers them to that tile's 1×1 products (``bf16_tile``); else None."""
    if gemm_kernel.available(gemm_kernel.AMX) or (
            bf16_tile and gemm_kernel.available(gemm_kernel.BF16)):
        return bf16.amx_depth(source[1]), bf16.amx_rows(int(np.prod(source[2:])))
    return None


def offered(workspace: Any, array: Any) -> PairedHandoff | None:
    """The hand-off ``array``'s writer offered; None where there is none."""
    if workspace is None or not hasattr(workspace, "shared"):
        return None
    return workspace.shared(array, TAG)


def withdraw(workspace: Any, array: Any) -> None:
    """The hand-off of ``array`` never laid: its writer is the head of a fused chain whose
    later steps change the float32 array after it (an activation its epilogue could not
    take), so its readers must read that array, pairing it themselves."""
    handoff = offered(workspace, array)
    if handoff is not None:
        handoff.withdrawn = True
        handoff.note()


def words_for(handoff: PairedHandoff, shape: tuple[int, int], workspace: Any,
              into: np.ndarray | None = None) -> np.ndarray | None:
    """The words (``shape``, float32-viewed, zeroed once) a reader of the hand-off would
    read; None where its product reads another shape. ``into``: where the first reader
    wants them (rows of a larger buffer, C-contiguous, zeroed: `gemm_amx_shortcut`'s merged
    product's); a later reader asking for another place gets None."""
    if (shape != tuple(handoff.shape) or not handoff.columns
            or handoff.layout not in (None, "words")):
        return None
    if into is not None and (into.shape != tuple(shape) or not into.flags.c_contiguous
                             or handoff.words is not None and handoff.words is not into):
        return None
    if handoff.words is None:
        handoff.words = into if into is not None else workspace.zeroed(
            shape, np.float32, (TAG, handoff.slot))
        handoff.layout = "words"
        handoff.note()
    return handoff.words


def offers_grid(handoff: PairedHandoff, tag: Any, grid: Any) -> bool:
    """Whether the writer can write the grid ``tag`` names (``grid``, `conv_amx._Grid`) and
    no other reader chose another layout: what `grid_for` asks, taking nothing."""
    writes = handoff.grids(grid) if callable(handoff.grids) else handoff.grids
    return bool(writes) and handoff.layout in (None, tag)


def grid_for(handoff: PairedHandoff, shape: tuple[int, int], tag: Any, grid: Any,
             workspace: Any) -> np.ndarray | None:
    """The zero-bordered grid (``shape``, float32-viewed words, zeroed once) a direct
    convolution reading the hand-off would read, ``tag`` naming its geometry and ``grid``
    (`conv_amx._Grid`) placing an array of the hand-off's shape in it; None where the writer
    cannot write that grid or another reader chose another layout."""
    if not offers_grid(handoff, tag, grid):
        return None
    if handoff.words is None:
        handoff.words = workspace.zeroed(shape, np.float32, (TAG, handoff.slot, tag))
        handoff.layout, handoff.grid = tag, grid
        handoff.note()
    return handoff.words if handoff.words.shape == tuple(shape) else None


def take_planes(handoff: PairedHandoff, workspace: Any) -> np.ndarray | None:
    """The array's planes as bf16 halves (uint16, the array's shape less its batch axis)
    for a reader that reads them, counted as taken, where the writer can write them and no
    other reader chose another layout; else None. The halves are the values
    `bf16.round_to_bf16` rounds, not the float32 array's: such a reader's sums are over
    values rounded to bf16, as an AMX product's are.

    They lie in the hand-off's slot (a buffer of the plan's for planes of their shape, which
    the next writer of that shape lays again while it is in cache), or where the writer
    offered them so (``planes_in_place``), in the first half of the float32 array's own
    memory: the plan keeps that for the array until its last reader ran, and no one reads it
    as float32 on the runs the writer lays the planes (every reader took them). The buffer
    the plan gives a later layer is then one written a step before, not one left unwritten
    since an earlier layer."""
    if not handoff.planes or handoff.layout not in (None, "planes"):
        return None
    if handoff.words is None:
        handoff.words = (workspace.zeroed(handoff.source[1:], np.uint16,
                                          (TAG, handoff.slot, "planes"))
                         if handoff.array is None else _planes_in(handoff.array))
        handoff.layout = "planes"
    handoff.takers += 1
    handoff.note()
    return handoff.words


def _planes_in(array: Any) -> np.ndarray:
    """The first half of ``array``'s memory (one sample, C-contiguous float32) as uint16
    planes of its shape less the batch axis."""
    if array.dtype != np.float32 or not array.flags.c_contiguous or array.shape[0] != 1:
        raise ValueError(f"bf16 planes are laid in a C-contiguous float32 array of one "
                         f"sample; got {array.dtype} {array.shape}")
    return array.reshape(-1).view(np.uint16)[:array.size].reshape(array.shape[1:])


def take(handoff: PairedHandoff, pair: Callable[[], Any],
         copy: Callable[[], Any] | None = None) -> Callable[[], Any]:
    """A reader's, once it reads `words_for`'s words: counted as taken, and its pairing
    ``pair`` as it then runs, only where the writer's run left the float32 array. ``copy``:
    what runs in its place where the writer laid the words, for a reader whose product reads
    a part of them copied out (a stride-2 1×1 convolution: `bf16.word_copying`)."""
    handoff.takers += 1
    handoff.note()
    return _PairUnlessLaid(handoff, pair, copy)


class EitherJob:
    """A writer's `spin_pool` job writing the float32 array, or its hand-off's words where
    every reader took it (found at each run: the readers bind after the writer), saying
    which (``laid``); each job made on first use by ``planes()`` or ``words()``."""

    leaves_blas_alone = True

    def __init__(self, handoff: PairedHandoff, planes: Callable[[], Any],
                 words: Callable[[], Any]) -> None:
        self.handoff, self.make = handoff, {False: planes, True: words}
        self.jobs: dict[bool, Any] = {}

    def __call__(self) -> None:
        paired = self.handoff.taken
        job = self.jobs.get(paired)
        if job is None:
            job = self.jobs[paired] = self.make[paired]()
        job()
        self.handoff.laid = paired

    def replayable(self) -> bool:
        """Its jobs post nothing but themselves (`steady_walk`)."""
        return steady_walk.all_replayable(*self.jobs.values())


# it calls the reader's pairing or copy, which the reader answers for (`replayable`)
@steady_walk.in_turn
def _unless_laid_then(reader: _PairUnlessLaid, product: Callable[[], Any]) -> None:
    """``reader()`` then ``product()`` in one frame (`bf16.paired_product`): a step in a
    plan's walk finds its Python objects out of cache, where each frame costs about a
    microsecond."""
    if not reader.handoff.laid:
        reader.pair()
    elif reader.copy is not None:
        reader.copy()
    product()


class _PairUnlessLaid:
    then = staticmethod(_unless_laid_then)  # how `bf16.paired_product` runs it with a product

    def __init__(self, handoff: PairedHandoff, pair: Callable[[], Any],
                 copy: Callable[[], Any] | None = None) -> None:
        self.handoff, self.pair, self.copy = handoff, pair, copy

    def replayable(self) -> bool:
        """Its pairing and its copy are jobs (`steady_walk`)."""
        return steady_walk.all_replayable(self.pair, self.copy)

    def __call__(self) -> None:
        if not self.handoff.laid:
            self.pair()
        elif self.copy is not None:
            self.copy()
