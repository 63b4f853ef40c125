"""A transposed product's tiles and its copy into place, cut alike among the cores.

`gemm_bind.Transposed` runs ``out = weight @ right`` (few columns: the 7² layers) as
``outᵀ``'s product into scratch, then copies the scratch into ``out`` transposed (or adds a
residual as it copies). Armed over several cores the two were jobs of their own, their parts
taken by whichever core came first: a core's share of the copy read columns of the scratch
that the other core's tiles had just written, and the copy of MobileNet v2's 960 × 49 expand
took about three times its one-thread time (117-145 µs against 38-41, fp32, two vCPUs that
share no cache). `by_filters` makes them one job (`bf16_pair_ir`'s ``each_part``): each part
computes a run of the product's column panels (filters) and then copies those filters' rows
of ``out``, so that the core copying them is the one that wrote them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import spin_pool
from engine.kernels import bf16, gemm_kernel, strided_kernel

_FIELD = gemm_kernel.CONTEXT_FIELDS


def by_filters(product: Any, out: Any, source: Any, residual: Any = None) -> Any:
    """``product()`` (a `gemm_kernel.Product` into a scratch whose transpose ``source`` views
    as ``out``) then ``out[:] = source`` (``source + residual`` where one is given), as one
    job of a part per thread a run uses (`spin_pool.threads`), each part a run of the
    product's column panels and then the same rows of ``out``; None where the product is not
    one of ours over one matrix or a share could not be copied by a job."""
    if type(product) is not gemm_kernel.Product or int(product.context[_FIELD["batch"]]) != 1:
        return None
    task = bf16.each_part_task()
    if task is None:
        return None
    context = product.context
    columns, width = int(context[_FIELD["n"]]), int(context[_FIELD["nr"]])
    if out.shape != (columns, source.shape[1]) or source.shape != out.shape:
        return None
    panels = -(-columns // width)
    groups = min(panels, spin_pool.PARTS_PER_CORE * spin_pool.threads())
    shares = [(0, columns)] + [(group * panels // groups * width,
                                min(columns, (group + 1) * panels // groups * width))
                               for group in range(groups)]
    product_task = int(product.args[-3])
    table = [2, groups]
    keep: list[Any] = [product]
    for first, last in shares:
        share = product_share(context, first, last)
        copy = copy_share(out, source, residual, first, last)
        if copy is None:
            return None
        table += [product_task, share.ctypes.data, int(copy.args[-3]), int(copy.args[-2])]
        keep += [share, copy]
    return spin_pool.job(task, np.array(table, np.int64), groups, keep=tuple(keep))


def product_share(context: np.ndarray, first: int, last: int) -> np.ndarray:
    """The product's context narrowed to its columns [first, last): B's panels, C's and the
    column bias's (and a residual's) addresses moved on, N cut."""
    share = context.copy()
    share[_FIELD["b"]] += first * int(context[_FIELD["column_step"]]) * 4
    share[_FIELD["c"]] += first * 4
    share[_FIELD["columns_bias"]] += first * 4
    if int(context[_FIELD["residual"]]):
        share[_FIELD["residual"]] += first * 4
    share[_FIELD["n"]] = last - first
    return share


def copy_share(out: Any, source: Any, residual: Any, first: int, last: int) -> Any:
    """The job copying (or adding the residual into) ``out``'s rows [first, last)."""
    rows = slice(first, last)
    if residual is None:
        return strided_kernel.job(0, out[rows], source[rows], source[rows], min_elements=0)
    return strided_kernel.job(1, out[rows], source[rows], residual[rows], min_elements=0)
