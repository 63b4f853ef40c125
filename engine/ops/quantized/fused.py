"""oneDNN's fused layers as MXNet exports them: ``_sg_mkldnn_conv`` (Convolution with its
BatchNorm, activation, residual sum and activation after the sum) and
``_sg_mkldnn_fully_connected`` (FullyConnected with an activation).

A quantized node reads int8/uint8 data with its range and float32 weights (a convolution)
or int8 weights with their ranges (a fully connected layer as quantized by MXNet's graph
pass). It folds BatchNorm into the float weights, quantizes them per output channel where the
output is calibrated, accumulates in int32 and writes int8/uint8 over ``min_calib_range`` /
``max_calib_range`` (uint8 after a non-negative activation), float32 where
``enable_float_output`` fuses the dequantize in, or int32 uncalibrated. The scales follow
MXNet 1.9.1's oneDNN code step by step in float32; results match MXNet's to the integer
except where a float32 product lands within rounding of a half step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from threading import get_ident
from typing import Any

import numpy as np

from engine.cpu import spin_pool, steady_walk
from engine.errors import ModelFormatError
from engine.kernels import gemm_int8, int8_conv, int8_depthwise, int8_memory
from engine.ops.attrs import parse_bool
from engine.ops.dtypes import FLOAT32, UINT8
from engine.ops.quantized import handoff, integer, ranges
from engine.ops.quantized.ranges import CALIB_PARAMS, F32, INT8, RANGE_OUTPUTS
from engine.ops.quantized.requantize import (
    finish,
    int32_range,
    output_dtype,
    quantized_weight_bias,
    weight_scales,
)
from engine.ops.quantized.subgraph_attrs import FusedChain, fold_batchnorm, read_chain
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, get_op, register

CONV = "_sg_mkldnn_conv"
DEQUANTIZE_OP = "_contrib_dequantize"
FC = "_sg_mkldnn_fully_connected"
BN_INPUTS = ("gamma", "beta", "moving_mean", "moving_var")


def _flags(*names: str) -> tuple[Param, ...]:
    return tuple(Param(name, parse_bool, False) for name in names)


# The flags MXNet 1.9.1 writes; others (a deduplicated sum, a shifted uint8 output) change
# the inputs or the arithmetic, and are refused as unknown attributes, by name.
# (``with_relu`` and ``with_postsum_relu`` are the names MXNet 1.5 wrote.) One is ours:
# ``out_of_place_sum``, an int8 residual under a uint8 output summed into the node's own
# output over its whole range, not through the residual's int8 buffer (`_conv_terms`), as
# `engine.quantize.rewrite` writes it; and ``narrow_weights``, the weights quantized within
# ±63 (`requantize.NARROW_LIMIT`), which the rewrite writes on hosts whose int8 GEMM runs such
# weights faster (AVX2 without VNNI, `gemm_int8.narrow_weights_pay`).
CONV_PARAMS = (*_flags("quantized", "with_bn", "with_act", "with_sum", "with_postsum_act",
                       "with_relu", "with_postsum_relu", "out_of_place_sum", "narrow_weights"),
               *CALIB_PARAMS)
FC_PARAMS = (*_flags("quantized", "enable_float_output", "with_eltwise",
                     "channel_wise_quantize", "with_relu"), *CALIB_PARAMS)


def _conv_chain(attrs: Attrs) -> FusedChain:
    return read_chain(attrs, "Convolution", CONV)


def _fc_chain(attrs: Attrs) -> FusedChain:
    return read_chain(attrs, "FullyConnected", FC)


def _conv_inputs(attrs: Attrs) -> tuple[str, ...]:
    chain = _conv_chain(attrs)
    names = ["data", "weight", *(() if chain.main.no_bias else ("bias",))]
    names += BN_INPUTS if attrs.with_bn else ()
    names += ("sum",) if attrs.with_sum else ()
    if attrs.quantized:
        names += ("min_data", "max_data", *(("min_sum", "max_sum") if attrs.with_sum else ()))
    return tuple(names)


def _conv_outputs(attrs: Attrs) -> tuple[str, ...]:
    return RANGE_OUTPUTS if attrs.quantized else ("output",)


def _conv_shapes(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    chain = _conv_chain(attrs)
    names = _conv_inputs(attrs)
    main = 2 if chain.main.no_bias else 3
    main_in, main_out = get_op("Convolution").infer_shape(chain.main, list(shapes[:main]))
    filters = (chain.main.num_filter,)
    result = list(main_in)
    for name, shape in zip(names[main:], shapes[main:], strict=True):
        if name in BN_INPUTS:
            result.append(filters)
        elif name == "sum":
            result.append(main_out[0] if shape is None else shape)
        else:
            result.append((1,))
    return result, [main_out[0], *(((1,), (1,)) if attrs.quantized else ())]


def _conv_dtypes(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    chain = _conv_chain(attrs)
    names = _conv_inputs(attrs)
    known = [dtype if dtype is not None else (
        FLOAT32 if name not in ("data", "sum") else None) for name, dtype in zip(names, dtypes)]
    if not attrs.quantized:
        return [dtype or FLOAT32 for dtype in known], [known[0] or FLOAT32]
    last = chain.postsum_act if attrs.with_sum else chain.act
    out = output_dtype(ranges.has_calib(attrs), False, last)
    return known, [out, FLOAT32, FLOAT32]


class _ConvWeights:
    """A node's weights with BatchNorm folded in, and their int8 form for the last data scale
    asked for (a calibrated node's data scale never changes, so a bound node prepares them
    once). ``narrow_weights``: within ±63 (`requantize.NARROW_LIMIT`)."""

    def __init__(self, attrs: Attrs, values: dict[str, Any]) -> None:
        self.chain = _conv_chain(attrs)
        self.narrow = bool(attrs.narrow_weights)
        self.weight, self.bias = fold_batchnorm(
            np.asarray(values["weight"]), values.get("bias"), self.chain,
            [np.asarray(values[name]) for name in BN_INPUTS] if attrs.with_bn else [])
        self._last: tuple[tuple[float, bool], Any] | None = None

    def quantized(self, data_scale: F32, per_channel: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(scales, int8 weights, int32 bias) for data of ``data_scale``."""
        key = (float(data_scale), per_channel)
        if self._last is None or self._last[0] != key:
            scales = weight_scales(self.weight, self.bias, data_scale, per_channel,
                                   self.narrow)
            weight_q, bias_q = quantized_weight_bias(self.weight, self.bias, data_scale, scales,
                                                     self.narrow)
            weight_q.setflags(write=False)  # kept: the int8 GEMM packs it once (`integer`)
            self._last = (key, (scales, weight_q, bias_q))
        return self._last[1]


