"""A bf16 convolution's product on our register tiles (a host with AVX-512 BF16 and no AMX)
writing its output in bf16 for its readers.

In a bf16 plan at batch 1, where one product of ours (the float32 tile, or the AVX-512 BF16
tile) writes a convolution's whole output, it offers that output through `bf16_handoff`,
and where every reader took one layout, each run's product writes it in place of the
float32 array and says so (``laid``), as AMX's product does
(`gemm_amx_handoff.HandingProduct`, whose runs this one shares):

- bf16 planes, for an output of `MIN_OUTPUT_BYTES` or more (the array's planes, each value
  rounded to bf16 and stored as its 16 bits: `gemm_halves_ir`), which a depthwise reader
  (`depthwise_vector`) reads in place of the float32 array: MobileNet v2's expands at 112²
  and 56², whose outputs stream through memory, store half the bytes, and their readers
  load half. Below `IN_PLACE_MAX_BYTES` the planes lie in the output's own float32 memory.
  Unlike the pairs a 1×1 reader takes, the planes change what the reader sums: the values
  rounded to bf16, as an AMX host's are.
- the words a 1×1 product reads, where only 1×1 convolutions read the output and the
  product is the AVX-512 BF16 tile's (`gemm_preact.words_job`): MobileNet v2's stem, first
  and last projections, and each stage's last block (its residual added in the epilogue),
  whose expands then pair nothing. The words are the pairing pass's, bit for bit.
  MobileNet v2 at batch 1 in bf16 on a Zen 5 host, whole runs with the words against
  without, in turns in one process: 0.95-0.99× on one thread, 0.93-0.99× on both; its
  first expand 0.112 → 0.070 ms in the plan's walk, its stem 0.163 → 0.150.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, llvm_jit
from engine.kernels import bf16, bf16_handoff, gemm_kernel, gemm_preact
from engine.kernels.gemm_amx_handoff import HandingProduct

_FIELD = gemm_kernel.CONTEXT_FIELDS
# A float32 output of this size or more is offered as bf16 planes. MobileNet v2 at batch 1 in
# bf16, one Zen 5 core, in the plan's walk, float32 outputs against planes from this size
# on: 3.07 against 2.84 ms (from 256 KB, which takes the 14² expands too: 3.06 against 2.84;
# from 1 MB, which leaves out the 28² ones: 3.16 against 2.99). Its 96 × 112² expand 0.31
# against 0.22 ms and its depthwise reader 0.14 against 0.10; 144 × 56² before the stride-2
# layer 0.135 against 0.077.
MIN_OUTPUT_BYTES = 512 << 10
# Planes of an output below this size lie in the output's own memory
# (`bf16_handoff.take_planes`), as on AMX (`gemm_amx_handoff.IN_PLACE_MAX_BYTES`).
IN_PLACE_MAX_BYTES = 1 << 20
_state: dict[str, Any] = {}


def lay_bf16(calls: list[Any], out: Any, workspace: Any) -> list[Any]:
    """``calls``, where they end in one product of ours on a register tile writing the whole
    of ``out`` (one sample, channels-first, C-contiguous float32) with its epilogue already
    final (bias taken) in a bf16 plan on a host without AMX, with that product offering
    ``out`` (`TileHalvesProduct`): as bf16 planes past `MIN_OUTPUT_BYTES`, for a depthwise
    reader; as the words its 1×1 readers take (`gemm_preact.stores_words`: an AVX-512 BF16
    product), which then pair nothing; else as they are. The calls before it (a stem's
    copies of its input) write no part of ``out``."""
    if not calls or gemm_kernel.available(gemm_kernel.AMX):
        return calls
    call = calls[-1]
    paired = isinstance(call, bf16.PairedProduct)
    product = call.product if paired else call
    if not writes_whole(product, out) or _compiled() is None:
        return calls
    planes = out.nbytes >= MIN_OUTPUT_BYTES
    words = _read_by_products(out, workspace) and gemm_preact.stores_words(product, out)
    if not (planes or words):
        return calls
    handoff = bf16_handoff.offer(workspace, out, columns=words, planes=planes,
                                 planes_in_place=out.nbytes < IN_PLACE_MAX_BYTES,
                                 bf16_tile=True)
    if handoff is None:
        return calls
    handing = TileHalvesProduct(product, handoff)
    return [*calls[:-1],
            bf16.PairedProduct(call.func, call.args[0], handing) if paired else handing]


def _read_by_products(out: Any, workspace: Any) -> bool:
    """Whether only 1×1 convolutions of stride 1 read ``out`` (each may then take its
    words), a fused chain's head among them."""
    readers = (workspace.readers(out) if hasattr(workspace, "readers") else None) or ()
    for reader in readers:
        head = getattr(reader.attrs, "head", None)  # a fused chain's head op
        op, attrs = (reader.op, reader.attrs) if head is None else (head.op.name, head.attrs)
        if (op != "Convolution" or reader.position != 0
                or tuple(attrs.get("kernel", ())) != (1, 1)
                or any(step != 1 for step in attrs.get("stride", ()) or ())):
            return False
    return bool(readers)


