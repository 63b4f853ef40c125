"""A bf16 stem's product in bands of output rows, with the max pooling after it run band by
band, where the pooling alone reads the stem's output.

ResNet's 7×7 stem writes 3.2 MB of float32 an image (`conv_bind._bind_split_rows`: one AMX
product over every output row), which the 3×3 stride-2 max pooling after it reads back: the
stores miss L2 on their way out, and the pooling reads them from L3 (from memory at batch 8,
where the stem writes 26 MB before the pooling starts). Where the pooling is the node bound
right after the stem and the one reader of its output, the stem's step instead runs its
product a band of `BAND_ROWS` output rows at a time into a buffer of a band's rows (and the
row above it, which the band's first windows read: each band after the first computes it
again), and pools each band's rows from there while they are in L2; the stem's float32
output is then never written, and the pooling's own step does nothing (a run armed over the
cores runs the whole product and then the pooling's whole job, as the two steps did). The
pooled values are the pooling pass's, bit for bit.

A stem whose products each compute a band of output rows (`conv_bind`'s bands of patches:
the AVX-512 BF16 tile's products) offers the same (`BandThenPool`): where the pooling takes
it, each band's product stores its rows into a band buffer below `ROWS_ABOVE` rows copied
from the band before's last, and its step pools the output rows the band finishes from there,
so that here too the stem's output is never written. ResNet-18 in bf16 on a Zen 5 VM, the
stem and its pooling in the plan's walk on one core: apart 1.16 ms at batch 1 and 11.9 at
batch 8, pooled band by band from the stem's output 1.08 and 9.1; through the band buffer
(by the thread's CPU time, two processes each way in turn) batch 8 8.8–11.2 against
10.8–12.8 from the output, batch 1 1.08–1.13 either way, both cores the same within the
host's swing. The answers are the same bits.

The stem binds first and learns later whether the pooling takes its offer (`offer`, `take`):
its step runs the one whole product until then. The offer is withdrawn where steps after the
product change the stem's output (`withdraw`: a fused chain whose epilogue could not take a
step), and refused where the pooling's output lies on any array the stem's step reads, or
where an image's pooled rows lie on a later image's input (`pools_onto_later_input`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.cpu import parts, spin_pool, steady_walk
from engine.kernels import bf16, gemm_kernel, max_pool_vector, strided_kernel

TAG = "banded pooling offer"
# Stem output rows a band: a band's 17 rows of 64 filters × 112 columns (490 KB) stay in L2
# until the pooling of its 8 rows reads them. ResNet-18 at batch 1, one thread, the stem and
# its pooling by the thread's CPU time against the whole product and the pooling's own pass
# (load 11): 8 rows 1.02×, 16 0.92×, 24 0.94×, 32 0.92×, 56 0.91×.
BAND_ROWS = 16
WINDOW = (3, 3, 2, 2, 1, 1)  # the pooling taken: 3×3, stride 2, padding 1 (ResNet's)
# Rows a band buffer holds above a band of the tile's products: the windows of the first
# output row a band finishes reach two rows above it where the band starts at an odd row
# (ResNet's stems in bands of 15 rows), one where at an even one.
ROWS_ABOVE = 2


class RowPooling:
    """One image's pooling, shared by a stem product and every product made from it as its
    epilogue changes: where the pooling took the offer, the band buffer (``band``), the
    bands' products into it before any epilogue (``bands``) and the pooling's ``jobs``, one
    a band; else None."""

    def __init__(self, make_bands: Any) -> None:
        self.make_bands = make_bands  # the bands' products into a given band buffer
        self.band: Any = None
        self.bands: list[Any] | None = None
        self.jobs: list[Any] | None = None
        self.whole: Any = None  # the pooling of the stem's whole output, as its own step was

    def attach(self, data: Any, out: Any, parts: int, band: Any) -> None:
        """The pooling of ``data`` (one image's stem output, F × H × W) into ``out`` taken:
        the bands' products into the band buffer ``band`` and a job pooling each band."""
        height = data.shape[1]
        self.band, self.bands = band, self.make_bands(band)
        self.whole = max_pool_vector.job(data, out)
        self.jobs = [max_pool_vector.band_job(band[:, int(top == 0):], max(0, top - 1), height,
                                              out, _pooled_rows(top, top + BAND_ROWS, height,
                                                                out.shape[1]), parts)
                     for top in range(0, height, BAND_ROWS)]


class RowBands:
    """One image's pooling where its stem's products each write a band of its output rows
    (`BandThenPool`): the bands' first rows and the stem's ``operands`` (what its step
    reads). Where the pooling took the offer, the bands' products move their rows into
    ``band``, a buffer of a band's rows below `ROWS_ABOVE` rows, which stays in L2 (in place
    the rows went to the stem's output, 3.2 MB an image whose lines came from memory); each
    band's step first copies the band before's last rows to the top (``copies``, the first
    band's None), then runs its product into the buffer and its pooling job (``jobs``), which
    pools the output rows the band finishes from there."""

    def __init__(self, tops: list[int], operands: tuple[Any, ...]) -> None:
        self.tops, self.operands = tops, operands
        self.jobs: list[Any] | None = None
        self.copies: list[Any] = []
        self.counts: list[int] = []  # each band's output rows, once taken
        self.band: Any = None

    def attach(self, data: Any, out: Any, parts: int, band: Any = None) -> None:
        """The pooling of ``data`` (F × H × W) into ``out`` taken, through ``band`` (F ×
        `ROWS_ABOVE` + rows × W, rows the most a band has): a copy, a product and a job a
        band."""
        height = data.shape[1]
        self.counts = band_rows(self.tops, height)
        self.band = band
        self.jobs = [max_pool_vector.band_job(band[:, 0 if top else ROWS_ABOVE:
                                                   ROWS_ABOVE + count],
                                              max(0, top - ROWS_ABOVE), height, out,
                                              _pooled_rows(top, top + count, height,
                                                           out.shape[1]), parts)
                     for top, count in zip(self.tops, self.counts, strict=True)]
        self.copies = [None] + [_rows_copy(band[:, :ROWS_ABOVE],
                                           band[:, count:count + ROWS_ABOVE])
                                for count in self.counts[:-1]]

    def into_band(self, product: Any, index: int) -> Any:
        """Band ``index``'s product (a `gemm_kernel.Product` over its rows, F × rows·W)
        writing them below the buffer's rows above."""
        band = self.band
        rows = np.lib.stride_tricks.as_strided(
            band[:, ROWS_ABOVE:], (band.shape[0], self.counts[index] * band.shape[2]),
            (band.strides[0], band.itemsize))
        return product.writing(rows)


def band_rows(tops: list[int], height: int) -> list[int]:
    """Each band's rows, the bands starting at ``tops`` of ``height`` rows."""
    return [end - top for top, end in zip(tops, [*tops[1:], height], strict=True)]


def _rows_copy(target: Any, source: Any) -> Any:
    """``source``'s rows into ``target``'s, as a job where one can run it."""
    made = strided_kernel.job(0, target, source, source, min_elements=1)
    return partial(np.copyto, target, source) if made is None else made


class BandThenPool:
    """A product writing band ``index`` of a stem's output rows in place (its ``product``);
    where the image's pooling took the offer (``pooling.jobs``), the band before's last rows
    copied to the band buffer's top, the product into the buffer below them (made on the
    first run so: ``banded``), then the pooling of the rows that band finishes. Like a
    `gemm_kernel.Product` it takes an epilogue."""

    leaves_blas_alone = True
    banded: Any = None

    def __init__(self, product: Any, pooling: RowBands, index: int) -> None:
        self.product, self.pooling, self.index = product, pooling, index

    @property
    def operands(self) -> tuple[Any, ...]:
        return self.pooling.operands

    def __call__(self) -> None:
        pooling = self.pooling
        jobs = pooling.jobs
        if jobs is None:
            self.product()
            return
        banded = self.banded
        if banded is None:
            banded = self.banded = pooling.into_band(self.product, self.index)
        copy = pooling.copies[self.index]
        if copy is not None:
            copy()
        banded()
        jobs[self.index]()

    def replayable(self) -> bool:
        """Its product (or the copy, its product into the band buffer and its band's
        pooling) are jobs (`steady_walk`)."""
        jobs = self.pooling.jobs
        if jobs is None:
            return steady_walk.replayable(self.product)
        return steady_walk.all_replayable(self.pooling.copies[self.index], self.banded,
                                          jobs[self.index])

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> BandThenPool:
        """This band's product adding a bias and clamping (`gemm_kernel.Product.with_epilogue`)."""
        return BandThenPool(self.product.with_epilogue(bias_rows, bias_columns, low, high),
                            self.pooling, self.index)

    def writes_within(self, out: Any) -> bool:
        """Never taken for a residual (`BandedProduct.writes_within`)."""
        return False


def pooling_after_bands(calls: list[Any], tops: list[int],
                        operands: tuple[Any, ...]) -> list[Any]:
    """``calls`` (one image's stem products, one a band of output rows from ``tops``, each a
    `bf16.PairedProduct`) each pooling its band's rows after it where a pooling takes the
    image's output (`RowBands`); ``operands``: what the stem's step reads."""
    if not all(type(call.product) is gemm_kernel.Product for call in calls):
        return calls  # its products' rows cannot move into a band buffer
    pooling = RowBands(tops, operands)
    return [bf16.PairedProduct(call.func, call.args[0], BandThenPool(call.product, pooling,
                                                                     index))
            for index, call in enumerate(calls)]


class BandedProduct:
    """An AMX product over a stem's output rows into its output (``whole``) that, where its
    image's pooling took the offer (``pooling.jobs``), runs in bands of rows into the band
    buffer instead (the row above each band first, but for the first band's), each band
    pooled after it; armed over the cores, the whole product and then the pooling's whole
    job, as the two steps ran apart (a band's product and pooling are a job each, and the
    cores meet at the end of every one). Like a `gemm_kernel.Product` it takes an epilogue:
    ``changes`` are those made to ``whole`` so far, made to the bands' products too on the
    first run that runs them (the pooling binds after the stem)."""

    leaves_blas_alone = True

    def __init__(self, whole: Any, pooling: RowPooling, operands: tuple[Any, ...],
                 changes: tuple[Any, ...] = ()) -> None:
        self.whole, self.pooling, self.changes = whole, pooling, changes
        self.operands = operands  # the arrays the step reads (no pooling output may lie there)
        self.bands: list[Any] | None = None

    def __call__(self) -> None:
        jobs = self.pooling.jobs
        if jobs is None:
            self.whole()
            return
        if spin_pool.spinning():  # armed over the cores: one job each, as apart
            self.whole()
            self.pooling.whole()
            return
        bands = self.bands
        if bands is None:
            bands = self.bands = [self._changed(band) for band in self.pooling.bands or ()]
        for band, pool in zip(bands, jobs, strict=True):
            band()
            pool()

    def _changed(self, product: Any) -> Any:
        for change in self.changes:
            product = change(product)
        return product

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> BandedProduct:
        """This product adding a bias and clamping (`gemm_kernel.Product.with_epilogue`)."""
        def change(product: Any) -> Any:
            return product.with_epilogue(bias_rows, bias_columns, low, high)

        return BandedProduct(change(self.whole), self.pooling, self.operands,
                             (*self.changes, change))

    def writes_within(self, out: Any) -> bool:
        """Whether the product's output lies inside ``out``, where a residual would be read
        as it: never taken, as the bands write elsewhere."""
        return False


def banded(tiles: Any, pairs: Any, targets: Any, period: int,
           operands: tuple[Any, ...]) -> BandedProduct:
    """`gemm_kernel.bind_tiles_batch` over the output rows of ``targets`` (F, rows, W), row
    ``y``'s K the word rows of ``pairs`` from ``y · period``: whole, or (once a pooling took
    it) in bands of `BAND_ROWS` into a band buffer, the row above each band first."""
    rows = targets.shape[1]
    whole = gemm_kernel.bind_tiles_batch(tiles, pairs, targets[:, 0, :], rows, period,
                                         targets.strides[1])

    def make_bands(band: Any) -> list[Any]:
        made = []
        for top in range(0, rows, BAND_ROWS):
            first = max(0, top - 1)
            made.append(gemm_kernel.bind_tiles_batch(
                tiles, pairs[first * period:], band[:, first - top + 1, :],
                min(top + BAND_ROWS, rows) - first, period, band.strides[1]))
        return made

    return BandedProduct(whole, RowPooling(make_bands), operands)


class Offer:
    """A stem's offer of its output ``out`` (N, F, H, W) to a pooling bound right after it:
    each image's pooling (``poolings``, in order: a `BandedProduct`'s `RowPooling`, or the
    `RowBands` of its products in bands), what the stem's step reads (``operands``) and the
    stem's input (``data``, N × …), whose images the step reads in turn."""

    def __init__(self, out: Any, poolings: list[Any], operands: tuple[Any, ...],
                 noted: int | None, data: Any) -> None:
        self.out, self.poolings, self.operands, self.noted = out, poolings, operands, noted
        self.data = data
        self.withdrawn = False


def offer(workspace: Any, out: Any, calls: list[Any], data: Any) -> None:
    """Offer ``out`` where ``calls`` (a stem's, final, over its input ``data``) run one
    `BandedProduct` per image, or each image's products in bands (`BandThenPool`)."""
    if workspace is None or not hasattr(workspace, "shared") or getattr(out, "ndim", 0) != 4:
        return
    products = [getattr(call, "product", None) for call in calls]
    banded = [product for product in products if isinstance(product, BandedProduct)]
    # each image's products in bands share its pooling: one of them a pooling, in order
    bands = list({id(product.pooling): product for product in products
                  if isinstance(product, BandThenPool)}.values())
    made = banded or bands
    if len(made) != out.shape[0] or (banded and bands):
        return
    poolings = [product.pooling for product in made]
    operands = tuple(operand for product in made for operand in product.operands)
    noted = getattr(workspace, "noted", None)
    workspace.shared(out, TAG, lambda: Offer(out, poolings, operands, noted, data))


def withdraw(workspace: Any, out: Any) -> None:
    """No pooling may take ``out``'s offer: steps after the stem's product change ``out``."""
    made = None if workspace is None or not hasattr(workspace, "shared") else \
        workspace.shared(out, TAG)
    if made is not None:
        made.withdrawn = True


def take(workspace: Any, data: Any, out: Any, window: tuple[int, ...]) -> bool:
    """Whether a max pooling of ``data`` into ``out`` (N, C, H, W) over ``window`` (kernel,
    stride and padding, y then x) runs inside the stem's step that writes ``data``: its
    writer offered it, it is the node bound right after and the one reader of ``data``, the
    window is `WINDOW`, the vector kernel runs it, and ``out`` shares no memory with what the
    stem's step reads or writes. Where it does, the stem's products each pool their image's
    bands from now on, and ``data`` is never written."""
    made = None if workspace is None or not hasattr(workspace, "shared") else \
        workspace.shared(data, TAG)
    readers = None if made is None else workspace.readers(data)
    if (made is None or made.withdrawn or made.out is not data or tuple(window) != WINDOW
            or readers is None or len(readers) != 1
            or made.noted is None or getattr(workspace, "noted", None) != made.noted + 1
            or getattr(out, "ndim", 0) != 4 or out.shape[:2] != data.shape[:2]
            or not out.flags.c_contiguous or np.may_share_memory(out, data)
            or any(np.may_share_memory(out, operand) for operand in made.operands)
            or pools_onto_later_input(out, made.data)):
        return False
    if not all(max_pool_vector.applies(data[image], out[image], WINDOW)
               for image in range(data.shape[0])):
        return False
    height, width = data.shape[2:]
    if any(isinstance(pooling, RowBands)
           and min(band_rows(pooling.tops, height)[:-1], default=ROWS_ABOVE) < ROWS_ABOVE
           for pooling in made.poolings):
        return False  # a band too short to hold the rows above the next
    # as many parts as a band's product has: against one a core for both, ResNet-18 on one
    # thread, the stem and its pooling took 0.91× (batch 1) and 0.94× (batch 8) CPU time
    parts = min(data.shape[1], spin_pool.PARTS_PER_CORE * spin_pool.cores())
    band = None
    for image, pooling in enumerate(made.poolings):
        if band is None:  # one buffer for every image's bands: their steps run in turn
            rows = BAND_ROWS + 1 if isinstance(pooling, RowPooling) else \
                ROWS_ABOVE + max(band_rows(pooling.tops, height))
            band = workspace.zeroed((data.shape[1], rows, width), np.float32,
                                    (TAG, rows, width))
        pooling.attach(data[image].reshape(-1, height, width),
                       out[image].reshape(-1, *out.shape[2:]), parts, band)
    return True


def pools_onto_later_input(out: Any, data: Any) -> bool:
    """Whether an image's pooled rows (``out``, N × …) would land on the stem's input of a
    later image (``data``, N × …), which the stem's step reads only after it has pooled that
    image: the plan lays out the pooling's output as written after the stem's whole step, so
    it may share memory with the stem's input where that is a buffer of the plan's (ResNet
    v2's input BatchNorm before its stem; at batch 3 the second and third images' inputs
    were overwritten so). An image's own input is read before its bands pool."""
    return any(np.may_share_memory(out[image], data[image + 1:])
               for image in range(out.shape[0] - 1))


def _pooled_rows(top: int, end: int, height: int, out_height: int) -> tuple[int, int]:
    """The output rows the band of input rows [top, end) finishes: row ``y``'s window reads
    input rows 2y - 1 to 2y + 1, so a band finishes those up to its end // 2 (every row
    left at the last band), from where the band before left off."""
    return top // 2, out_height if end >= height else end // 2


# the pooling's step where the stem's step pools its bands (`take`)
pooled_by_writer = parts.DoneByItsWriter()
