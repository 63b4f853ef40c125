"""A 1×1 expansion and the depthwise layer reading it as one `part_chain` job, by channels.

An inverted-residual block (MobileNet v2's) expands its input with a 1×1 product and runs a
3×3 depthwise layer over the expansion: a job each, and on every core the cores meet at the
end of both. The depthwise layer reads each channel's plane alone, which its filter's row of
the product writes, so a run of channels needs no other share's work: each share here is a
run of the product's filters (whole row blocks of the GEMM's tile; at 7², where the product
runs transposed, whole column panels and their copy out) and then the depthwise layer over
those planes, on one thread with no wait between, the expansion's planes still in that
core's cache when the depthwise layer reads them. The cores meet once a block pair, not
twice, and no core reads planes the other wrote. Every share computes its channels as the
whole product does (each sum over K in the same order), so the outputs are the same to
the bit.

A share's product walks its row blocks as the whole product does, each block reading all of
the input (or, transposed, each panel all of A), so shares read it no more often. But each
share's calls cost about 2 µs more than one call over all of them (MobileNet v2's 576 × 96 ×
196 expansion and its depthwise layer, one thread: 332 µs as two steps, 335 as a chain of
2 shares, 359 of 11), so the pair runs chained only where the pool is armed (`pair`), and
as its two steps on one thread; and only where the expansion's input stays in a core's L2
(`right_bytes`): MobileNet v2's blocks at 28² and below. At 56² (144 × 24 × 3136, an input
of 301 KB, 12 shares) the chain armed took 651 µs at the first quartile against 608 as two
jobs, on two vCPUs shared with other work; at 14² (384 × 64 × 196) 236 against 237.
Measured on an AVX2 host only: AVX-512 hosts keep their plans (`applies`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.cpu import cache_sizes, host_features, parts, spin_pool
from engine.kernels import gemm_bind, gemm_kernel, gemm_transposed, jobs, part_chain

_FIELD = gemm_kernel.CONTEXT_FIELDS
# A share's output of the product at most about this (its planes and the depthwise layer's
# stay in L2 beside the input), in whole row blocks or panels, and `SHARES_PER_CORE` shares a
# core at least, so that a core that comes late takes fewer (`part_chain`'s claims), but no
# more: each share's calls cost about 2 µs (see above).
SHARE_BYTES = 128 << 10
SHARES_PER_CORE = 2
# The expansion's input at most this share of L2 (or `RIGHT_BYTES` where the L2 is unknown).
RIGHT_L2_SHARE = 2
RIGHT_BYTES = 256 << 10


def applies() -> bool:
    """Whether pairs chain here: several cores, and no AVX-512 (measured on AVX2 hosts)."""
    return spin_pool.cores() >= 2 and not host_features.has("avx512f")


def writes_ahead(nodes: Sequence[Any], shapes: Sequence[Sequence[tuple[int, ...]]],
                 dtypes: Sequence[Sequence[Any]]) -> set[int]:
    """The graph's expansions (by index in ``nodes``) whose depthwise reader right after
    them the memory plan must give another buffer than the expansion's input, so that the
    pair chains (`chain` refuses a depthwise output over the product's input): a 1×1
    convolution of stride 1 adding no other array, one sample, float32, its input at most
    `right_bytes` (where `chain` takes it: MobileNet v2's blocks at 28² and below). Larger
    blocks keep the buffers they share: a third buffer rotating through the 112² layers
    cost the first block 0.13 ms a run on one thread (Zen 3). None on one core, where
    nothing chains (`applies`)."""
    if not applies():
        return set()
    ahead = set()
    before = None
    for index, node in enumerate(nodes):
        if node.is_variable:
            continue
        if before is not None and _reads_first(node, before) and _depthwise_conv(node):
            source = nodes[before].inputs[0]
            shape = shapes[source.node][source.index]
            dtype = np.dtype(dtypes[source.node][source.index])
            if (_expansion_conv(nodes[before]) and dtype == np.float32 and shape[0] == 1
                    and int(np.prod(shape)) * dtype.itemsize <= right_bytes()):
                ahead.add(before)
        before = index
    return ahead


def _reads_first(node: Any, writer: int) -> bool:
    return bool(node.inputs) and node.inputs[0].node == writer and node.inputs[0].index == 0


def _convolution(node: Any) -> Any:
    """A Convolution node's attributes, or those of the convolution heading a node's chain
    of unary steps (the fusion pass's nodes: a ``head`` op and ``steps``); else None."""
    if node.op == "Convolution":
        return node.params
    head = getattr(node.params, "head", None)
    if getattr(getattr(head, "op", None), "name", None) != "Convolution" or any(
            step.arity != 1 for step in node.params.steps):
        return None
    return head.attrs


def _expansion_conv(node: Any) -> bool:
    conv = _convolution(node)
    return (conv is not None and tuple(conv.kernel) == (1, 1) and conv.num_group == 1
            and all(value == 1 for value in (conv.stride or ())) and not any(conv.pad or ())
            and getattr(conv, "layout", None) in (None, "NCHW"))


def _depthwise_conv(node: Any) -> bool:
    conv = _convolution(node)
    return (conv is not None and tuple(conv.kernel) == (3, 3) and conv.num_group > 1
            and conv.num_group == conv.num_filter)


class Pair:
    """The expansion and the depthwise step as their chain where the pool is armed (or its
    workers kept spinning), else the two in turn (`spin_pool.WhenArmed`)."""

    def __init__(self, chained: part_chain.Chain, expansion: Any, depthwise: Any) -> None:
        self.chain, self.expansion, self.depthwise = chained, expansion, depthwise
        # a `Threaded` expansion runs BLAS's product on one thread unless BLAS is held
        self.leaves_blas_alone = parts.leaves_blas_alone(expansion)
        self.run = spin_pool.WhenArmed(lambda: chained, self._apart)

    def __call__(self) -> None:
        self.run()

    def _apart(self) -> None:
        self.expansion()
        self.depthwise()


def pair(expansion: Any, depthwise: Any) -> Pair | None:
    """`chain`'s job as a `Pair` with the two steps; None where they do not chain."""
    chained = chain(expansion, depthwise)
    return None if chained is None else Pair(chained, expansion, depthwise)


def chain(expansion: Any, depthwise: Any) -> part_chain.Chain | None:
    """``expansion()`` then ``depthwise()`` as one job of the cores, share by share of
    channels; None where they do not chain: not here (`applies`: one core, AVX-512), the
    depthwise step is not `depthwise_vector`'s job over the planes the product writes (one
    sample, no hand-off), the product is not ours over one matrix (or, run transposed, has
    a residual), its input passes `right_bytes`, or the depthwise output overlaps an
    operand of the product."""
    cores = spin_pool.cores()
    planes = _depthwise_call(depthwise)
    if not applies() or planes is None:
        return None
    data, out = planes.args[0], planes.args[3]
    transposed = type(expansion) is gemm_bind.Transposed
    product = expansion.product if transposed else expansion.ours if type(expansion) in (
        gemm_bind.Threaded, gemm_bind.Spread) else expansion
    if type(product) is not gemm_kernel.Product or int(product.context[_FIELD["batch"]]) != 1:
        return None
    context = product.context
    if transposed:
        if expansion.residual is not None or not _holds(expansion.out, data):
            return None
        channels, unit = int(context[_FIELD["n"]]), int(context[_FIELD["nr"]])
        right = int(context[_FIELD["m"]]) * int(context[_FIELD["k"]]) * 4
        written = (*product.operands, expansion.out, expansion.source)
    else:
        channels, unit = int(context[_FIELD["m"]]), int(context[_FIELD["mr"]])
        columns = int(context[_FIELD["n"]])
        right = int(context[_FIELD["k"]]) * columns * 4
        if (int(context[_FIELD["c"]]) != data.ctypes.data or int(context[_FIELD["ldc"]])
                != columns or data.shape[0] != channels or data[0].size != columns):
            return None
        written = product.operands
    if channels != data.shape[0] or right > right_bytes() or any(
            isinstance(array, np.ndarray) and np.may_share_memory(array, out)
            for array in written):
        return None
    shares = _shares(channels, unit, data[0].nbytes, cores)
    steps = []
    for first, last in shares:
        if transposed:
            product_step = spin_pool.job(int(product.args[-3]), gemm_transposed.product_share(
                context, first, last), 1, keep=(product,))
            copy = gemm_transposed.copy_share(expansion.out, expansion.source, None, first,
                                              last)
            share = [product_step, copy]
        else:
            share = [spin_pool.job(int(product.args[-3]),
                                   gemm_kernel.row_share(context, first, last), 1,
                                   keep=(product,))]
        share.append(planes.planes_job(first, last))
        if any(step is None for step in share):
            return None
        steps.append(share)
    return part_chain.chain([steps] * cores, steps, cores)


def right_bytes() -> int:
    """The input a chained expansion reads at most: `RIGHT_L2_SHARE` of the L2, or
    `RIGHT_BYTES` where its size is unknown."""
    l2 = cache_sizes.l2_bytes()
    return l2 // RIGHT_L2_SHARE if l2 else RIGHT_BYTES


def _depthwise_call(step: Any) -> Any:
    """The `VectorDepthwiseCall` a depthwise step's job runs, over one sample without a
    hand-off; else None."""
    from engine.kernels.depthwise_vector import VectorDepthwiseCall

    if not isinstance(step, spin_pool.Job):
        return None
    call = jobs.source(step)
    if type(call) is not VectorDepthwiseCall or call.args[5] is not None \
            or call.args[6] is not None or call.args[1].shape[0] != call.args[0].shape[0]:
        return None
    return call


def _holds(out: Any, data: Any) -> bool:
    """Whether ``out`` (channels, positions) is ``data`` (channels, height, width)."""
    return (out.ctypes.data == data.ctypes.data and out.shape[0] == data.shape[0]
            and out.flags.c_contiguous and out.size == data.size)


def _shares(channels: int, unit: int, plane_bytes: int, parts: int) -> list[tuple[int, int]]:
    """Runs of channels in whole ``unit``s, as many as `SHARES_PER_CORE` for each of
    ``parts`` or as hold about `SHARE_BYTES` of planes each, whichever are more, at most
    one a unit: all of one size but the last."""
    units = -(-channels // unit)
    wanted = max(SHARES_PER_CORE * parts, -(-channels * plane_bytes // SHARE_BYTES))
    per_share = -(-units // wanted)
    return [(first * unit, min(channels, (first + per_share) * unit))
            for first in range(0, units, per_share)]