def _conv_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
    values = dict(zip(_conv_inputs(attrs), inputs, strict=True))
    return _conv_forward(attrs, _ConvWeights(attrs, values), values)


def _conv_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
               workspace: Any = None) -> list[Any]:
    """On the CPU with constant weights (a plan's read-only parameters), BatchNorm is folded
    once at bind and the int8 weights kept for the data scale; otherwise the kernel runs.
    In a plan (``workspace`` given), a quantized node's output read only by quantized
    convolutions (or dequantize) is handed to them channels-last (`handoff`)."""
    names = _conv_inputs(attrs)
    values = dict(zip(names, inputs, strict=True))
    constant = xp is np and all(not np.asarray(values[name]).flags.writeable
                                for name in ("weight", "bias", *BN_INPUTS) if name in values)
    if not constant:
        return [partial(SG_CONV.compute, xp, attrs, inputs, out)]
    weights = _ConvWeights(attrs, values)
    targets = out if isinstance(out, tuple) else (out,)
    fused = _FusedInt8Conv(attrs, weights, values, targets, workspace) \
        if attrs.quantized else None

    def call() -> None:
        if fused is None or not fused.run():
            results = _conv_forward(attrs, weights,
                                    values if fused is None else fused.nchw_values())
            for target, result in zip(targets, results if isinstance(results, tuple)
                                      else (results,), strict=True):
                np.copyto(target, result, casting="unsafe")
        if fused is not None:
            fused.run_follower()

    if fused is not None:
        call.replayable = fused.replayable
    return [call]


def _reads_channels_last(reader: Any) -> bool:
    """Whether ``reader`` (a `workspace.Reader`) can take a `handoff.Handoff`: a calibrated
    quantized convolution of one group reading the array as its data or its residual, or a
    dequantize (`convert`)."""
    if reader.op == DEQUANTIZE_OP and reader.position == 0:
        return True
    if reader.op != CONV or not reader.attrs.quantized or not ranges.has_calib(reader.attrs):
        return False
    main = _conv_chain(reader.attrs).main
    name = _conv_inputs(reader.attrs)[reader.position]
    # a depthwise layer (one filter per group) reads its data either way too
    depthwise = main.num_group > 1 and main.num_group == main.num_filter and name == "data"
    return (len(main.kernel) == 2
            and (main.num_group == 1 and name in ("data", "sum") or depthwise))


handoff.register_reader(CONV, _reads_channels_last)
handoff.register_reader(DEQUANTIZE_OP, _reads_channels_last)


@dataclass(frozen=True)
class _ConvTerms:
    """A quantized node's arithmetic for one data range: the int8 weights and int32 bias,
    the scales taking int32 sums to the output, the post-ops, and the output's dtype and
    range. ``storage`` is the dtype the result saturates to before it is stored as
    ``dtype``."""

    weight_q: np.ndarray
    bias_q: np.ndarray | None
    requantize: np.ndarray
    act: Any
    residual: tuple[np.ndarray, F32] | None
    postsum_act: Any
    dtype: np.dtype
    storage: np.dtype
    calibrated: bool
    out_range: tuple[F32, F32]


def _conv_terms(attrs: Attrs, weights: _ConvWeights, values: dict[str, Any]) -> _ConvTerms:
    chain, weight = weights.chain, weights.weight
    data = np.asarray(values["data"])
    ranges.check_quantized(data, "data", CONV)
    low, high = ranges.scalar(values["min_data"]), ranges.scalar(values["max_data"])
    data_scale = ranges.quantize_scale(data.dtype, low, high)
    calibrated = ranges.has_calib(attrs)
    scales, weight_q, bias_q = weights.quantized(data_scale, calibrated)
    last = chain.postsum_act if attrs.with_sum else chain.act
    dtype = output_dtype(calibrated, False, last)
    if calibrated:
        out_low, out_high = F32(attrs.min_calib_range), F32(attrs.max_calib_range)
        output_scale = ranges.quantize_scale(dtype, out_low, out_high)
        requantize = (F32(output_scale / data_scale) / scales).astype(np.float32)
    else:  # int32 sums as they are, over the range MXNet derives from the two ranges
        out_low, out_high = int32_range(ranges.max_abs(low, high),
                                        ranges.max_abs(weight.min(), weight.max()))
        output_scale = F32(data_scale * scales[0])
        requantize = np.ones_like(scales)
    act = chain.act
    if act is not None and act.kind == "bounded_relu" and not attrs.with_sum:
        act = None  # MXNet lets the uint8 saturation cut relu6 off (max_calib_range <= 6)
    elif act is not None and act.kind == "bounded_relu":
        act = type(act)(act.kind, float(F32(act.alpha) * output_scale))
    elif act is not None and act.kind != "relu":
        raise ModelFormatError(f"{CONV}: a quantized convolution fuses relu or clip; "
                               f"got {act.kind}")
    residual = None
    if attrs.with_sum:
        summand = np.asarray(values["sum"])
        ranges.check_quantized(summand, "sum", CONV)
        sum_scale = ranges.quantize_scale(summand.dtype, ranges.scalar(values["min_sum"]),
                                          ranges.scalar(values["max_sum"]))
        residual = (summand, F32(output_scale / sum_scale))
    # An int8 residual under a uint8 output: oneDNN writes the sum into the residual's int8
    # buffer, so the result saturates at 127 before MXNet reads the bytes as uint8 (unless
    # the node says it sums out of place, as our rewrite's nodes do).
    storage = INT8 if dtype == UINT8 and residual is not None and residual[0].dtype == INT8 \
        and not attrs.out_of_place_sum else dtype
    return _ConvTerms(weight_q, bias_q, requantize, act, residual, chain.postsum_act, dtype,
                      storage, calibrated, (out_low, out_high))


