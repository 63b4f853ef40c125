"""The load-time check of a reduced-precision model against float32.

A model whose config asks for a precision other than fp32 runs ``samples`` seeded random rows
along each input's batch axis (an unbatched model, max_batch_size 0, its sample) (standard
normal for float inputs, zeros for integer and boolean ones, whose valid values the
server cannot know) through its compiled plans and through the float32 reference interpreter
(`Model.reference`), and compares each output (an int8 model calibrated on an uploaded
calibration.npz runs the first ``samples`` rows of it instead, `engine.serving.calibration`):

- by relative error: the largest absolute difference over the largest magnitude of the
  float32 output;
- an output of one row of two or more scores per input row also by top-1 agreement: the share
  of rows whose highest score is the same class in both.

The record goes into the version's checks (``precision``). A classifier's output (one the
config gives class labels, or a ``softmax`` or ``topk`` postprocess) agreeing on fewer rows
than ``precision_check.min_top1_agreement``, or any other output past
``max_relative_error``, refuses the model: a classifier's scores may move while its classes
stay, and another 2-D output's largest entry (a concatenation's) says nothing. A model that
runs in fp32 all the same (the host has no bf16 path, or a float32 model no int8 kernels)
records that and why, and is not compared. An int8 model's record says how its weights were
quantized (``weights``): within ±127, or within ±63 in the convolutions where the host's int8
GEMM multiplies such weights faster (AVX2 without VNNI, `engine.quantize.rewrite`), which the
comparison then measures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.runtime.precision import fp32_because
from engine.serving.config import ModelConfig, TensorConfig
from engine.serving.errors import InvalidModel

SEED = 0


def check_precision(model: Any, config: ModelConfig, inputs: Sequence[TensorConfig],
                    sample: Mapping[str, tuple[int, ...]] | None,
                    where: str, calibrated: Any = None) -> dict[str, Any] | None:
    """The record of the check for a model whose config asks for a reduced precision (None
    for fp32, or a model without the reference interpreter); inputs by graph name, as
    ``sample``. An int8 model's ``calibrated`` (`engine.serving.calibration.Calibrated`):
    its record joins this one, and where its inputs came from the upload, the check runs on
    their first ``samples`` rows instead of random ones.

    Raises:
        InvalidModel: an output drifts past the config's `PrecisionCheck` thresholds.
    """
    if config.precision == "fp32" or not hasattr(model, "reference"):
        return None
    running = getattr(model, "precision", config.precision)
    record: dict[str, Any] = {"asked": config.precision, "running": running}
    if running == "fp32":  # nothing to compare, and for int8 nothing calibrated
        because = fp32_because(config.precision) or f"this host has no {config.precision} path"
        return {**record, "ran": False, "reason": f"{because}: the model runs in fp32"}
    if calibrated is not None:
        record["calibration"] = calibrated.record
    if running == "int8" and hasattr(model, "run_graph"):
        record["weights"] = int8_weights(model.run_graph)
    uploaded = calibrated is not None and calibrated.record["source"] != "random sample inputs"
    if sample is None and not uploaded:
        return {**record, "ran": False, "reason": "no input shape known to fit the graph"}
    # A batched model runs `samples` rows along each input's batch axis; an unbatched one
    # (max_batch_size 0), or one that refuses them, its sample as it is.
    rows: int | None = config.precision_check.samples if config.max_batch_size > 0 else None
    try:
        if uploaded:  # the upload's own inputs, a few rows of them
            feed = {name: array[:config.precision_check.samples]
                    for name, array in calibrated.feed.items()}
            rows = None if rows is None else next(iter(feed.values())).shape[0]
            reduced = model.infer(feed)
        else:
            feed, reduced, rows = _run_random(model, inputs, sample, rows)
        reference = model.reference(feed)
    except Exception as error:  # noqa: BLE001 - any failure here refuses the model
        raise InvalidModel(f"{where}: the {config.precision} check failed to run: "
                           f"{error}") from error
    outputs = {name: compare(reduced[name], reference[name], rows) for name in reference}
    classifiers = classifier_outputs(config)
    for name, found in outputs.items():
        found["judged_by"] = ("top1_agreement" if name in classifiers and "top1_agreement"
                              in found else "relative_error")
    record.update(ran=True, samples=1 if rows is None else rows, inputs="the uploaded "
                  "calibration inputs" if uploaded else "random rows", outputs=outputs,
                  thresholds=config.precision_check.model_dump())
    _refuse_past_thresholds(outputs, config, where, record["samples"], record["inputs"])
    return record


def int8_weights(graph: Any) -> str:
    """How an int8 graph's weights were quantized, in words."""
    from engine.quantize.rewrite import narrowed_layers

    narrowed = narrowed_layers(graph)
    if not narrowed:
        return "full-range int8 (±127)"
    return (f"within ±63 in {narrowed} convolution(s), where this host's int8 GEMM (AVX2 "
            f"without VNNI) multiplies 7-bit weights faster; full-range int8 (±127) elsewhere")


