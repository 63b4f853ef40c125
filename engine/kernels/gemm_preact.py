"""A 1×1 product's epilogue writing bf16 words a 1×1 reader takes: ResNet v2's next
pre-activation on AMX, a product's own output on AMX and on the AVX-512 BF16 tile.

In a bf16 plan at batch 1, a block's last 1×1 product on AMX (`conv3`, the shortcut added)
writes the float32 sum the next block's residual reads; the next block's BatchNorm and ReLU
(`batchnorm_kernel`) read that sum and write the bf16 words its 1×1 readers take
(`bf16_handoff`). Here the BatchNorm asks the product, as it binds right after it, to write
those words itself (`ask`): the product's epilogue works them out of the sums it stores
(`gemm_preact_ir`), and the BatchNorm's step then runs no pass. Where nothing but that
BatchNorm reads the sum (a stage's last block: the next block's shortcut reads the
pre-activation), the product stores the words alone. The words are the BatchNorm pass's to
the bit. On the AVX-512 BF16 tile the same epilogue storing both cost about what the pass it
saved did, and the pass reads its sum faster than the epilogue stores it: there only a
stage's last block, whose sum nothing else reads, is asked, and stores the words alone
(`TILE_WORDS_ALONE`; docs/benchmarks.md).

The same kernels store the words alone of a product's own output, × 1 and + -0 in place of
a BatchNorm's statistics (`words_job`), for a product whose every reader is a 1×1 product
(`gemm_amx_handoff`, `gemm_tile_handoff`); each tile's words are placed by its C pointer's
offset from C's first element, so that a batch of products writing an output's rows in turn
(a stem's) places each row's pixels where they lie.

Each run decides: the product writes the words only where every reader of the BatchNorm's
output took them (its hand-off is `taken`), and says so (``written``). On AMX only over a
short K (`MAX_DEPTH`, `WORDS_ALONE_MAX_DEPTH`), where the float32 sum streams past L2 and
the pass reads it back from memory; the tile's words alone, at any K.
"""

from __future__ import annotations

import ctypes
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, host_features, llvm_jit, spin_pool
from engine.kernels import bf16, bf16_handoff, gemm_kernel

_FIELD = gemm_kernel.CONTEXT_FIELDS
# K (in bf16 words, two channels each) at most for the ask where the float32 sum is read by
# more than the BatchNorm (the product then stores both), and where it is not (the words
# alone). ResNet-50 v2 at batch 1, one thread, in the plan's order: storing both, the
# stage-1 product (K 32) took 0.03-0.29 ms more against its pass's 0.22-0.25 saved, the
# stage-2 one (K 64) 0.11-0.16 ms more against 0.11-0.12; the words alone, stages 1-3's last
# products took 0.11-0.16 ms less, 0.02 more and about the same, their passes (0.22, 0.11,
# 0.07 ms) gone (`docs/benchmarks.md`).
MAX_DEPTH = 32
WORDS_ALONE_MAX_DEPTH = 128
# Whether a product on the AVX-512 BF16 tile whose sum only the BatchNorm reads (a stage's
# last block) is asked to store the words alone. ResNet-50 v2 bf16 at batch 1 on one Zen 4
# core (`bench/variants.py`, two runs): stage 1's BatchNorm pass, 0.16-0.19 ms, gone for
# 0.00-0.02 more in the product, stage 2's 0.07-0.09 for 0.05-0.07 more; the nodes summed
# 0.98-0.99×. (A constant so that a benchmark can turn it off.)
TILE_WORDS_ALONE = True
_state: dict[str, Any] = {}


class PreactAsk:
    """A BatchNorm's ask of its data's residual product: write ``out_handoff``'s words of
    ``clip(BatchNorm(sum), low, high)`` too. ``statistics``: the BatchNorm's (gamma, beta,
    mean, var, eps, fix_gamma); ``bounds``: its clamp, set as its step binds."""

    def __init__(self, out_handoff: bf16_handoff.PairedHandoff, statistics: tuple,
                 sum_read: bool = True) -> None:
        self.out_handoff, self.statistics = out_handoff, statistics
        # whether anything but the BatchNorm reads the sum: else the product stores only
        # the words (a stage's last block, whose sum only the next block's pre-activation
        # reads: the downsampling shortcut reads that pre-activation)
        self.sum_read = sum_read
        self.bounds: tuple[float, float] | None = None
        self.written = False  # whether the product's last run wrote the words

    def scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """Each channel's scale and shift, float32, as `batchnorm_kernel` works them."""
        return scale_shift(*self.statistics)