class _FusedInt8Conv:
    """A bound quantized node run by `int8_conv.FusedConv` (compiled passes, on the spin
    pool), or `int8_depthwise.FusedDepthwise` for one filter per channel, where its terms
    allow: calibrated int8/uint8 output, 2-d, relu or clip around the sum. ``run`` answers
    False where they do not, and the NumPy path runs."""

    def __init__(self, attrs: Attrs, weights: _ConvWeights, values: dict[str, Any],
                 targets: tuple[np.ndarray, ...], workspace: Any = None) -> None:
        self.attrs, self.weights, self.values, self.targets = attrs, weights, values, targets
        main = weights.chain.main
        ndim = len(main.kernel)
        self.handoffs = self._find_handoffs(workspace)
        self.geometry = int8_conv.Geometry(main.kernel, main.stride or (1,) * ndim,
                                           main.dilate or (1,) * ndim, main.pad or (0,) * ndim)
        # the range inputs as views of their buffers: read at each run, in a microsecond
        self.range_values = [np.asarray(values[name]).reshape(-1) for name in (
            "min_data", "max_data", "min_sum", "max_sum") if name in values]
        # ... and as memoryviews, whose items read without NumPy's indexing (`_state`)
        self._range_views = [memoryview(value) for value in self.range_values]
        self._key: Any = None
        # (`_state` of the last fused run, what that run did): `run`'s steady path
        self._steady: tuple[Any, ...] | None = None
        self._ran_steady = False  # whether the last run took that path
        self._last_run: tuple[Any, ...] = ()  # what `_decide_and_run` last did: `run`'s
        # the hand-offs `_state` reads, found once
        self._watched = tuple(self.handoffs.get(name) for name in ("data", "sum", "out"))
        self._plan: tuple[Any, ...] | None = None  # (make, Epilogue, low, high) or None
        self._convs: dict[int8_conv.Layouts | None, Any] = {}  # by the layouts they take
        self._weight_q: np.ndarray | None = None
        self._storage: np.dtype | None = None  # the dtype the output saturates to
        # (Epilogue, Rescale, the Epilogue with its second output), `_rescaled_epilogue`'s
        self._rescaled: tuple[Any, ...] | None = None
        self._clear_of: tuple[Any, ...] | None = None  # (Rescale, conv, `_clear`'s answer)
        # where its weights are packed and its scratch lies: said now, packed at the first run
        self.memory = int8_memory.of(workspace)
        # ranges that never change (all calibrated): a steady run may be replayed
        self._constant_ranges = ranges.constant_here(workspace)
        self.memory.expect(int8_memory.packed_bytes(values["weight"].shape))
        depthwise = main.num_group > 1 and main.num_group == main.num_filter
        if int8_conv.supported_here() or (depthwise and int8_depthwise.available()):
            spin_pool.expect_split_jobs()  # made at the first run, once the weights are

    def _find_handoffs(self, workspace: Any) -> dict[str, handoff.Handoff]:
        """The hand-offs by input name (data, sum), taken from the writers of the inputs, and
        "out": the output's, offered where all its readers can take it."""
        found = {name: handoff.take(workspace, self.values[name])
                 for name in ("data", "sum") if name in self.values}
        handoffs = {name: offered for name, offered in found.items() if offered is not None}
        main = self.weights.chain.main
        one_filter_a_group = main.num_group == 1 or main.num_group == main.num_filter
        if workspace is not None and ranges.has_calib(self.attrs) and one_filter_a_group \
                and len(main.kernel) == 2:
            # a dequantize alone would transpose the bytes instead of this node: no gain
            offered = handoff.offer(workspace, self.targets[0])
            if offered is not None:
                offered.runs_follower = True  # `run_follower`
                handoffs["out"] = offered
        return handoffs

    def run(self) -> bool:
        """Compute the node on the compiled path; False where it cannot (the NumPy path
        runs). A run that finds what the last fused run decided on unchanged (`_state`) on
        the same thread repeats that run's jobs and bookkeeping without deciding again: in
        a plan's run, every NumPy call and object a step touches has been evicted from
        cache by the layers between (ResNet-18 int8 at batch 1, one thread: deciding cost
        about 20 µs a convolution)."""
        steady = self._steady
        self._ran_steady = steady is not None and steady[0] == self._state()
        if self._ran_steady:
            _, jobs, out, laid_out, rescale, written, paths, writers = steady
            for job in jobs:
                job()
            if out is not None:
                out.laid = laid_out
                if rescale is not None:
                    rescale.written = written
            for path in paths:
                integer.PATHS[path] += 1
            for write in writers:
                write()
            return True
        self._steady = None
        state = self._state()
        if not self._decide_and_run():
            return False
        conv, epilogue, rescale, written, laid_out, writers = self._last_run
        jobs = conv.jobs_for(epilogue) if isinstance(conv, int8_conv.EpilogueLayer) else (
            partial(conv, epilogue),)
        out = self.handoffs.get("out")
        paths = ("int8_fused_conv",) + (("int8_channels_last_handoff",) if laid_out else ()) \
            + ((_rescaled_path(conv),) if rescale is not None else ())
        self._steady = (state, jobs, out, laid_out, None if out is None else out.rescale,
                        written, paths, writers)
        return True

    def replayable(self) -> bool:
        """Whether its last run took the steady path as jobs alone (its products, its range
        writes, the follower's pass) in a plan whose ranges never change: what decides its
        run is then the same at every run of one thread (`steady_walk`). Not a run that
        decided (its ranges written by NumPy): runs from threads in turn decide each time."""
        steady = self._steady
        if steady is None or not self._ran_steady or not self._constant_ranges:
            return False
        _, jobs, out, _, _, _, _, writers = steady
        rescale = None if out is None else out.rescale
        follow = None if rescale is None else rescale.follow
        return steady_walk.all_replayable(*jobs, *writers, follow)

    def _state(self) -> tuple[Any, ...]:
        """What `_decide_and_run`'s choices depend on from one run to the next: the range
        inputs' values, the compiled paths' switch, the layouts the inputs' writers laid,
        whether the output's readers take it channels-last (and its rescale), and the
        thread (a layer's jobs are bound per thread)."""
        data, residual, out = self._watched
        rescale = None if out is None else out.rescale
        return (tuple([view[0] for view in self._range_views]), integer.fast_path_enabled(),
                get_ident(), data is not None and data.laid,
                residual is not None and residual.laid,
                out is not None and out.takers == out.readers, rescale,
                rescale is not None and rescale.out_handoff.taken)

    def _decide_and_run(self) -> bool:
        out = self.handoffs.get("out")
        rescale = None
        if out is not None:
            out.laid = False  # unless it runs fused below
            rescale = out.rescale
            if rescale is not None:
                rescale.written = None  # unless the product writes it below
            if not out.taken:
                out = None
        if not integer.fast_path_enabled():
            return False
        key = tuple(float(value[0]) for value in self.range_values)
        if key != self._key:
            self._plan = self._prepare()
            self._key = key
        if self._plan is None:
            return False
        make, epilogue, low, high = self._plan
        laid = None
        if make is not None:  # each array as its hand-off has it
            data, residual = self.handoffs.get("data"), self.handoffs.get("sum")
            laid = int8_conv.Layouts(data=data is not None and data.laid, out=out is not None,
                                     residual=residual is not None and residual.laid)
        conv = self._convs.get(laid)
        if conv is None:
            conv = self._convs[laid] = make(laid)
        if out is not None and rescale is not None and rescale.out_handoff.taken and \
                rescale.out.dtype == UINT8 and \
                getattr(conv, "writes_rescaled", False) and \
                self.targets[0].dtype == self._storage and self._clear(rescale, conv):
            epilogue = self._rescaled_epilogue(epilogue, rescale, low, high)
        else:
            rescale = None
        conv(epilogue)
        if rescale is not None:
            rescale.written = (float(low[0]), float(high[0]))
            integer.PATHS[_rescaled_path(conv)] += 1
        if out is not None:
            out.laid = True
            integer.PATHS["int8_channels_last_handoff"] += 1
        integer.PATHS["int8_fused_conv"] += 1
        np.copyto(self.targets[1], low)
        np.copyto(self.targets[2], high)
        written = None if out is None or out.rescale is None else out.rescale.written
        self._last_run = (conv, epilogue, rescale, written, out is not None,
                      (ranges.constant_writer(self.targets[1], low),
                       ranges.constant_writer(self.targets[2], high)))
        return True

    def run_follower(self) -> None:
        """The step of the reader bound right after this node whose rescaled output this
        node may write (`handoff.Rescale.follow`), where that reader binds none of its own:
        its bookkeeping where this run wrote the output, else its pass."""
        out = self.handoffs.get("out")
        rescale = None if out is None else out.rescale
        if rescale is not None and rescale.follow is not None:
            rescale.follow()

    def _clear(self, rescale: handoff.Rescale, conv: Any) -> bool:
        """Whether the product may write ``rescale``'s output while it reads this node's
        inputs (checked once per layout): the plan may give that output the buffer of an
        input whose last reader this node is (ResNet v2: the residual, the sum before).
        It may be the residual's own bytes (each residual byte is read just before the
        second output's byte in its place is written, by the same lane), or the data's
        where the product reads a copy of them made first; any other overlap refuses."""
        if self._clear_of is None or self._clear_of[0] is not rescale or \
                self._clear_of[1] is not conv:
            self._clear_of = (rescale, conv, all(
                self._may_share(name, np.asarray(value), rescale.out, conv)
                for name, value in self.values.items()))
        return self._clear_of[2]

    @staticmethod
    def _may_share(name: str, value: np.ndarray, out: np.ndarray, conv: Any) -> bool:
        """Whether the second output ``out`` may lie where input ``name`` (``value``) does,
        for the product ``conv`` (`_clear`): apart, the residual's own bytes exactly, or data
        the product copies first."""
        if not np.may_share_memory(out, value):
            return True
        if name == "sum":
            return value.ctypes.data == out.ctypes.data and value.nbytes == out.nbytes
        return name == "data" and not conv.reads_data_in_place

    def _rescaled_epilogue(self, epilogue: int8_conv.Epilogue, rescale: handoff.Rescale,
                           low: np.ndarray, high: np.ndarray) -> int8_conv.Epilogue:
        """``epilogue`` with the reader's rescaled output (`handoff.Rescale`) as its second
        output, its terms for this node's output range; made once per epilogue."""
        made = self._rescaled
        if made is None or made[0] is not epilogue or made[1] is not rescale:
            scale, shift = rescale.terms(low, high)
            second = int8_conv.Rescaled(rescale.out, np.asarray(scale, np.float32),
                                        np.asarray(shift, np.float32))
            made = self._rescaled = (epilogue, rescale,
                                     dataclasses.replace(epilogue, rescaled=second))
        return made[2]

    def nchw_values(self) -> dict[str, Any]:
        """The node's inputs for the NumPy path: data and residual handed over channels-last
        turned back to NCHW."""
        values = dict(self.values)
        for name in ("data", "sum"):
            handoff = self.handoffs.get(name)
            if handoff is not None and handoff.laid:
                array = np.asarray(values[name])
                batch, channels, height, width = array.shape
                values[name] = array.reshape(batch, height, width, channels).transpose(
                    0, 3, 1, 2)
        return values

    def _prepare(self) -> tuple[Any, ...] | None:
        terms = _conv_terms(self.attrs, self.weights, self.values)
        data, out = np.asarray(self.values["data"]), self.targets[0]
        groups = self.weights.chain.main.num_group
        residual = None if terms.residual is None else terms.residual[0]
        kinds = int8_conv.ACTIVATIONS
        if not (terms.calibrated and terms.storage in (INT8, UINT8) and out.dtype == terms.dtype
                and (terms.act is None or terms.act.kind in kinds)
                and (terms.postsum_act is None or terms.postsum_act.kind in kinds)
                and len(self.geometry.kernel) == 2 and out.flags.c_contiguous
                and data.flags.c_contiguous
                and (residual is None or residual.flags.c_contiguous)
                and (int8_conv.supported(data, terms.weight_q, self.geometry, groups)
                     or int8_depthwise.supported(data, terms.weight_q, groups))):
            return None
        if self._weight_q is not terms.weight_q:
            self._convs.clear()
            self._weight_q = terms.weight_q
        weight_q, geometry = terms.weight_q, self.geometry
        make = None
        if groups > 1:
            def make(laid: int8_conv.Layouts) -> int8_depthwise.FusedDepthwise:
                return int8_depthwise.FusedDepthwise(data, weight_q, geometry, out, residual,
                                                     laid, self.memory.huge_pages)
        else:
            rows = data.shape[0] * math.prod(out.shape[2:])
            packed = integer.packed_weights(weight_q, rows, ("channels_last", 0),
                                            lambda: int8_conv.weight_matrix(weight_q),
                                            int8_conv.AMX_MIN_DEPTH, self.memory.empty)
            if int8_conv.has_tap_rows(data.shape[1], geometry, out.shape[3]):
                # a stem's kernel rows (or a 1×1 kernel's few channels), each group of
                # `stacked_rows` one step of the direct product's K: 64 a group, AMX's
                # whole step, however short the layer's own K (min_depth 0)
                stack = int8_conv.stacked_rows(data.shape[1], geometry, out.shape[3])
                taps = integer.packed_weights(
                    weight_q, rows, ("tap_rows", stack),
                    lambda: int8_conv.tap_rows_matrix(weight_q, stack), 0, self.memory.empty)
                packed = taps if taps.amx else packed
            run = int8_conv.run_bytes(data.shape[1], geometry)
            if run is not None and not packed.amx and gemm_int8.table_runs(packed):
                # kernel rows of runs not in whole groups (a stem's 7 × 3 channels), read
                # where they lie as runs padded to whole groups (`int8_conv.run_matrix`)
                # rather than gathered
                packed = integer.packed_weights(
                    weight_q, rows, ("runs", run),
                    lambda: int8_conv.run_matrix(weight_q, run), int8_conv.AMX_MIN_DEPTH,
                    self.memory.empty)

            def make(laid: int8_conv.Layouts) -> int8_conv.FusedConv:
                return int8_conv.FusedConv(data, weight_q, packed, geometry, out, residual,
                                           laid, self.memory.huge_pages)
        filters = terms.weight_q.shape[0]
        self._storage = terms.storage
        limits = np.iinfo(terms.storage)
        epilogue = int8_conv.Epilogue(
            bias=np.zeros(filters, np.int32) if terms.bias_q is None else terms.bias_q,
            scales=terms.requantize,
            act=None if terms.act is None else terms.act.kind,
            act_high=0.0 if terms.act is None else float(np.float32(terms.act.alpha)),
            residual_scale=0.0 if terms.residual is None else float(terms.residual[1]),
            postsum_act=None if terms.postsum_act is None else terms.postsum_act.kind,
            postsum_high=0.0 if terms.postsum_act is None else float(
                np.float32(terms.postsum_act.alpha)),
            low=int(limits.min), high=int(limits.max))
        low, high = ranges.range_pair(*terms.out_range)
        return make, epilogue, low, high