def writes_whole(product: Any, out: Any) -> bool:
    """Whether ``product`` is a register tile's product (float32 or AVX-512 BF16) whose C is
    ``out`` (1, F, H, W) as (F, H·W), adding no residual."""
    if (type(product) is not gemm_kernel.Product or getattr(out, "ndim", 0) != 4
            or out.shape[0] != 1 or out.dtype != np.float32 or not out.flags.c_contiguous):
        return False
    context = product.context
    pixels = out.shape[2] * out.shape[3]
    return (int(context[_FIELD["kernel"]]) in (gemm_kernel.FP32, gemm_kernel.BF16)
            and int(context[_FIELD["batch"]]) == 1
            and int(context[_FIELD["c"]]) == out.ctypes.data
            and int(context[_FIELD["residual"]]) == 0
            and (int(context[_FIELD["m"]]), int(context[_FIELD["n"]]),
                 int(context[_FIELD["ldc"]])) == (out.shape[1], pixels, pixels))


class TileHalvesProduct(HandingProduct):
    """`gemm_amx_handoff.HandingProduct` over a register tile's product: its halves job is
    the tile's own kernel storing halves (`gemm_halves_ir`), its words job `gemm_preact`'s.
    One adding a residual lays the words too where every reader took them, its epilogue
    adding the residual before it rounds (MobileNet v2's last block of a stage, read by the
    next stage's first expand alone), or the next pre-activation's words where that
    BatchNorm asked (`gemm_preact.TILE_WORDS_ALONE`: ResNet v2's last block of a stage);
    never the planes, whose epilogue adds none."""

    def __call__(self) -> None:
        handoff = self.handoff
        if self.lays_ever or handoff.preact is not None:
            super().__call__()
            return
        laying = handoff.taken and handoff.layout == "words"
        if laying:
            if self.handing is None:
                self.handing = gemm_preact.words_job(self.plain, handoff.words)
            self.handing()
        else:
            self.plain()
        handoff.laid = laying

    def _part(self, kind: str, context: np.ndarray) -> int:
        if kind != "halves":
            raise ValueError(f"a register tile's product lays bf16 planes alone; asked for "
                             f"{kind}")
        return _compiled()[int(context[_FIELD["kernel"]])]


def _compiled() -> dict[Any, Any] | None:
    return compiled.made_once(_state, "kernels", _compile)


def _compile() -> dict[Any, Any] | None:
    """The float32 and AVX-512 BF16 tiles' halves parts for the host, or None where either
    kernel is missing (or llvmlite)."""
    if not (gemm_kernel.available() and gemm_kernel.available(gemm_kernel.BF16)):
        return None
    from engine.kernels.gemm_halves_ir import FloatHalvesKernel, PairHalvesKernel

    return llvm_jit.compile_variants({gemm_kernel.FP32: partial(_module, FloatHalvesKernel),
                                      gemm_kernel.BF16: partial(_module, PairHalvesKernel)},
                                     "part")


def _module(kernel_type: Any) -> Any:
    kernel = kernel_type(gemm_kernel.tile())
    kernel.define_part("part", kernel.define_full("tile_full"), kernel.define_edge("tile_edge"),
                       _FIELD)
    return kernel.module
