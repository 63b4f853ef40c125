"""A bf16 1×1 convolution's AMX product writing its output in bf16 for its readers.

In a bf16 plan at batch 1, a 1×1 convolution whose product runs on AMX offers its output
through `bf16_handoff` in two layouts, and where every reader took one, each run's product
writes it in place of the float32 array and says so (``laid``):

- bf16 planes (``planes``): the array's planes, each value rounded to bf16 and stored as its
  16 bits (`gemm_amx_ir.AmxHalvesKernel`), for a depthwise reader (MobileNet v2's after each
  expand, `depthwise_vector`, `bf16_handoff.take_planes`): the 96 × 112² expand then stores
  2.4 MB where it stored 4.8, and its reader loads as much less. Only for an output past
  `MIN_OUTPUT_BYTES`; below `IN_PLACE_MAX_BYTES` the planes lie in the output's own float32
  memory (the 192 × 28² expands), which then stays written for the layers given it next.
- the zero-bordered grid of bf16 pairs a direct convolution of stride 1 reads (`conv_amx`,
  `bf16_handoff.grid_for`; `gemm_amx_ir.AmxGridKernel`): ResNet v2's bottleneck, whose 1×1
  product (its BatchNorm and ReLU folded in) writes the 3×3's input, which that reader then
  does not pair. The words are the pairing pass's, bit for bit.
- the words a 1×1 product on AMX reads (``columns``, `bf16_handoff.words_for`;
  `gemm_preact.words_job`), over a short K (`gemm_preact.writes_words`): MobileNet
  v2's first projection (16 filters) for the expand after it, and its stem, a batch of
  products one per output row (`conv_bind._bind_split_rows`), for its first expand; that
  reader then pairs nothing. The words are the pairing pass's, bit for bit.

The values are the float32 epilogue's (biases, clamp) rounded to nearest even, as
`bf16.round_to_bf16` rounds them. A product adding a residual lays neither.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, host_features, llvm_jit, spin_pool, steady_walk
from engine.kernels import banded_pool, bf16, bf16_handoff, gemm_kernel, gemm_preact

# The positions of a `gemm_kernel.Product`'s context that a halves product changes.
_FIELD = gemm_kernel.CONTEXT_FIELDS
# A float32 output of this size or more is offered as bf16 planes. MobileNet v2 at batch 1,
# one thread, in the plan's order, each expand and its depthwise reader with the planes
# against float32: 32 × 112² 1.02× and 0.91×, 96 × 112² 0.86× and 0.75×, 144 × 56² 1.00× and
# 0.87× (stride 1), 0.95× and 0.72× (stride 2); 192 × 28² (600 KB, laid in place) 0.41–0.68×
# and 0.79–1.05×, where the float32 output went into lines long out of cache; at 14² and 7²
# 1.0–1.5× slower (the widening costs more than the bytes saved; 7² planes lose the stacked
# task).
MIN_OUTPUT_BYTES = 512 << 10
# Planes of an output below this size (it fits in half a core's L2) lie in the output's own
# memory (`bf16_handoff.take_planes`): the plan gives that buffer to a later layer, which
# then finds it in cache where it would find lines left unwritten since an earlier layer
# (MobileNet v2's 384 × 14² expand after the 28² ones 0.75–0.79× so). Larger ones lie in
# the plan's buffer for planes of their shape, which the next expand of that shape (144 ×
# 56² twice) lays again while it is in cache (1.17× for the second in their own memory).
IN_PLACE_MAX_BYTES = 1 << 20
_state: dict[str, Any] = {}


def lay_bf16(calls: list[Any], out: Any, workspace: Any) -> list[Any]:
    """``calls``, where they are one AMX product writing the whole of ``out`` (one sample,
    channels-first, C-contiguous float32) with its epilogue already final (bias taken), with
    that product offering ``out`` as bf16 planes (past `MIN_OUTPUT_BYTES`), a direct
    convolution's grid or, over a short K, a 1×1 product's words (`HandingProduct`), and
    where its activation is small, its runs that write float32 paired by each part of its
    product (`bf16.PartPairedProduct`); where they end in a stem's batch of row products
    (`_writes_by_rows`), that product offering the words alone; else as they are."""
    if (calls and type(calls[-1]) is bf16.PairedProduct and _compiled() is not None
            and _writes_by_rows(_rows_of(calls[-1].product), out)):
        return [*calls[:-1], _laying_words(calls[-1], out, workspace)]
    if (len(calls) != 1 or not isinstance(calls[0], bf16.PairedProduct)
            or not writes_whole(calls[0].product, out) or _compiled() is None):
        return calls
    paired = calls[0]
    handoff = bf16_handoff.offer(workspace, out, grids=_writes_grid,
                                 columns=gemm_preact.stores_words(paired.product, out),
                                 planes=out.nbytes >= MIN_OUTPUT_BYTES,
                                 planes_in_place=out.nbytes < IN_PLACE_MAX_BYTES)
    product = paired.product if handoff is None else HandingProduct(paired.product, handoff)
    if bf16.parts_pair(paired.args[0], paired.product):
        return [bf16.PartPairedProduct(paired.func, paired.args[0], product, workspace)]
    if handoff is None:
        return calls
    return [bf16.PairedProduct(paired.func, paired.args[0], product)]


def _laying_words(paired: bf16.PairedProduct, out: Any, workspace: Any) -> Any:
    """``paired`` (its product writing ``out`` row by row, `_writes_by_rows`) offering
    ``out`` as the words its 1×1 readers take, where its product can store them
    (`gemm_preact.writes_words`); else as it is. MobileNet v2's stem (32 filters over K
    27, 1.6 MB of float32 output) for its first expand, which then pairs nothing."""
    rows = _rows_of(paired.product)
    readers = workspace.readers(out) if hasattr(workspace, "readers") else None
    if (not gemm_preact.stores_words(rows, out)
            or any(reader.op == "Pooling" for reader in readers or ())):
        return paired  # a pooling takes no words (ResNet's stem: `banded_pool` serves it)
    handoff = bf16_handoff.offer(workspace, out)
    if handoff is None:
        return paired
    return bf16.PairedProduct(paired.func, paired.args[0], HandingProduct(rows, handoff))


def _rows_of(product: Any) -> Any:
    """A stem's batch of row products, out of the form that may run it in bands for a max
    pooling after it (`banded_pool.BandedProduct`): a stem storing its readers' words runs
    whole, and no pooling reads its float32 output."""
    return product.whole if isinstance(product, banded_pool.BandedProduct) else product


def _writes_by_rows(product: Any, out: Any) -> bool:
    """Whether ``product`` is a batch of AMX products (`gemm_kernel.bind_tiles_batch`) each
    writing one row of every plane of ``out`` (1, F, H, W), row after row: C of the first
    is ``out[0, :, 0]``, C's rows a plane apart, each product one row on."""
    if (type(product) is not gemm_kernel.Product or getattr(out, "ndim", 0) != 4
            or out.shape[0] != 1 or out.dtype != np.float32 or not out.flags.c_contiguous):
        return False
    context = product.context
    height, width = out.shape[2:]
    return (int(context[_FIELD["kernel"]]) == gemm_kernel.AMX
            and int(context[_FIELD["c"]]) == out.ctypes.data
            and (int(context[_FIELD["m"]]), int(context[_FIELD["n"]]),
                 int(context[_FIELD["ldc"]]), int(context[_FIELD["batch"]]),
                 int(context[_FIELD["c_batch"]]))
            == (out.shape[1], width, height * width, height, 4 * width))