def _rescaled_path(conv: int8_conv.FusedConv) -> str:
    """The `integer.PATHS` name of a run whose layer wrote its reader's rescaled output: in
    the direct product's epilogue, or in `int8_requantize_ir`'s pass."""
    return "int8_rescaled_in_product" if conv.requantizes_in_product else \
        "int8_rescaled_in_requantize"


def _conv_forward(attrs: Attrs, weights: _ConvWeights, values: dict[str, Any]) -> Any:
    if not attrs.quantized:
        return _float_conv(weights.chain, values, weights.weight, weights.bias)
    terms = _conv_terms(attrs, weights, values)
    sums = _conv_sums(weights.chain, np.asarray(values["data"]), terms.weight_q, terms.bias_q)
    result = finish(sums, terms.requantize, 1, terms.storage, terms.act, terms.residual,
                    terms.postsum_act)
    return (result.astype(terms.dtype), *ranges.range_pair(*terms.out_range))


def _conv_sums(chain: FusedChain, data: np.ndarray, weight_q: np.ndarray,
               bias_q: np.ndarray | None) -> np.ndarray:
    main = chain.main
    ndim = len(main.kernel)
    stride = main.stride or (1,) * ndim
    dilate = main.dilate or (1,) * ndim
    pad = main.pad or (0,) * ndim
    sums = integer.conv(data, weight_q, main.kernel, stride, dilate, pad, main.num_group)
    if bias_q is not None:
        sums += bias_q.astype(np.float64).reshape((1, -1) + (1,) * ndim)
    return sums