def classifier_outputs(config: ModelConfig) -> set[str]:
    """Graph names of the outputs the config marks as a classifier's: class labels, or a
    softmax or top-k postprocess."""
    return {tensor.graph_name for tensor in config.outputs or ()
            if tensor.labels is not None or (tensor.postprocess is not None
                                             and tensor.postprocess.kind in ("softmax", "topk"))}


def compare(reduced: np.ndarray, reference: np.ndarray, rows: int | None) -> dict[str, Any]:
    """How far ``reduced`` is from ``reference``: relative error, and top-1 agreement where the
    output is a classifier's (``rows`` rows of two or more scores; None: one unbatched
    sample, no rows to agree on)."""
    reduced, reference = np.asarray(reduced, np.float64), np.asarray(reference, np.float64)
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    difference = float(np.abs(reduced - reference).max()) if reference.size else 0.0
    found: dict[str, Any] = {"relative_error": difference / scale if scale else difference}
    if (rows is not None and reference.ndim == 2
            and reference.shape == (rows, reference.shape[1]) and reference.shape[1] > 1):
        agree = np.argmax(reduced, axis=1) == np.argmax(reference, axis=1)
        found["top1_agreement"] = float(agree.mean())
    return found


def _run_random(model: Any, inputs: Sequence[TensorConfig],
                sample: Mapping[str, tuple[int, ...]], rows: int | None
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int | None]:
    """The seeded random inputs, the model's outputs on them and their rows (None: the
    sample as it is, for a model refusing ``rows`` rows)."""
    feed = random_inputs(inputs, sample, rows)
    try:
        return feed, model.infer(feed), rows
    except EngineError:
        feed = random_inputs(inputs, sample, None)
        return feed, model.infer(feed), None


def _refuse_past_thresholds(outputs: Mapping[str, Mapping[str, Any]], config: ModelConfig,
                            where: str, samples: int, inputs: str) -> None:
    limits = config.precision_check
    for name, found in outputs.items():
        agreement = found.get("top1_agreement")
        if found["judged_by"] == "top1_agreement" and agreement < limits.min_top1_agreement:
            raise InvalidModel(
                f"{where}: output {name!r} in {config.precision} picks the float32 top-1 class "
                f"on {agreement:.1%} of {samples} {inputs}; precision_check."
                f"min_top1_agreement is {limits.min_top1_agreement:.1%} (serve it in fp32, or "
                f"lower the threshold)")
        if (found["judged_by"] == "relative_error"
                and found["relative_error"] > limits.max_relative_error):
            raise InvalidModel(
                f"{where}: output {name!r} in {config.precision} differs from float32 by "
                f"{found['relative_error']:.3g} of its largest magnitude on {samples} "
                f"{inputs}; precision_check.max_relative_error is "
                f"{limits.max_relative_error:.3g} (serve it in fp32, or raise the threshold)")


def random_inputs(inputs: Sequence[TensorConfig], sample: Mapping[str, tuple[int, ...]],
                   rows: int | None, seed: int = SEED) -> dict[str, np.ndarray]:
    """Seeded random inputs of the sample's shapes, with ``rows`` along each batch axis
    (None: the sample's own)."""
    generator = np.random.default_rng(seed)
    feed = {}
    for tensor in inputs:
        shape = list(sample[tensor.name])
        if rows is not None:
            shape[tensor.axis] = rows
        if tensor.dtype.kind == "f":
            feed[tensor.name] = generator.standard_normal(shape).astype(tensor.dtype)
        else:
            feed[tensor.name] = np.zeros(shape, tensor.dtype)
    return feed