def _writes_grid(reader: Any) -> bool:
    """Whether the product writes the grid of ``reader`` (`conv_amx._Grid`): stride 1, grid
    rows of `gemm_amx_ir.GRID_MIN_WIDTH` pixels or more (a vector of 16 falls on three grid
    rows at most), a border and width the geometry's 16 bits hold."""
    from engine.kernels.gemm_amx_ir import GRID_MIN_WIDTH

    width = reader.shape[3]
    return (tuple(reader.stride) == (1, 1) and reader.shape[0] == 1
            and GRID_MIN_WIDTH <= width < reader.width < 1 << 16
            and reader.pad[0] * reader.width + reader.pad[1] < 1 << 16)


def writes_whole(product: Any, out: Any) -> bool:
    """Whether ``product`` is an AMX product whose C is ``out`` (1, F, H, W) as (F, H·W)."""
    if (type(product) is not gemm_kernel.Product or getattr(out, "ndim", 0) != 4
            or out.shape[0] != 1 or out.dtype != np.float32 or not out.flags.c_contiguous):
        return False
    context = product.context
    pixels = out.shape[2] * out.shape[3]
    return (int(context[_FIELD["kernel"]]) == gemm_kernel.AMX
            and int(context[_FIELD["batch"]]) == 1
            and int(context[_FIELD["c"]]) == out.ctypes.data
            and (int(context[_FIELD["m"]]), int(context[_FIELD["n"]]),
                 int(context[_FIELD["ldc"]])) == (out.shape[1], pixels, pixels))