def _float_conv(chain: FusedChain, values: dict[str, Any], weight: np.ndarray,
                bias: np.ndarray | None) -> np.ndarray:
    """The float fused convolution (an export made with ``optimize_for('MKLDNN')``)."""
    main = chain.main
    ndim = len(main.kernel)
    sums = integer.conv(values["data"], weight, main.kernel, main.stride or (1,) * ndim,
                        main.dilate or (1,) * ndim, main.pad or (0,) * ndim, main.num_group)
    result = sums.astype(np.float32)
    if bias is not None:
        result += bias.reshape((1, -1) + (1,) * ndim)
    if chain.act is not None:
        result = chain.act.apply(result)
    if "sum" in values:
        result = result + np.asarray(values["sum"], dtype=np.float32)
    if chain.postsum_act is not None:
        result = chain.postsum_act.apply(result)
    return result.astype(np.float32)


SG_CONV = register(OpDef(
    name=CONV,
    params=CONV_PARAMS,
    inputs=_conv_inputs,
    outputs=_conv_outputs,
    infer_shape=_conv_shapes,
    infer_dtype=_conv_dtypes,
    kernel=ranges.on_host(_conv_kernel),
    bind=_conv_bind,
    # a quantized residual product may write its output's reader's rescaled bytes
    # (`handoff.Rescale`) while its tiles still read the data in place
    writes_ahead=lambda attrs: bool(attrs.quantized and attrs.with_sum),
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="oneDNN's fused Convolution (+ BatchNorm, activation, residual sum, activation); "
        "int8/uint8 in and out when quantized.",
))


