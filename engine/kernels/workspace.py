"""`Workspace`: working memory a plan lends to the ops it binds (see `OpDef.scratch`).

A plan runs one step at a time, so all steps share one ``scratch`` buffer, sized at compile time
to the largest need. Padded copies of inputs are kept apart, one per (shape, padding, dtype):
their borders are zeroed once and only the interior is written on each run. Values an op derives
from a constant once (Winograd's transformed weights) are kept in a cache the plans of one model
share, so each is computed and held once however many batch sizes are compiled. The plan
notes what reads each array it binds (`Workspace.readers`), and ops sharing an array can share
an object about it (`Workspace.shared`: a fused int8 layer's layout hand-off).
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


def empty_aligned(xp: Any, shape: int | tuple[int, ...], dtype: Any,
                  huge_pages: bool = False) -> Any:
    """An uninitialised C-contiguous array whose first byte sits on an `ALIGN`-byte boundary.

    NumPy's allocator promises 16 bytes, so without this where a plan's buffers start within a
    cache line is left to malloc, and a plan's speed with it: the seed MLP at batch 1 ran 8%
    slower in one build than in another whose only difference was what had been allocated
    before. CuPy's pool aligns to 256 bytes already.

    ``huge_pages``: a NumPy array of `HUGE_PAGE_FROM_BYTES` or more starts on a huge page,
    backed by huge pages where Linux grants them (a plan's activations: see that constant).
    """
    if xp is not np:
        return xp.empty(shape, dtype)
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if huge_pages and nbytes >= HUGE_PAGE_FROM_BYTES:
        raw = _huge_page_bytes(nbytes)
        if raw is not None:
            return raw[:nbytes].view(dtype).reshape(shape)
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


# From this size, an array `empty_aligned` makes lies on transparent huge pages where Linux
# grants them on request (`madvise`). A product reading an activation's rows a page or more
# apart (a 1×1 convolution's column panels: each step of K reads 128 bytes of a row 12.5 KB
# on) missed the first-level TLB at every step: one thread, activations on huge pages against
# 4 KB ones, 64×256×3136 0.94 → 0.80 ms, 256×64×3136 0.89 → 0.79; whole fp32 plans 0.94–0.96×
# (MobileNet v2 b1), 0.98–0.99× (ResNet-50 v2 b1, ResNet-18 b1), 0.96× (ResNet-18 b8). Packed
# weights, read in order, gained nothing so. Smaller arrays keep NumPy's allocator (a huge
# page is 2 MB of memory however little of it is used: 4–8 MB more a plan of these).
HUGE_PAGE_FROM_BYTES = 1 << 19
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
    (`gemm_bind.bf16_kernel`)."""

    def __init__(self, xp: Any, scratch_bytes: int, derived: dict | None = None,
                 convolutions: Any = None, precision: str = "fp32") -> None:
        self.xp = xp
        self.precision = precision
        self.convolutions = convolutions
        self.scratch = empty_aligned(xp, scratch_bytes, np.uint8, huge_pages=True)
        self._filled: dict[tuple, Any] = {}
        self._derived = {} if derived is None else derived
        # per output array of the plan (by identity; the array kept so its id stays its own)
        self._readers: dict[int, tuple[Any, tuple[Reader, ...]]] = {}
        self._shared: dict[tuple[int, Any], tuple[Any, Any]] = {}
        # outputs noted so far: the plan notes each node's before binding it, so this counts
        # the nodes bound, in the order their steps run
        self.noted = 0

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

    def shared(self, array: Any, tag: Any, make: Callable[[], Any] | None = None) -> Any:
        """``make()``, made once per array (by identity) and tag for every op bound here: an
        object the op writing ``array`` and the ops reading it share (a layout's hand-off).
        Without ``make``, the one made already, else None."""
        key = (id(array), tag)
        entry = self._shared.get(key)
        if entry is None or entry[0] is not array:
            if make is None:
                return None
            entry = self._shared[key] = (array, make())
        return entry[1]

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
            array = self._filled[key] = empty_aligned(self.xp, shape, dtype, huge_pages=True)
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
            entry = self._derived[key] = (constant, make(constant))
        return entry[1]

    @property
    def nbytes(self) -> int:
        """Bytes held: the shared scratch plus every bordered buffer (not the shared cache)."""
        return int(self.scratch.nbytes) + sum(int(a.nbytes) for a in self._filled.values())