class HandingProduct:
    """An AMX `gemm_kernel.Product` (``plain``) that, on the runs where every reader of its
    ``handoff`` took one layout and it adds no residual, writes that layout (bf16 planes, or
    a reader's grid) in place of its float32 output, saying which (``laid``). Like a Product
    it takes an epilogue and a residual."""

    leaves_blas_alone = True  # its tiles run on the spin pool, never in BLAS

    def __init__(self, plain: Any, handoff: bf16_handoff.PairedHandoff) -> None:
        self.plain, self.handoff = plain, handoff
        self.handing: Any = None  # the job writing the layout, made on the first run that does
        # Whether any run may lay it: one adding a residual, or a shortcut's product merged
        # in (`gemm_amx_shortcut`), writes float32 on every run (a `bf16.PartPairedProduct`
        # reads this too).
        self.lays_ever = (int(plain.context[_FIELD["residual"]]) == 0
                          and not getattr(plain, "sums_always", False))
        if not self.lays_ever:  # the step's product is the last one made: it answers asks
            handoff.residual_writer = plain

    @property
    def context(self) -> np.ndarray:
        return self.plain.context

    def __call__(self) -> None:
        handoff = self.handoff
        if not self.lays_ever:
            self._sum_and_preact(handoff.preact)
            handoff.laid = False
            return
        laying = self.lays_ever and handoff.taken
        if laying:
            if self.handing is None:
                self.handing = (
                    self._halves_job(handoff.words) if handoff.layout == "planes"
                    else gemm_preact.words_job(self.plain, handoff.words)
                    if handoff.layout == "words"
                    else self._grid_job(handoff.words, handoff.grid))
            self.handing()
        else:
            self.plain()
        handoff.laid = laying

    def replayable(self) -> bool:
        """Its product and the job laying its readers' layout are jobs (`steady_walk`)."""
        return steady_walk.all_replayable(self.plain, self.handing)

    def _sum_and_preact(self, request: Any) -> None:
        """The residual product, writing the next BatchNorm's words too where that
        BatchNorm asked (`gemm_preact`) and every reader of its output took them."""
        writing = (request is not None and request.bounds is not None
                   and request.out_handoff.taken)
        if writing:
            if self.handing is None:
                self.handing = gemm_preact.preact_job(self.plain, request)
            self.handing()
        else:
            self.plain()
        if request is not None:
            request.written = writing

    def _halves_job(self, planes: np.ndarray) -> Any:
        """The plain product's job with its output the halves (``planes``, uint16): C's
        address doubled (`gemm_amx_ir.AmxHalvesKernel` halves each tile's corner) and its
        row ``planes``' pixels, over as many parts."""
        if planes.dtype != np.uint16 or planes.shape[0] != int(self.context[_FIELD["m"]]):
            raise ValueError(f"a 1×1 product's bf16 planes must be uint16 of "
                             f"{int(self.context[_FIELD['m']])} channels; got {planes.dtype} "
                             f"{planes.shape}")
        context = self.plain.context.copy()
        context[_FIELD["c"]] = 2 * planes.ctypes.data
        context[_FIELD["ldc"]] = planes[0].size
        return self._job("halves", context, planes)

    def _grid_job(self, words: np.ndarray, grid: Any) -> Any:
        """The plain product's job with its output the reader's grid (``words``, float32-
        viewed pairs, ``grid`` its `conv_amx._Grid`), as `gemm_amx_ir.AmxGridKernel` reads
        its context: no column bias (its pointer then counts the tile's columns), the
        residual's address C's plus the grid's geometry, ``ldc`` half a word row."""
        width = grid.shape[3]
        if (words.ndim != 2 or words.shape[1] % 2
                or 2 * words.shape[0] < int(self.context[_FIELD["m"]])):
            raise ValueError(f"a 1×1 product's grid must hold its {int(self.context[_FIELD['m']])} "
                             f"filters in word rows of an even length; got {words.shape}")
        geometry = (width + ((grid.width - width) << 16)
                    + ((grid.pad[0] * grid.width + grid.pad[1]) << 32))
        context = self.plain.context.copy()
        context[_FIELD["c"]] = words.ctypes.data
        context[_FIELD["ldc"]] = words.shape[1] // 2
        context[_FIELD["columns_bias"]] = 0
        context[_FIELD["residual"]] = words.ctypes.data + geometry
        return self._job("grid", context, words)

    def _job(self, kind: str, context: np.ndarray, target: np.ndarray) -> Any:
        parts = self.plain.args[-1]  # a `spin_pool.Job`'s arguments end with its parts
        return spin_pool.job(self._part(kind, context), context, parts,
                             keep=(*self.plain.operands, target))

    def _part(self, kind: str, context: np.ndarray) -> int:
        """The address of the compiled part writing layout ``kind`` over ``context``."""
        return _compiled()[kind]

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> HandingProduct:
        """This product adding a bias and clamping (`gemm_kernel.Product.with_epilogue`)."""
        if bias_columns is not None:
            raise ValueError("a 1×1 convolution takes a bias per filter, not per column")
        return type(self)(_kept(self.plain, self.plain.with_epilogue(bias_rows, None, low,
                                                                     high)), self.handoff)

    def writes_within(self, out: Any) -> bool:
        """Whether its float32 output lies inside ``out`` (`Product.writes_within`)."""
        return self.plain.writes_within(out)

    def with_residual(self, out: Any, other: Any) -> HandingProduct:
        """This product adding a residual (`Product.with_residual`): it then writes float32
        on every run."""
        return type(self)(_kept(self.plain, self.plain.with_residual(out, other)),
                          self.handoff)


def _kept(plain: Any, product: Any) -> Any:
    """``product`` (``plain`` with an epilogue or a residual) writing its sums on every run
    where ``plain`` does (a shortcut merged in, `gemm_amx_shortcut`: ``sums_always``)."""
    if getattr(plain, "sums_always", False):
        product.sums_always = True
    return product


def _compiled() -> dict[str, Any] | None:
    return compiled.made_once(_state, "kernel", _compile)


def _compile() -> dict[str, Any] | None:
    """The halves part and the grid part for the host (an engine each), or None without AMX
    (or Linux's grant) or llvmlite."""
    if not gemm_kernel.available(gemm_kernel.AMX) or not host_features.amx_permitted():
        return None
    from engine.kernels.gemm_amx_ir import AmxGridKernel, AmxHalvesKernel

    return llvm_jit.compile_variants({"halves": partial(_module, AmxHalvesKernel),
                                      "grid": partial(_module, AmxGridKernel)}, "part")


def _module(kernel_type: Any) -> Any:
    kernel = kernel_type(gemm_kernel.AMX_TILE)
    kernel.define_part("part", kernel.define_full("tile_full"), kernel.define_edge("tile_edge"),
                       _FIELD)
    return kernel.module