def _fc_inputs(attrs: Attrs) -> tuple[str, ...]:
    chain = _fc_chain(attrs)
    names = ["data", "weight", *(() if chain.main.no_bias else ("bias",))]
    if attrs.quantized:
        names += ("min_data", "max_data")
        if not attrs.channel_wise_quantize:
            names += ("min_weight", "max_weight")
            names += () if chain.main.no_bias else ("min_bias", "max_bias")
    return tuple(names)


def _fc_outputs(attrs: Attrs) -> tuple[str, ...]:
    return RANGE_OUTPUTS if attrs.quantized and not attrs.enable_float_output else ("output",)


def _fc_shapes(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    chain = _fc_chain(attrs)
    main = 2 if chain.main.no_bias else 3
    main_in, main_out = get_op("FullyConnected").infer_shape(chain.main, list(shapes[:main]))
    rest = [(1,)] * (len(shapes) - main)
    return [*main_in, *rest], [main_out[0], *((1,), (1,))[:len(_fc_outputs(attrs)) - 1]]


def _fc_dtypes(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    if not attrs.quantized:
        known = [dtype or FLOAT32 for dtype in dtypes]
        return known, [known[0]]
    chain = _fc_chain(attrs)
    out = output_dtype(ranges.has_calib(attrs), attrs.enable_float_output, chain.act)
    names = _fc_inputs(attrs)
    known = [dtype if dtype is not None or name == "data" else (
        FLOAT32 if name.startswith(("min", "max")) or attrs.channel_wise_quantize else INT8)
        for name, dtype in zip(names, dtypes)]
    return known, [out, FLOAT32, FLOAT32][:len(_fc_outputs(attrs))]


class _FcWeights:
    """A node's int8 weights, int32 bias, scales and reach (`_fc_weights`) for the last data
    scale asked for: a bound node with constant weights quantizes them once, not per run
    (ResNet-18's last layer: 512 × 1000 weights scaled and rounded each time)."""

    def __init__(self, attrs: Attrs, values: dict[str, Any]) -> None:
        self.attrs, self.values = attrs, values
        self._last: tuple[float, Any] | None = None

    def __call__(self, data_scale: F32) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, F32]:
        if self._last is None or self._last[0] != float(data_scale):
            weight_q, bias_q, scales, reach = _fc_weights(self.attrs, self.values, data_scale)
            if weight_q.flags.writeable:
                weight_q = weight_q.copy() if weight_q.base is not None else weight_q
                weight_q.setflags(write=False)  # kept: the int8 GEMM packs it once
            self._last = (float(data_scale), (weight_q, bias_q, scales, reach))
        return self._last[1]


def _fc_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
    values = dict(zip(_fc_inputs(attrs), inputs, strict=True))
    return _fc_forward(attrs, values, partial(_fc_weights, attrs, values))


def _fc_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
             workspace: Any = None) -> list[Any]:
    """On the CPU with constant weights and bias (a plan's read-only parameters) the int8
    weights are made once per data scale, and their product runs on the int8 GEMM's kernel
    into buffers kept between runs (`_BoundFc`), its weights packed where the plan's are
    (`int8_memory`); otherwise the kernel runs."""
    values = dict(zip(_fc_inputs(attrs), inputs, strict=True))
    constant = xp is np and attrs.quantized and all(
        not np.asarray(values[name]).flags.writeable for name in ("weight", "bias")
        if name in values)
    if not constant:
        return [partial(SG_FC.compute, xp, attrs, inputs, out)]
    return [_BoundFc(attrs, values, out if isinstance(out, tuple) else (out,),
                     int8_memory.of(workspace))]


