"""`Workspace`: working memory a plan lends to the ops it binds (see `OpDef.scratch`).

A plan runs one step at a time, so all steps share one ``scratch`` buffer, sized at compile time
to the largest need. Padded copies of inputs are kept apart, one per (shape, padding, dtype):
their borders are zeroed once and only the interior is written on each run. Values an op derives
from a constant once (Winograd's transformed weights) are kept in a cache the plans of one model
share, so each is computed and held once however many batch sizes are compiled. The plan
notes what reads each array it binds (`Workspace.readers`), and ops sharing an array can share
an object about it (`Workspace.shared`: a fused int8 layer's layout hand-off). On the host,
every array a plan's runs read or write that the workspace makes or keeps lies on transparent
huge pages (`HugePageArena`), small ones packed together.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGN = 64  # byte alignment of the regions ops lay out in the scratch buffer


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of `ALIGN`: where the next scratch region starts."""
    return -(-nbytes // ALIGN) * ALIGN


def empty_aligned(xp: Any, shape: int | tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised C-contiguous array whose first byte sits on an `ALIGN`-byte boundary.

    NumPy's allocator promises 16 bytes, so without this where a plan's buffers start within a
    cache line is left to malloc, and a plan's speed with it: the seed MLP at batch 1 ran 8%
    slower in one build than in another whose only difference was what had been allocated
    before. CuPy's pool aligns to 256 bytes already. (A plan's own arrays come from its
    `HugePageArena`, aligned alike.)
    """
    if xp is not np:
        return xp.empty(shape, dtype)
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


HUGE_PAGE_BYTES = 2 << 20


def _huge_page_bytes(nbytes: int) -> np.ndarray | None:
    """``nbytes`` bytes (or more) of anonymous memory from a huge page's start, asked to be
    backed by huge pages; None where the system has no such request (not Linux)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return None
    size = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    # A mapping starts on a 4 KB page: a huge page's worth more leaves room to start on one.
    mapping = mmap.mmap(-1, size + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(mapping, np.uint8)  # keeps the mapping alive as long as any view
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    try:
        mapping.madvise(advice, start, size)
    except OSError:  # transparent huge pages off: the memory is as good as NumPy's
        pass
    return raw[start:start + size]


# A `HugePageArena` maps its memory this many bytes at a time; an array of half that or more
# that the current mapping has no room for gets a mapping of its own.
ARENA_CHUNK_BYTES = 2 * HUGE_PAGE_BYTES
# A plan whose buffers and scratch come to less than this (and a model whose packed dense
# weights do) keeps NumPy's memory: its arrays stay within the caches' and the TLB's reach,
# and a huge page is 2 MB of memory however little of it is used (the seed MLP's plans for
# seven batch sizes held 16.2 MB from arenas against 2.3 MB without).
ARENA_FROM_BYTES = HUGE_PAGE_BYTES


class HugePageArena:
    """Host arrays carved one after another, each from a cache line's start, out of memory
    asked to be backed by transparent huge pages (`_huge_page_bytes`): small arrays share
    huge pages; an array of half a chunk or more that the chunk has no room for gets a mapping
    of its own, whose last huge page's rest the arrays after it may take.

    Why every array a plan's runs touch, small ones too: on the Intel machine (a VM) a step
    whose operands lie on 4 KB pages misses the TLB often, and each miss walks two levels of
    page tables. NumPy's memory lies on 4 KB pages, except where malloc reuses memory NumPy
    had asked huge pages for (its arrays of 4 MB or more), so identical plans ran apart by
    where malloc put their small arrays: ResNet-50 v2 bf16 at batch 1, one thread, four plans
    in one process, `plan.run` 18.7–20.0 ms with NumPy's memory, 18.0–18.4 on huge pages; a
    plan bound with huge pages refused ran 1.08–1.38× one bound beside it with them
    (docs/benchmarks.md). Large activations gain alike: a product reading rows a page or
    more apart (a 1×1 convolution's column panels) 64×256×3136 0.94 → 0.80 ms.

    A mapping lives as long as any array in it: an arena suits arrays that live and die
    together (a plan's buffers; the values a model derives from its parameters).
    """

    def __init__(self, chunk_bytes: int = ARENA_CHUNK_BYTES) -> None:
        self._chunk_bytes = chunk_bytes
        self._chunk: np.ndarray | None = None
        self._used = 0
        self.spans: list[tuple[int, int]] = []  # (address, bytes) of each mapping it made

    def _mapped(self, nbytes: int) -> np.ndarray | None:
        """`_huge_page_bytes`, its span noted."""
        raw = _huge_page_bytes(nbytes)
        if raw is not None:
            self.spans.append((raw.ctypes.data, raw.size))
        return raw

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array from a cache line's start (`ALIGN`), on huge
        pages where Linux grants them (elsewhere NumPy's memory, as `empty_aligned`)."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        room = 0 if self._chunk is None else self._chunk.size - self._used
        if 2 * nbytes >= self._chunk_bytes and nbytes > room:
            raw = self._mapped(nbytes)
            if raw is None:
                return empty_aligned(np, shape, dtype)
            end = aligned(nbytes)
            if raw.size - end > room:  # the rest of its last huge page carves what follows
                self._chunk, self._used = raw, end
            return raw[:nbytes].view(dtype).reshape(shape)
        if self._chunk is None or nbytes > room:
            chunk = self._mapped(self._chunk_bytes)
            if chunk is None:
                return empty_aligned(np, shape, dtype)
            self._chunk, self._used = chunk, 0
        start = self._used
        self._used = start + aligned(max(nbytes, 1))
        return self._chunk[start:start + nbytes].view(dtype).reshape(shape)

    def copy(self, array: np.ndarray) -> np.ndarray:
        """``array``'s values in a C-contiguous array of this arena, as writeable as it."""
        copy = self.empty(array.shape, array.dtype)
        copy[...] = array
        copy.flags.writeable = bool(array.flags.writeable)
        return copy


def address(array: Any) -> int:
    """The address of ``array``'s first element: host memory for numpy, device for CuPy.

    (CuPy arrays have no ``__array_interface__``; their memory is ``array.data.ptr``.)
    """
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return int(array.data.ptr)


def uploaded(xp: Any, key: tuple, make: Callable[[], Any]) -> Any:
    """``make()`` (a host array, or a tuple of them, that depends only on ``key``) on ``xp``.

    NumPy gets ``make()`` itself. A device array module gets one upload per key, kept for the
    process: a copy from the host inside a run would stop the run from being captured as a
    CUDA graph, so a kernel's host-made constants are uploaded on its first (warm-up) run and
    read from the device afterwards. Callers must not write into what they get. Entries are
    never dropped: a captured graph may hold their addresses (they are a few KiB each, one per
    distinct shape a model is run at).
    """
    if xp is np:
        return make()
    cache_key = (id(xp), xp.cuda.get_device_id(), *key)
    array = _UPLOADED.get(cache_key)
    if array is None:
        made = make()
        array = tuple(map(xp.asarray, made)) if isinstance(made, tuple) else xp.asarray(made)
        array = _UPLOADED.setdefault(cache_key, array)
    return array


_UPLOADED: dict[tuple, Any] = {}


@dataclass(frozen=True)
class Reader:
    """One read of a plan's array: input ``position`` of a node of ``op`` with ``attrs``, or
    (``op`` None) the plan's output ``position``."""

    op: str | None
    attrs: Any
    position: int


class Workspace:
    """A shared scratch buffer and bordered buffers, all allocated at plan compile time, and
    the cache of derived values shared with the other plans of a model. On a GPU with cuDNN,
    ``convolutions`` is the plan's cuDNN context (`engine.cuda.cudnn_conv`). ``precision``
    is the plan's (``"fp32"`` or ``"bf16"``): the products that bind here read it
    (`gemm_bind.bf16_kernel`). ``huge_pages``: the host arrays it makes and keeps come from
    arenas on huge pages (`HugePageArena`; a plan of `ARENA_FROM_BYTES` or more), else from
    NumPy's memory."""

    def __init__(self, xp: Any, scratch_bytes: int, derived: dict | None = None,
                 convolutions: Any = None, precision: str = "fp32",
                 huge_pages: bool = True) -> None:
        self.xp = xp
        self.precision = precision
        self.convolutions = convolutions
        # The plan's own arrays, and (apart, as they may outlive the plan in the model's cache)
        # the values derived while it binds.
        arenas = xp is np and huge_pages
        self.arena = HugePageArena() if arenas else None
        self._derived_arena = HugePageArena() if arenas else None
        self.scratch = self.empty(scratch_bytes, np.uint8)
        self._filled: dict[tuple, Any] = {}
        self._derived = {} if derived is None else derived
        # per output array of the plan (by identity; the array kept so its id stays its own)
        self._readers: dict[int, tuple[Any, tuple[Reader, ...]]] = {}
        self._shared: dict[tuple[int, Any], tuple[Any, Any]] = {}
        # per plan input (by identity): the steps' calls pointing their reads elsewhere
        self._pointers: dict[int, tuple[Any, list[Callable[[int], None]]]] = {}
        # outputs noted so far: the plan notes each node's before binding it, so this counts
        # the nodes bound, in the order their steps run
        self.noted = 0

    def arena_spans(self) -> dict[str, list[tuple[int, int]]]:
        """(address, bytes) of the memory its arenas mapped: ``"plan"`` the plan's buffers,
        scratch and padded copies, ``"derived"`` the values derived from constants while it
        bound (weights as its products read them); empty where it keeps NumPy's memory
        (`bench/footprint.py` counts what a run touches of each)."""
        return {"plan": [] if self.arena is None else list(self.arena.spans),
                "derived": [] if self._derived_arena is None else list(self._derived_arena.spans)}

    def note_readers(self, array: Any, readers: tuple[Reader, ...]) -> None:
        """Record what reads ``array``, a node's output the plan binds (the plan calls this
        before binding the node)."""
        self._readers[id(array)] = (array, readers)
        self.noted += 1

    def readers(self, array: Any) -> tuple[Reader, ...] | None:
        """What reads ``array``: one `Reader` per input of a node bound to it, and one per
        output of the plan it is; None where the plan noted nothing (a view, an input, a
        workspace made outside a plan)."""
        noted = self._readers.get(id(array))
        return None if noted is None or noted[0] is not array else noted[1]

    def reads_where_pointed(self, array: Any, point: Callable[[int], None]) -> None:
        """Record that a step reads ``array`` (a plan input) only through native jobs that
        ``point(address)`` sends to another array of its shape and dtype, C-contiguous, at
        ``address``: where every reader of the input says so, a run points them at the
        caller's array instead of copying it into ``array`` (`pointers`)."""
        entry = self._pointers.get(id(array))
        if entry is None or entry[0] is not array:
            entry = self._pointers[id(array)] = (array, [])
        entry[1].append(point)

    def pointers(self, array: Any) -> tuple[Callable[[int], None], ...]:
        """The calls recorded by `reads_where_pointed` for ``array``, one a reader."""
        entry = self._pointers.get(id(array))
        return () if entry is None or entry[0] is not array else tuple(entry[1])

    def shared(self, array: Any, tag: Any, make: Callable[[], Any] | None = None) -> Any:
        """``make()``, made once per array (by identity) and tag for every op bound here: an
        object the op writing ``array`` and the ops reading it share (a layout's hand-off);
        ``array`` None: one the whole plan's ops share. Without ``make``, the one made
        already, else None."""
        key = (id(array), tag)
        entry = self._shared.get(key)
        if entry is None or entry[0] is not array:
            if make is None:
                return None
            entry = self._shared[key] = (array, make())
        return entry[1]

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised C-contiguous array for the plan from a cache line's start: on the
        host from its arena where it has one (huge pages), on a GPU from CuPy's pool."""
        if self.arena is None:
            return empty_aligned(self.xp, shape, dtype)
        return self.arena.empty(shape, dtype)

    def region(self, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """The scratch bytes from ``offset`` viewed as a C-contiguous array."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        return self.scratch[offset:offset + nbytes].view(dtype).reshape(shape)

    def zeroed(self, shape: tuple[int, ...], dtype: Any, tag: Any) -> Any:
        """A zero-filled array kept for every caller asking with the same shape, dtype and tag.

        Callers sharing one must only ever write the same cells (``tag`` says which: for a
        padded input, the padding), so the cells they leave alone stay zero.
        """
        return self.filled(shape, dtype, tag, 0)

    def filled(self, shape: tuple[int, ...], dtype: Any, tag: Any, fill: Any) -> Any:
        """`zeroed`, filled with ``fill`` (the padding of a max pooling is the lowest value)."""
        key = (tuple(shape), np.dtype(dtype).str, tag, fill)
        array = self._filled.get(key)
        if array is None:
            array = self._filled[key] = self.empty(shape, dtype)
            array[...] = fill
        return array

    def derived(self, constant: Any, tag: Any, make: Callable[[Any], Any]) -> Any:
        """``make(constant)``, computed once per constant and tag for every workspace sharing
        this one's cache. ``constant`` must never change (plans hand out constants read-only).
        """
        # The memory's address, not the array's id: each plan has its own view of a constant.
        key = (tag, address(constant), constant.shape, constant.strides, constant.dtype.str)
        entry = self._derived.get(key)
        if entry is None:  # the entry keeps the constant alive, so the address stays its own
            entry = self._derived[key] = (constant, self._on_huge_pages(make(constant),
                                                                        constant))
        return entry[1]

    def _on_huge_pages(self, value: Any, constant: Any) -> Any:
        """``value`` (a derived value) with each C-contiguous host array it is, or a tuple of
        which it is, copied into the derived values' arena: a product streams its weights
        from there (`HugePageArena`). Views of ``constant`` and other objects stay as made."""
        if self._derived_arena is None:
            return value
        if type(value) is tuple:  # not a named tuple's class
            return tuple(self._on_huge_pages(item, constant) for item in value)
        if (type(value) is not np.ndarray or not value.flags.c_contiguous or not value.size
                or (isinstance(constant, np.ndarray) and np.may_share_memory(value, constant))):
            return value
        return self._derived_arena.copy(value)

    @property
    def nbytes(self) -> int:
        """Bytes held: the shared scratch plus every bordered buffer (not the shared cache)."""
        return int(self.scratch.nbytes) + sum(int(a.nbytes) for a in self._filled.values())
