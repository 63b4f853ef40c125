"""Strided copies and elementwise sums of views as `spin_pool` jobs.

A plan's large ``np.copyto`` of one view into another (im2col's, layout changes) and its
``np.add``/``np.subtract``/``np.multiply`` of views (residual sums) run on one core in NumPy.
Here one numba loop runs them, cut by blocks (the index over every axis but the last two), so
that they run on every core a run has armed. On one core numba's loop is slower than NumPy's
for some layouts (a stride-2 copy: 99 µs against 72), so a plan keeps NumPy's call for runs
that are not armed (`spin_pool.WhenArmed`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.cpu import kernel_jobs, spin_pool
from engine.cpu.compiled import compile_kernel, compiled_once
from engine.kernels.workspace import address

MIN_ELEMENTS = 8192  # smaller ones take a few microseconds: left to NumPy
MIN_BLOCKS = 64  # fewer blocks than this (a 2-D array has one): one row per block
# How hard NumPy may work to prove two views of one buffer share no element (else: shared).
OVERLAP_WORK = 1 << 12
# The operations, in the kernel's numbering.
OPERATIONS = (np.copyto, np.add, np.subtract, np.multiply)
_kernels: dict[str, Any] = {}


def when_armed(call: Any) -> Any:
    """``call`` (a bound copy or sum, see `operands`) run as a job while the spin pool is
    armed; ``call`` itself where it is none of those or no job can run it."""
    found = operands(call)
    if found is None or not _takes(*found[1:]):
        return call
    return spin_pool.WhenArmed(partial(job, *found), call)


def copy_when_armed(target: Any, source: Any) -> Any:
    """``np.copyto(target, source)``, run as a job while the spin pool is armed."""
    return when_armed(partial(np.copyto, target, source))


def operands(call: Any) -> tuple[Any, ...] | None:
    """(operation, target, left, right) of a bound ``np.copyto(target, source)`` (right is
    the source again) or ``np.add(left, right, target)`` (likewise subtract, multiply), with
    the output by position or as ``out``; else None."""
    func = getattr(call, "func", None)
    number = next((index for index, known in enumerate(OPERATIONS) if func is known), None)
    if number is None:
        return None
    args, keywords = call.args, call.keywords
    if func is np.copyto:
        return (0, *args, args[1]) if len(args) == 2 and not keywords else None
    if len(args) == 3 and not keywords:
        return number, args[2], args[0], args[1]
    if len(args) == 2 and set(keywords) == {"out"}:
        out = keywords["out"]
        out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return number, out, args[0], args[1]
    return None


def job(operation: int, target: Any, left: Any, right: Any,
        min_elements: int | None = None) -> spin_pool.Job | None:
    """``target = left ∘ right`` (or a copy of ``left``) as a job, for arrays of one shape
    and dtype (no broadcasting, no casting), strides non-negative, at least ``min_elements``
    (`MIN_ELEMENTS` where None, read at the call; a step of a `part_chain` share may be
    small), a source either apart from the target or exactly it (in place); else None."""
    if not _takes(target, left, right, min_elements):
        return None
    arrays = (target, left, right)
    if target.ndim < 2:
        arrays = tuple(array.reshape(1, -1) for array in arrays)
    if np.prod(arrays[0].shape[:-2]) < MIN_BLOCKS:  # blocks of one row each, to share out
        arrays = tuple(array[..., None, :] for array in arrays)
    item = target.itemsize
    strides = np.array([array.strides for array in arrays], np.int64)
    if (strides < 0).any() or (strides % item).any():
        return None
    shape = np.array(arrays[0].shape, np.int64)
    blocks = int(np.prod(shape[:-2]))
    spans = tuple(_span(array) for array in arrays)
    return kernel_jobs.bind((__name__, "blocks"), (operation, *spans, shape, *(strides // item)),
                            blocks, kernel_jobs.parts_for(blocks, 3 * target.size))


def compiled_kernels() -> dict[str, Any]:
    """The kernel by name (`kernel_jobs` runs it as jobs), compiled on first use."""
    return compiled_once(_kernels, lambda: {"blocks": compile_kernel(_blocks)})


def _takes(target: Any, left: Any, right: Any, min_elements: int | None = None) -> bool:
    if min_elements is None:
        min_elements = MIN_ELEMENTS
    arrays = (target, left, right)
    return (all(isinstance(array, np.ndarray) for array in arrays)
            and left.shape == right.shape == target.shape
            and left.dtype == right.dtype == target.dtype
            and target.size >= min_elements and target.dtype.kind in "fiu"
            and all(_apart_or_same(target, source) for source in (left, right)))


def _apart_or_same(target: np.ndarray, source: np.ndarray) -> bool:
    """Whether ``source`` shares no element with ``target`` (two rows of one buffer, whose
    spans interleave, share none), or is exactly it."""
    if address(target) == address(source) and target.strides == source.strides:
        return True
    if not np.may_share_memory(target, source):
        return True
    try:
        return not np.shares_memory(target, source, max_work=OVERLAP_WORK)
    except np.exceptions.TooHardError:
        return False


def _span(array: np.ndarray) -> np.ndarray:
    """A 1-D contiguous view from ``array``'s first element to its last (its elements are
    then at offsets given by its strides)."""
    extent = 1 + sum((size - 1) * stride for size, stride in zip(array.shape, array.strides,
                                                                  strict=True)) // array.itemsize
    return np.lib.stride_tricks.as_strided(array, shape=(extent,), strides=(array.itemsize,))


def _blocks(operation: int, target: Any, left: Any, right: Any, shape: Any, target_steps: Any,
            left_steps: Any, right_steps: Any, first: int,
            last: int) -> None:  # pragma: no cover - runs compiled
    """Blocks [first, last) (the index over every axis but the last two, in C order) of
    ``target = left ∘ right`` over arrays of 2-D or more: each argument is its array's span
    (`_span`), steps count elements. Rows of unit steps (and a copy's stride-2 rows, an
    im2col's) get loops of their own, which LLVM vectorises. Written out in one function:
    around a call, LLVM may not vectorise a loop (see depthwise_kernel)."""
    ndim = shape.shape[0]
    height, width = shape[ndim - 2], shape[ndim - 1]
    down, left_down, right_down = (target_steps[ndim - 2], left_steps[ndim - 2],
                                   right_steps[ndim - 2])
    into, step, other = target_steps[ndim - 1], left_steps[ndim - 1], right_steps[ndim - 1]
    unit = into == 1 and step == 1 and other == 1
    for block in range(first, last):
        rest, at, a, b = block, 0, 0, 0
        for axis in range(ndim - 3, -1, -1):
            index = rest % shape[axis]
            rest //= shape[axis]
            at += index * target_steps[axis]
            a += index * left_steps[axis]
            b += index * right_steps[axis]
        for y in range(height):
            # Each row a slice from its start: the index stays non-negative, so numba tests
            # no wrap-around per element and LLVM vectorises the loop.
            out = target[at + y * down:]
            x = left[a + y * left_down:]
            z = right[b + y * right_down:]
            if unit and operation == 0:
                for j in range(width):
                    out[j] = x[j]
            elif unit and operation == 1:
                for j in range(width):
                    out[j] = x[j] + z[j]
            elif unit and operation == 2:
                for j in range(width):
                    out[j] = x[j] - z[j]
            elif unit and operation == 3:
                for j in range(width):
                    out[j] = x[j] * z[j]
            elif operation == 0 and into == 1 and step == 2:
                for j in range(width):
                    out[j] = x[2 * j]
            elif operation == 0 and into == 1:  # a transposing copy: rows gathered
                for j in range(width):
                    out[j] = x[j * step]
            elif operation == 1 and into == 1:  # the same, adding a residual's row
                for j in range(width):
                    out[j] = x[j * step] + z[j * other]
            else:
                for j in range(width):
                    value = x[j * step]
                    if operation == 1:
                        value = value + z[j * other]
                    elif operation == 2:
                        value = value - z[j * other]
                    elif operation == 3:
                        value = value * z[j * other]
                    out[j * into] = value