class _BoundFc:
    """A bound quantized fully connected layer. Where its data are int8/uint8 rows and the
    int8 GEMM is here, the product runs as `gemm_int8.product_job`'s job over the cores,
    the weights packed once per data scale and the rows' and sums' buffers kept, and the
    int32 sums plus the bias are made exactly in int64, where `integer.matmul` would go
    through float64 (the same integers):
    ResNet-18's classifier at batch 1 spent more on the calls around its product than on
    it. Otherwise the NumPy path (`_fc_forward`) runs."""

    def __init__(self, attrs: Attrs, values: dict[str, Any],
                 targets: tuple[np.ndarray, ...], memory: int8_memory.PlanMemory) -> None:
        self.attrs, self.values, self.targets = attrs, values, targets
        self.chain = _fc_chain(attrs)  # read once: the subgraph's walk costs microseconds
        self.weights = _FcWeights(attrs, values)
        self.memory = memory  # where its weights are packed: said now, packed at a run
        memory.expect(int8_memory.packed_bytes(values["weight"].shape))
        # (weight_q, PackedWeights, rows, bias, a float32 output's factors or None, whether
        # the rows are signed, the kernel's column offsets with the bias or None, the
        # product's job, its sums)
        self._packed: tuple[Any, ...] | None = None
        # the data's range as memoryviews (items read without NumPy's indexing), and
        # (`_state`, the float32 output's run) once a run took it: `__call__`'s steady path
        self._range_views = [memoryview(np.asarray(values[name]).reshape(-1))
                             for name in ("min_data", "max_data") if name in values]
        self._steady: tuple[Any, ...] | None = None

    def _state(self) -> tuple[Any, ...]:
        return tuple([view[0] for view in self._range_views]), integer.fast_path_enabled()

    def __call__(self) -> None:
        """The layer into its targets. A float32 output whose data range and switch are
        the last run's repeats that run's passes without deciding them again (a plan's
        classifier spends more on NumPy's calls around its product than on it, each
        about 5 µs with their code evicted by the layers before)."""
        steady = self._steady
        if steady is not None and steady[0] == self._state():
            steady[1]()
            return
        self._steady = None
        data = np.asarray(self.values["data"])
        main = self.chain.main
        rows = data.reshape(data.shape[0], -1) if main.flatten else \
            data.reshape(-1, data.shape[-1])
        sums = self._sums(rows) if integer.fast_path_enabled() and \
            rows.dtype in (UINT8, INT8) and gemm_int8.available() else None
        if sums is not None and self._packed[4] is not None:
            # float32 out without an activation: `_fc_forward`'s `finish`, its scales made
            # once per data range, written straight into the output
            np.multiply(sums.astype(np.float32), self._packed[4],
                        out=self.targets[0].reshape(sums.shape))
            if self._packed[6] is not None:  # the kernel adds the bias: sums are its own
                self._steady = (self._state(), self._float_run(rows))
            return
        results = _fc_forward(self.attrs, self.values, self.weights, self.chain, sums)
        for target, result in zip(self.targets, results if isinstance(results, tuple)
                                  else (results,), strict=True):
            np.copyto(target, result, casting="unsafe")

    def _float_run(self, rows: np.ndarray) -> Any:
        """`__call__`'s float32 output path with its choices made: the rows into the
        product's buffer, the product (the bias added by the kernel), the scales."""
        _, packed, padded, _, factors, signed, _, job, product = self._packed
        block = padded[:len(rows), :packed.k]
        out = self.targets[0].reshape(product.shape)
        converted = np.empty(product.shape, np.float32)

        def run() -> None:
            if signed:
                np.bitwise_xor(rows.view(UINT8), np.uint8(0x80), out=block)
            else:
                np.copyto(block, rows)
            job()
            integer.PATHS["int8_gemm"] += 1
            np.copyto(converted, product, casting="unsafe")
            np.multiply(converted, factors, out=out)

        return run

    def _sums(self, rows: np.ndarray) -> np.ndarray | None:
        """The exact sums ``rows @ weight_q.T + bias_q`` as int64, or None where the depth
        passes the GEMM's exact reach."""
        low, high = ranges.scalar(self.values["min_data"]), ranges.scalar(
            self.values["max_data"])
        data_scale = ranges.quantize_scale(rows.dtype, low, high)
        weight_q, bias_q, scales, _ = self.weights(data_scale)
        if weight_q.shape[1] > gemm_int8.EXACT_DEPTH:
            return None
        signed = rows.dtype == INT8
        if self._packed is None or self._packed[0] is not weight_q or \
                self._packed[5] != signed:
            packed = integer.packed_weights(weight_q.T, len(rows), empty=self.memory.empty)
            bias = np.zeros(weight_q.shape[0], np.int64) if bias_q is None else \
                bias_q.astype(np.int64)
            plain_float = self.attrs.enable_float_output and self.chain.act is None and \
                self.targets[0].dtype == FLOAT32 and self.targets[0].flags.c_contiguous
            factors = (F32(F32(1.0) / data_scale) / scales).astype(np.float32) \
                if plain_float else None
            padded = gemm_int8.padded_rows(len(rows), packed)
            offsets = _bias_offsets(packed, bias, signed)
            columns = packed.panels * packed.vectors * gemm_int8.LANES
            sums = np.empty((len(padded), columns), np.int32)
            # a job of parts, each streaming its own panels of the weights: on every core a
            # classifier at batch 1 reads its weights from memory on both
            job = gemm_int8.product_job(padded, len(rows), packed, signed, sums, offsets)
            self._packed = (weight_q, packed, padded, bias, factors, signed, offsets, job,
                            sums[:len(rows), :packed.n])
        _, packed, padded, bias, _, _, offsets, job, product = self._packed
        if signed:  # + 128: the top bit flipped, as `gemm_int8.multiply` does
            np.bitwise_xor(rows.view(UINT8), np.uint8(0x80), out=padded[:len(rows), :packed.k])
        else:
            padded[:len(rows), :packed.k] = rows
        job()
        integer.PATHS["int8_gemm"] += 1
        if offsets is not None:  # the bias added by the kernel, exactly (int32 holds it)
            return product
        return np.add(product, bias, dtype=np.int64)


def _bias_offsets(packed: gemm_int8.PackedWeights, bias: np.ndarray, signed: bool
                  ) -> np.ndarray | None:
    """The kernel's column offsets with ``bias`` added, where every sum plus its bias fits
    int32 (the kernel adds them as it stores, where NumPy's int64 add after it took a
    classifier at batch 1 about a tenth of its time); None where one may not."""
    if not int8_conv.sums_fit_int32(packed.k, bias):
        return None
    offsets = (packed.signed_offsets if signed else packed.no_offsets).astype(np.int64)
    offsets[:len(bias)] += bias
    return offsets.astype(np.int32)