def scale_shift(gamma: Any, beta: Any, mean: Any, var: Any, eps: Any,
                fix_gamma: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each channel's scale and shift as `batchnorm_kernel`'s pass works them (float32, the
    same operations in the same order), worked out once where a pass's statistics are a
    plan's constants."""
    inverse = np.float32(1) / np.sqrt(var + np.float32(eps))
    scale = inverse if fix_gamma else gamma * inverse
    return (np.ascontiguousarray(scale, np.float32),
            np.ascontiguousarray(beta - mean * scale, np.float32))


def ask(workspace: Any, data: Any, out_handoff: bf16_handoff.PairedHandoff,
        statistics: tuple) -> PreactAsk | None:
    """The BatchNorm's ask of ``data``'s writer (see the module), where that writer is a
    residual AMX product that can write the words of ``out_handoff`` and was bound right
    before the BatchNorm; else None."""
    writer = bf16_handoff.offered(workspace, data)
    product = None if writer is None else writer.residual_writer
    if (product is None or writer.preact is not None
            or writer.noted is None or workspace.noted != writer.noted + 1):
        return None
    sum_read = len(workspace.readers(data)) > 1
    kernel = int(product.context[_FIELD["kernel"]])
    on_tile = kernel == gemm_kernel.BF16 and TILE_WORDS_ALONE and not sum_read
    if ((kernel != gemm_kernel.AMX and not on_tile) or _part(product.context, sum_read) is None
            or not _fits(product.context, out_handoff, sum_read, on_tile)):
        return None
    writer.preact = PreactAsk(out_handoff, statistics, sum_read)
    return writer.preact


def _fits(context: np.ndarray, handoff: bf16_handoff.PairedHandoff,
          sum_read: bool = True, on_tile: bool = False) -> bool:
    """Whether the AMX product's tiles cover the words' rows whole (M a multiple of the
    tile's 32 rows, one word row per two of C's, each at least as long), its K is short,
    C's columns fit under the descriptor's alignment, and it adds no column bias (a 1×1
    convolution's is zeros: the descriptor takes its slot). On the tile (``on_tile``), an
    even M (a tile's first row is even) at any K."""
    from engine.kernels.gemm_preact_ir import DESCRIPTOR_ALIGNMENT

    m, n, k = (int(context[_FIELD[name]]) for name in ("m", "n", "k"))
    rows_whole = m % 2 == 0 if on_tile else m % 32 == 0
    deep = not on_tile and k > (MAX_DEPTH if sum_read else WORDS_ALONE_MAX_DEPTH)
    if (not rows_whole or deep
            or int(context[_FIELD["batch"]]) != 1
            or handoff.shape[0] != m // 2 or handoff.shape[1] < n
            or 4 * n >= DESCRIPTOR_ALIGNMENT or handoff.layout not in (None, "words")):
        return False
    return not _column_bias(context, n)


def _column_bias(context: np.ndarray, n: int) -> bool:
    """Whether the product adds a column bias other than zeros (a 1×1 convolution's is
    zeros: the descriptor takes its slot)."""
    bias = int(context[_FIELD["columns_bias"]])
    return bias != 0 and bool(np.ctypeslib.as_array(
        ctypes.cast(bias, ctypes.POINTER(ctypes.c_float)), (n,)).any())


def preact_job(product: Any, request: PreactAsk) -> Any:
    """``product``'s job (an AMX `gemm_kernel.Product` adding a residual) writing the ask's
    words beside C: its column bias's slot the descriptor's (`AmxPreactKernel`)."""
    scale, shift = request.scale_shift()
    return _words_job(product, request.out_handoff.words, scale, shift, request.bounds,
                      request.sum_read)


def writes_words(context: np.ndarray, handoff: bf16_handoff.PairedHandoff) -> bool:
    """Whether a product on AMX or on the AVX-512 BF16 tile (its ``context``: no residual)
    writing an array its ``handoff`` offers (one sample, every pixel once, C's rows ``ldc``
    floats long) can write the words alone of its output for 1×1 readers (`words_job`): on
    AMX over a short K (`WORDS_ALONE_MAX_DEPTH`), an even M, C's columns under the
    descriptor's alignment, no column bias."""
    from engine.kernels.gemm_preact_ir import DESCRIPTOR_ALIGNMENT

    pixels = int(np.prod(handoff.source[2:])) if len(handoff.source) > 2 else 0
    m, n, k = (int(context[_FIELD[name]]) for name in ("m", "n", "k"))
    on_amx = int(context[_FIELD["kernel"]]) == gemm_kernel.AMX
    # An even M: a tile of fewer rows (16 filters) stores its own word rows, the K pad past
    # them zeros a reader of that K reads (the words are zeroed once).
    return (int(context[_FIELD["residual"]]) == 0 and int(context[_FIELD["ldc"]]) == pixels
            and m % 2 == 0 and handoff.shape[0] == bf16.amx_depth(m)
            and handoff.shape[1] >= pixels and (k <= WORDS_ALONE_MAX_DEPTH or not on_amx)
            and _part(context, False) is not None
            and 4 * n < DESCRIPTOR_ALIGNMENT and handoff.layout in (None, "words")
            and not _column_bias(context, n))


def stores_words(product: Any, out: Any) -> bool:
    """Whether ``product`` (writing the whole of ``out``, one sample) can store the words of
    ``out`` a 1×1 reader takes in place of its float32 output (`writes_words`)."""
    words = (bf16.amx_depth(out.shape[1]), bf16.amx_rows(out.shape[2] * out.shape[3]))
    would = bf16_handoff.PairedHandoff(1, words, (out.shape[1], 0), out.shape)
    return writes_words(product.context, would)


def words_job(product: Any, words: np.ndarray) -> Any:
    """``product``'s job (a `gemm_kernel.Product` on AMX or the AVX-512 BF16 tile,
    `writes_words`) storing only its
    output's bf16 words (``words``, a hand-off's, float32-viewed): the values its epilogue
    would store, rounded as the pairing pass rounds them (× 1, + -0: every float kept, the
    sign of a zero too), so that a 1×1 reader pairs nothing. MobileNet v2's stem for its
    first expand."""
    rows = int(product.context[_FIELD["m"]])
    scale = np.ones(rows, np.float32)
    shift = np.full(rows, -0.0, np.float32)
    return _words_job(product, words, scale, shift, (-np.inf, np.inf), False)


def _words_job(product: Any, words: np.ndarray, scale: np.ndarray, shift: np.ndarray,
               bounds: tuple[float, float], stores_sum: bool) -> Any:
    """``product``'s job writing ``words`` of ``clip(sum · scale + shift, bounds)`` beside
    C (or in its stead): its column bias's slot the descriptor's (`gemm_preact_ir`)."""
    from engine.kernels.gemm_preact_ir import DESCRIPTOR_ALIGNMENT, DESCRIPTOR_FIELDS

    low, high = (np.float32(bound).view(np.uint32) for bound in bounds)
    room = np.zeros(2 * DESCRIPTOR_ALIGNMENT // 8, np.int64)
    start = (-room.ctypes.data % DESCRIPTOR_ALIGNMENT) // 8
    descriptor = room[start:start + len(DESCRIPTOR_FIELDS)]
    context = product.context.copy()
    descriptor[:] = (words.ctypes.data, words.shape[1], scale.ctypes.data, shift.ctypes.data,
                     int(context[_FIELD["rows_bias"]]), int(low), int(high),
                     int(context[_FIELD["c"]]))
    context[_FIELD["columns_bias"]] = descriptor.ctypes.data
    parts = product.args[-1]  # a `spin_pool.Job`'s arguments end with its parts
    return spin_pool.job(_part(context, stores_sum), context, parts,
                         keep=(*product.operands, words, scale, shift, room))


def _part(context: np.ndarray, stores_sum: bool) -> int | None:
    """The compiled part for the product's kernel (its ``context``'s), storing C too or
    the words alone; None where there is none for it on this host."""
    return (_compiled() or {}).get((int(context[_FIELD["kernel"]]), stores_sum))


def _compiled() -> dict[tuple[int, bool], Any] | None:
    return compiled.made_once(_state, "kernel", _compile)


def _compile() -> dict[tuple[int, bool], Any] | None:
    """The parts for the host: AMX's where it has AMX (and Linux's grant), the register
    tile's where it has AVX-512 BF16; None where it has neither (or no llvmlite)."""
    from engine.kernels.gemm_amx_preact_ir import AmxPreactKernel
    from engine.kernels.gemm_preact_ir import PairPreactKernel

    kinds = []
    if gemm_kernel.available(gemm_kernel.AMX) and host_features.amx_permitted():
        kinds.append((gemm_kernel.AMX, AmxPreactKernel, gemm_kernel.AMX_TILE))
    if gemm_kernel.available(gemm_kernel.BF16):
        kinds.append((gemm_kernel.BF16, PairPreactKernel, gemm_kernel.tile()))
    if not kinds:
        return None
    return llvm_jit.compile_variants(
        {(kind, stores_sum): partial(_module, kernel_type, shape, stores_sum)
         for kind, kernel_type, shape in kinds for stores_sum in (True, False)}, "part")


def _module(kernel_type: Any, shape: Any, stores_sum: bool) -> Any:
    kernel = kernel_type(shape, stores_sum)
    kernel.define_part("part", kernel.define_full("tile_full"), kernel.define_edge("tile_edge"),
                       _FIELD)
    return kernel.module
