"""A downsampling block's shortcut 1×1 product and its last 1×1 product as one AMX product.

In a ResNet v2 downsampling block the shortcut, a 1×1 convolution of the block's
pre-activation (stride 1 in stage 1, 2 after), writes a float32 array that only the block's
last 1×1 product (``conv3``) reads, as the residual it adds: ``conv3(mid) + down(pre)``. That
sum is one product over both activations' K, ``[W3 | Wd] @ [mid ; pre]``: in a bf16 plan at
batch 1 the shortcut's step then only lays its activation's words below ``conv3``'s in one
buffer (`merged_words`), and ``conv3``'s step runs the product over both, so that the
shortcut's float32 output is neither written nor read back as the residual. Stage 1's 256 ×
64 × 56² shortcut alone took 0.27 ms and the product adding its output 0.45–1.0 ms in order,
where one 256 × 128 × 56² product without a residual took 0.27 alone (one thread).

The shortcut binds first (`offer`): where its output's one reader is a fused 1×1 convolution
adding it, it offers itself (`ShortcutStep`), running as it is until that reader merges it
(`merge`). The sums are float32 sums of the same bf16 products, accumulated in one pass
rather than two: equal to the two products' sum up to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.kernels import bf16, bf16_handoff, gemm_amx_handoff, gemm_bind, gemm_kernel
from engine.kernels.workspace import address

TAG = "bf16 merged shortcut"
_FIELD = gemm_kernel.CONTEXT_FIELDS


class ShortcutStep:
    """A shortcut 1×1 convolution's step: its own paired product (``call``) until a reader
    merges it (``merged``), then the words of its activation only, into the merged product's
    buffer: copied out of its data writer's words where that writer laid them (``copy``),
    else paired from the float32 array (``pair``)."""

    leaves_blas_alone = True  # native jobs on the spin pool, never BLAS

    def __init__(self, call: Callable[[], Any], data: Any, stride: tuple[int, ...],
                 matrix: Any, handoff: bf16_handoff.PairedHandoff | None) -> None:
        self.call, self.data, self.stride, self.matrix = call, data, stride, matrix
        # the hand-off of its data that its own product took (its words read where laid)
        self.handoff = handoff
        self.pair: Callable[[], Any] | None = None
        self.copy: Callable[[], Any] | None = None
        self.merged = False

    def __call__(self) -> None:
        if not self.merged:
            self.call()
        elif self.copy is not None and self.handoff.laid:
            self.copy()
        else:
            self.pair()

    def view(self) -> Any:
        """The data the shortcut multiplies, (channels, rows, columns) of its one image."""
        step_y, step_x = self.stride
        return self.data[0, :, ::step_y, ::step_x]


def offer(calls: list[Any], data: Any, matrix: Any, out: Any, stride: tuple[int, ...],
          workspace: Any) -> list[Any]:
    """``calls`` (a 1×1 convolution's of one image, no padding, no bias) as one
    `ShortcutStep` offered on ``out`` where they are one paired AMX product writing the whole
    of ``out`` and ``out``'s one reader is a fused 1×1 convolution adding it (`reads_as_sum`);
    else as they are."""
    if (len(calls) != 1 or type(calls[0]) is not bf16.PairedProduct
            or type(calls[0].product) is not gemm_kernel.Product
            or not gemm_amx_handoff.writes_whole(calls[0].product, out)
            or int(calls[0].product.context[_FIELD["residual"]]) != 0 or data.ndim != 4
            or data.shape[0] != 1 or not data.flags.c_contiguous or len(stride) != 2
            or not hasattr(workspace, "readers")):
        return calls
    readers = workspace.readers(out)
    if not readers or len(readers) != 1 or not reads_as_sum(readers[0]):
        return calls
    pairing = calls[0].args[0]
    handoff = getattr(pairing, "handoff", None)  # a hand-off's reader (`bf16_handoff.take`)
    step = ShortcutStep(calls[0], data, tuple(stride), matrix, handoff)
    workspace.shared(out, TAG, lambda: step)
    return [step]


# Per reading op, whether a reader of that op (a `workspace.Reader`) is a 1×1 product adding
# the array it reads, which `merge` may take in: the op's module registers it, so that no
# kernel names an op.
_SUM_READERS: dict[str, Callable[[Any], bool]] = {}


def register_reader(op: str, adds: Callable[[Any], bool]) -> None:
    """Let nodes of ``op`` read a shortcut's output as the sum `merge` binds, where ``adds``
    says a reader of theirs does."""
    _SUM_READERS[op] = adds


def reads_as_sum(reader: Any) -> bool:
    """Whether ``reader`` (a `workspace.Reader`) reads the array as a 1×1 product adding it
    (`register_reader`)."""
    adds = _SUM_READERS.get(reader.op)
    return adds is not None and adds(reader)


def merge(data: Any, weight: Any, other: Any, out: Any, workspace: Any) -> list[Any] | None:
    """``out = conv(data, weight) + other`` as one paired AMX product over both K (see the
    module), where ``other`` is the output of a shortcut that offered itself (`offer`) and
    ``weight`` is a constant 1×1 filter bank of one image's product; None where not."""
    shortcut = None if workspace is None or not hasattr(workspace, "shared") \
        else workspace.shared(other, TAG)
    if (shortcut is None or shortcut.merged or type(data) is not np.ndarray
            or data.ndim != 4 or data.shape[0] != 1 or not data.flags.c_contiguous
            or data.dtype != np.float32 or weight.flags.writeable or weight.ndim != 4
            or weight.dtype != np.float32 or weight.shape[2:] != (1, 1)
            or weight.shape[1] != data.shape[1] or out.shape != other.shape
            or out.dtype != np.float32 or out.shape[1] != weight.shape[0]
            or out.shape[2:] != data.shape[2:] or not out.flags.c_contiguous
            or gemm_bind.bf16_kernel(workspace, out.shape[1]) != gemm_kernel.AMX):
        return None
    matrix = weight.reshape(weight.shape[0], -1)
    pixels = out.shape[2] * out.shape[3]
    upper_rows = bf16.amx_depth(matrix.shape[1])
    words = merged_words(workspace, matrix.shape[1], shortcut.matrix.shape[1], pixels)
    upper, lower = words[:upper_rows], words[upper_rows:]
    right = data.reshape(matrix.shape[1], pixels)
    pair = bf16.patch_pairing(right, 1, upper)
    shortcut_pair = bf16.patch_pairing(shortcut.view(), 1, lower)
    shortcut_copy = None
    if shortcut.handoff is not None:
        shortcut_copy = gemm_bind.handed_copy(shortcut.handoff, shortcut.data, shortcut.view(),
                                              1, lower, workspace)
    if pair is None or shortcut_pair is None or (
            shortcut.handoff is not None and shortcut_copy is None):
        return None
    handoff = bf16_handoff.offered(workspace, data)
    if handoff is not None:
        if bf16_handoff.words_for(handoff, upper.shape, workspace, into=upper) is not None:
            pair = bf16_handoff.take(handoff, pair)  # the writer lays them in place
        else:  # another reader placed them: copied out where the writer laid them
            pair = gemm_bind.copying_handed_words(handoff, data, data[0], 1, upper, workspace,
                                                  pair)
    tiles = workspace.derived(matrix, (TAG, address(shortcut.matrix)),
                              lambda constant: _merged_tiles(constant, shortcut.matrix))
    out_matrix = out.reshape(out.shape[1], pixels)
    columns_outside = tiles.nbytes <= words.nbytes and not gemm_bind.rows_outside(words.nbytes,
                                                                                  out_matrix)
    product = gemm_kernel.bind_tiles(tiles, words, out_matrix, columns_outside=columns_outside,
                                     packed=True)
    # It writes the float32 sum on every run, as a residual product does; a BatchNorm reading
    # that sum asks it for its words by its K (`gemm_preact`), which the merged K passes:
    # stage 1's, asked, took 0.90 ms against 0.32 and the BatchNorm's pass 0.30 (in order).
    product.sums_always = True
    shortcut.pair, shortcut.copy, shortcut.merged = shortcut_pair, shortcut_copy, True
    calls = gemm_amx_handoff.lay_bf16([bf16.paired_product(pair, product)], out, workspace)
    if isinstance(calls[0], bf16.PartPairedProduct):
        # its parts would each pair ``conv3``'s half alone into words of their own, the
        # shortcut's half of theirs left zero: one pairing, one product
        call = calls[0]
        calls = [bf16.PairedProduct(call.func, call.args[0], call.product)]
    return calls


def merged_words(workspace: Any, depth: int, shortcut_depth: int, pixels: int) -> np.ndarray:
    """The words both activations are paired into, ``conv3``'s (``depth`` channels) above the
    shortcut's: one buffer per pair of K and pixels, its pad rows zero."""
    shape = (bf16.amx_depth(depth) + bf16.amx_depth(shortcut_depth), bf16.amx_rows(pixels))
    return workspace.zeroed(shape, np.float32, (TAG, depth, shortcut_depth))


def _merged_tiles(matrix: np.ndarray, shortcut: np.ndarray) -> np.ndarray:
    """AMX's A of ``[matrix | shortcut]``, each half's K padded as its words are."""
    return bf16.amx_pack_rows(np.concatenate([bf16.amx_weight_rows(matrix),
                                              bf16.amx_weight_rows(shortcut)], axis=1))