def _fc_forward(attrs: Attrs, values: dict[str, Any], weights: Any,
                chain: FusedChain | None = None, sums: np.ndarray | None = None) -> Any:
    """The layer's outputs; ``sums``: the exact sums with the bias added, where the caller
    made them (`_BoundFc`)."""
    chain = chain or _fc_chain(attrs)
    data = np.asarray(values["data"])
    main = chain.main
    rows = data.reshape(data.shape[0], -1) if main.flatten else data.reshape(-1, data.shape[-1])
    out_shape = (data.shape[0], main.num_hidden) if main.flatten else (
        *data.shape[:-1], main.num_hidden)
    if not attrs.quantized:
        return _float_fc(chain, rows, values).reshape(out_shape)
    ranges.check_quantized(data, "data", FC)
    low, high = ranges.scalar(values["min_data"]), ranges.scalar(values["max_data"])
    data_scale = ranges.quantize_scale(data.dtype, low, high)
    weight_q, bias_q, scales, weight_reach = weights(data_scale)
    if sums is None:
        sums = integer.matmul(rows, weight_q.T)
        if bias_q is not None:
            sums += bias_q.astype(np.float64)
    dtype = output_dtype(ranges.has_calib(attrs), attrs.enable_float_output, chain.act)
    if attrs.enable_float_output:
        result = finish(sums, (F32(F32(1.0) / data_scale) / scales).astype(np.float32), 1,
                        dtype, chain.act)
        return result.reshape(out_shape)
    if not ranges.has_calib(attrs):
        out_low, out_high = int32_range(ranges.max_abs(low, high), weight_reach)
        return (ranges.saturate_round(sums, np.dtype(np.int32)).reshape(out_shape),
                *ranges.range_pair(out_low, out_high))
    out_low, out_high = F32(attrs.min_calib_range), F32(attrs.max_calib_range)
    output_scale = ranges.quantize_scale(dtype, out_low, out_high)
    if chain.act is not None:  # the activation sees real values, then scales to the output
        result = finish(sums, (F32(F32(1.0) / data_scale) / scales).astype(np.float32), 1,
                        dtype, chain.act, act_scale=output_scale)
    else:
        result = finish(sums, (F32(output_scale / data_scale) / scales).astype(np.float32), 1,
                        dtype)
    return (result.reshape(out_shape), *ranges.range_pair(out_low, out_high))


def _fc_weights(attrs: Attrs, values: dict[str, Any], data_scale: F32
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, F32]:
    """int8 weights, int32 bias, the weights' scales (one per output row) and their reach."""
    weight = np.asarray(values["weight"])
    bias = values.get("bias")
    if attrs.channel_wise_quantize or weight.dtype == FLOAT32:
        weight = weight.astype(np.float32)
        bias = None if bias is None else np.asarray(bias, dtype=np.float32)
        scales = weight_scales(weight, bias, data_scale, True)
        weight_q, bias_q = quantized_weight_bias(weight, bias, data_scale, scales)
        return weight_q, bias_q, scales, ranges.max_abs(weight.min(), weight.max())
    ranges.check_quantized(weight, "weight", FC, (INT8,))
    weight_low, weight_high = ranges.scalar(values["min_weight"]), ranges.scalar(
        values["max_weight"])
    weight_reach = ranges.max_abs(weight_low, weight_high)
    weight_scale = ranges.quantize_scale(INT8, weight_low, weight_high)
    if bias is None:
        return weight, None, np.full(weight.shape[0], weight_scale, dtype=np.float32), \
            weight_reach
    bias = np.asarray(bias)
    ranges.check_quantized(bias, "bias", FC, (INT8,))
    bias_low, bias_high = ranges.scalar(values["min_bias"]), ranges.scalar(values["max_bias"])
    bias_scale = ranges.quantize_scale(INT8, bias_low, bias_high)
    rescale = F32(F32(data_scale * weight_scale) / bias_scale)
    most = F32(F32(F32(2 ** 31 - 1) / F32(2)) / ranges.max_abs(bias_low, bias_high) / bias_scale)
    if rescale > most:  # MXNet keeps the int32 bias under INT_MAX / 2 by shrinking the weights
        weight_rescale = F32(F32(F32(most * bias_scale) / data_scale) / weight_scale)
        weight = _round_away(weight.astype(np.float32) * weight_rescale).astype(INT8)
        weight_scale = F32(weight_scale * weight_rescale)
        rescale = most
    bias_q = _round_away(bias.astype(np.float32) * rescale).astype(np.int32)
    return weight, bias_q, np.full(weight.shape[0], weight_scale, dtype=np.float32), weight_reach


def _round_away(values: np.ndarray) -> np.ndarray:
    """Halves away from zero, as C's ``std::round`` (MXNet's own loops use it)."""
    return np.sign(values) * np.floor(np.abs(values) + F32(0.5))


def _float_fc(chain: FusedChain, rows: np.ndarray, values: dict[str, Any]) -> np.ndarray:
    """The float fused layer (an export made with ``optimize_for('MKLDNN')``)."""
    result = np.matmul(rows.astype(np.float32), np.asarray(values["weight"], np.float32).T)
    if "bias" in values:
        result = result + np.asarray(values["bias"], dtype=np.float32)
    return (chain.act.apply(result) if chain.act is not None else result).astype(np.float32)


SG_FC = register(OpDef(
    name=FC,
    params=FC_PARAMS,
    inputs=_fc_inputs,
    outputs=_fc_outputs,
    infer_shape=_fc_shapes,
    infer_dtype=_fc_dtypes,
    kernel=ranges.on_host(_fc_kernel),
    bind=_fc_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="oneDNN's fused FullyConnected (+ activation); int8/uint8 in, int8/uint8, int32 or "
        "float32 out when quantized.",
))
