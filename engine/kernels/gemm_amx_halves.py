"""A bf16 1×1 convolution's AMX product writing its output as bf16 planes for its readers.

In a bf16 plan at batch 1, a 1×1 convolution whose product runs on AMX offers its output
through `bf16_handoff` as bf16 planes (``planes``): a reader that reads them (MobileNet v2's
depthwise layer after each expand, `depthwise_vector`) takes them (`bf16_handoff.take_planes`),
and where every reader took, each run's product stores its values rounded to bf16 (16-bit
halves, `gemm_amx_ir.AmxHalvesKernel`) in place of the float32 array, and says so (``laid``):
the 96 × 112² expand then stores 2.4 MB where it stored 4.8, and its reader loads as much less.
The values are the float32 epilogue's (biases, clamp) rounded to nearest even, as
`bf16.round_to_bf16` rounds them. A product adding a residual never lays them.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from engine.cpu import host_features, llvm_jit, spin_pool
from engine.kernels import bf16, bf16_handoff, gemm_kernel

# The positions of a `gemm_kernel.Product`'s context that a halves product changes.
_FIELD = gemm_kernel._FIELDS  # noqa: SLF001 - the context layout the AMX part reads
# A float32 output of this size or more, which streams past half a core's L2, is offered as
# bf16 planes (`gemm_bind.STREAMED_OUTPUT_BYTES`). MobileNet v2 at batch 1, one thread, in
# the plan's order, each expand and its depthwise reader with the planes against float32:
# 32 × 112² 1.02× and 0.91×, 96 × 112² 0.86× and 0.75×, 144 × 56² 1.00× and 0.87× (stride
# 1), 0.95× and 0.72× (stride 2); at 28² (600 KB, in L2) 0.83–1.10×; at 14² and 7² 1.0–1.5×
# slower (the widening costs more than the bytes saved; 7² planes lose the stacked task).
MIN_OUTPUT_BYTES = 1 << 20
_state: dict[str, Any] = {}
_compiling = threading.Lock()


def lay_planes(calls: list[Any], out: Any, workspace: Any) -> list[Any]:
    """``calls``, where they are one AMX product writing the whole of ``out`` (one sample,
    channels-first, C-contiguous float32, past `MIN_OUTPUT_BYTES`) with its epilogue already
    final (bias taken), with that product offering ``out`` as bf16 planes (`HalvesProduct`);
    else as they are."""
    if (len(calls) != 1 or not isinstance(calls[0], bf16.PairedProduct)
            or getattr(out, "nbytes", 0) < MIN_OUTPUT_BYTES
            or not _writes_whole(calls[0].product, out) or _compiled() is None):
        return calls
    handoff = bf16_handoff.offer(workspace, out, columns=False, planes=True)
    if handoff is None:
        return calls
    paired = calls[0]
    return [bf16.PairedProduct(paired.func, paired.args[0],
                               HalvesProduct(paired.product, handoff))]


def _writes_whole(product: Any, out: Any) -> bool:
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


class HalvesProduct:
    """An AMX `gemm_kernel.Product` (``plain``) that, on the runs where every reader of its
    ``handoff`` took the planes and it adds no residual, writes them as bf16 halves in place
    of its float32 output, saying which (``laid``). Like a Product it takes an epilogue and a
    residual."""

    leaves_blas_alone = True  # its tiles run on the spin pool, never in BLAS

    def __init__(self, plain: Any, handoff: bf16_handoff.PairedHandoff) -> None:
        self.plain, self.handoff = plain, handoff
        self.halved: Any = None  # the job writing the halves, made on the first run that does

    @property
    def context(self) -> np.ndarray:
        return self.plain.context

    def __call__(self) -> None:
        handoff = self.handoff
        laying = handoff.taken and int(self.plain.context[_FIELD["residual"]]) == 0
        if laying:
            if self.halved is None:
                self.halved = self._halves_job(handoff.words)
            self.halved()
        else:
            self.plain()
        handoff.laid = laying

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
        parts = self.plain.args[-1]  # a `spin_pool.Job`'s arguments end with its parts
        return spin_pool.job(_compiled()["part"], context, parts,
                             keep=(*self.plain.operands, planes))

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> HalvesProduct:
        """This product adding a bias and clamping (`gemm_kernel.Product.with_epilogue`)."""
        return HalvesProduct(self.plain.with_epilogue(bias_rows, bias_columns, low, high),
                             self.handoff)

    def writes_within(self, out: Any) -> bool:
        """Whether its float32 output lies inside ``out`` (`Product.writes_within`)."""
        return self.plain.writes_within(out)

    def with_residual(self, out: Any, other: Any) -> HalvesProduct:
        """This product adding a residual (`Product.with_residual`): it then writes float32
        on every run."""
        return HalvesProduct(self.plain.with_residual(out, other), self.handoff)


def _compiled() -> dict[str, Any] | None:
    if "kernel" not in _state:
        with _compiling:  # plans may bind on several threads at once: compile once
            if "kernel" not in _state:
                _state["kernel"] = _compile()
    return _state["kernel"]


def _compile() -> dict[str, Any] | None:
    """The halves part for the host, or None without AMX (or Linux's grant) or llvmlite."""
    if not gemm_kernel.available(gemm_kernel.AMX) or not host_features.amx_permitted():
        return None
    engine = llvm_jit.compile_for_host(_module)
    if engine is None:
        return None
    return {"engine": engine, "part": engine.get_function_address("part")}


def _module() -> Any:
    from engine.kernels.gemm_amx_ir import AmxHalvesKernel

    kernel = AmxHalvesKernel(gemm_kernel.AMX_TILE)
    kernel.define_part("part", kernel.define_full("tile_full"), kernel.define_edge("tile_edge"),
                       _FIELD)
    return kernel.module
