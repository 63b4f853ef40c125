"""Spreading one bound step over the CPU's cores: elementwise calls cut into slabs.

BLAS already runs a plan's GEMMs on every core, but the copies, transforms and epilogues bound
around them (im2col and padding copies, Winograd's transforms, depthwise patches, bias, clip)
are single NumPy calls on one core. NumPy releases the GIL inside ``copyto``, ufuncs and
``matmul``'s loops, so such a call cut along an outer axis of its output runs on several
threads at once. `split` does that at bind time for calls that are ``partial``s of
``np.copyto``, an elementwise ufunc, or a stacked ``np.matmul`` (cut along a stacking axis);
anything else, and anything too small to repay the hand-off (`MIN_BYTES`), is left whole.

The thread count is `threads()`: 1 unless `set_threads` says otherwise (BLAS, on its own, already
runs every GEMM on every core). It is read when a plan binds, so it applies to plans compiled
after it is set. Why not every core by default: on the shared 2-core benchmark machine (load
average 4-7 from other processes) a 4.8 MB bias add took 145 µs whole and 216 µs in two slabs
(medians of 200), and MobileNet v2 at batch 1 ran no faster split (34.0 vs 34.0 ms median, best
15.5 whole vs 21.9 split): a slab handed to a thread the scheduler has parked costs more than
the core it was meant to use. On an idle machine `set_threads(os.cpu_count())` is worth timing.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import denormals, usable_cores

# Below this many bytes read and written, handing a slab to another thread (~10-20 µs with a
# busy machine's wake-ups) costs more than it saves.
MIN_BYTES = 512 << 10

_settings: dict[str, Any] = {"threads": None, "pool": None}


def cores() -> int:
    """Cores this process may keep busy (`usable_cores.count`: its mask's, at most what a
    container's CPU limit pays for)."""
    return usable_cores.count()


def threads() -> int:
    """Threads a bound step may use (`set_threads`, else 1)."""
    return _settings["threads"] or 1


def set_threads(count: int | None) -> None:
    """Use ``count`` threads for plans bound from now on (None: back to 1)."""
    if count is not None and count < 1:
        raise ValueError(f"threads must be at least 1; got {count}")
    _settings["threads"] = count


def _pool(workers: int) -> ThreadPoolExecutor:
    pool = _settings["pool"]
    if pool is None or pool._max_workers < workers:
        pool = _settings["pool"] = ThreadPoolExecutor(workers, thread_name_prefix="engine-step",
                                                       initializer=denormals.flush_here)
    return pool


def run_slabs(slabs: list[Callable[[], Any]]) -> None:
    """Run the slabs, the first on the calling thread and the rest on the shared pool."""
    pending = [_pool(len(slabs) - 1).submit(slab) for slab in slabs[1:]]
    try:
        slabs[0]()
    finally:
        for future in pending:
            future.result()


class SplitCall:
    """A zero-argument call made of slabs that write disjoint parts of one output."""

    def __init__(self, whole: Callable[[], Any], slabs: list[Callable[[], Any]]) -> None:
        self.whole = whole
        self.slabs = slabs

    def __call__(self) -> None:
        run_slabs(self.slabs)


def split(call: Callable[[], Any], count: int | None = None) -> Callable[[], Any]:
    """``call`` cut into ``count`` (default `threads()`) slabs when it is a large elementwise
    copy or ufunc, or a stacked matmul, or a kernel's call that cuts itself;
    else ``call`` itself."""
    count = threads() if count is None else count
    if count < 2 or not isinstance(call, partial):
        return call
    cut = getattr(call, "slabs", None)
    if cut is not None:  # a kernel's call that cuts itself (`parts.PartedCall.slabs`)
        pieces = cut(count)
        return call if pieces is None else SplitCall(call, pieces)
    found = _operands(call)
    if found is None:
        return call
    inputs, out, core = found
    if sum(a.nbytes for a in (*inputs, out) if isinstance(a, np.ndarray)) < MIN_BYTES:
        return call
    axis = next((k for k in range(out.ndim - core) if out.shape[k] >= count), None)
    if axis is None or any(_overlaps(a, out) for a in inputs):
        return call
    bounds = np.linspace(0, out.shape[axis], count + 1).astype(int)
    slabs = [_slab(call, inputs, out, axis, slice(lo, hi))
             for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    return SplitCall(call, slabs)


def _operands(call: partial) -> tuple[list[Any], np.ndarray, int] | None:
    """(inputs, output, core axes) of a call `split` knows how to cut, else None."""
    func, args, keywords = call.func, call.args, call.keywords
    if func is np.copyto and len(args) == 2 and not keywords:
        return [args[1]], args[0], 0
    if not isinstance(func, np.ufunc) or func.nout != 1 or set(keywords) - {"out"}:
        return None
    if func.signature is not None and func is not np.matmul:
        return None
    if "out" in keywords:
        out, inputs = keywords["out"], list(args)
    elif len(args) == func.nin + 1:
        out, inputs = args[-1], list(args[:-1])
    else:
        return None
    out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if not isinstance(out, np.ndarray) or len(inputs) != func.nin:
        return None
    if func is np.matmul:  # only the stacking axes may be cut, and only where both stack
        if any(np.ndim(a) != out.ndim for a in inputs):
            return None
        return inputs, out, 2
    return inputs, out, 0


def _overlaps(operand: Any, out: np.ndarray) -> bool:
    """Whether cutting could let one slab read what another writes: an input sharing memory
    with the output unless it is the very same view (in place, element by element)."""
    if not isinstance(operand, np.ndarray) or not np.may_share_memory(operand, out):
        return False
    same = (operand.__array_interface__["data"][0] == out.__array_interface__["data"][0]
            and operand.shape == out.shape and operand.strides == out.strides)
    return not same


def _cut(operand: Any, out_ndim: int, axis: int, part: slice) -> Any:
    """``operand``'s part for the slab: cut on the axis aligned with the output's, unless it
    is broadcast along it (absent or of length 1) or not an array."""
    if not isinstance(operand, np.ndarray):
        return operand
    own = axis - (out_ndim - operand.ndim)
    if own < 0 or operand.shape[own] == 1:
        return operand
    index = [slice(None)] * operand.ndim
    index[own] = part
    return operand[tuple(index)]


def _slab(call: partial, inputs: list[Any], out: np.ndarray, axis: int,
          part: slice) -> Callable[[], Any]:
    cut_inputs = [_cut(a, out.ndim, axis, part) for a in inputs]
    cut_out = _cut(out, out.ndim, axis, part)
    if call.func is np.copyto:
        return partial(np.copyto, cut_out, cut_inputs[0])
    return partial(call.func, *cut_inputs, out=cut_out)
