"""The executor benchmark's peers that live in their own environment: OpenVINO (f32, bf16, int8
through NNCF) and ONNX Runtime int8 (QDQ through `onnxruntime.quantization`).

`bench/executor.py` runs this file with the peer environment's Python (see
``bench/requirements-peers.txt``), one process per runtime, and talks to it over stdin and
stdout, one JSON value a line: it prints the runtime's description once it is built and
warmed up, then answers each call count with the seconds of each of that many calls; an empty
line or end of input ends it. It imports none of the engine (the peer environment does not
hold it): everything it needs is in the network's folder the benchmark wrote:

* ``model.onnx``: the network as ``hybridserve export-onnx`` writes it (dynamic batch);
* ``calibration.npy``: the calibration inputs, one image each;
* ``agreement.npy``: the inputs whose outputs the benchmark compares across runtimes;
* ``data-b{batch}.npy``: the timed input.

With ``--layers`` (OpenVINO only) it serves nothing: it prints OpenVINO's own time for each of
its layers in the order it runs them (the plugin's performance counters, median over calls).
With ``--layer-turns`` it times the same calls in turns another process paces over stdin (a
count a line, each answered ``DONE`` once run), so that ours and OpenVINO's layers take the
host's slow spells alike, and prints the table at the end of input: `bench/steps_in_order.py
--openvino` sets it beside ours so.

With ``--scaling`` (OpenVINO only) it serves nothing either: it builds the runtime on every
core and on one thread in this one process and times them in turn, round after round, for
the every-core ÷ one-thread ratio that `bench/every_core.py` gives ours.

With ``--footprint`` it serves nothing: it prints, as JSON, the memory one call touches (every
page of the process read or written, `touched_memory`), or with ``--models N`` the resident
memory after each of N models built and run once, for `bench/footprint.py`.

With ``--clock process`` the seconds are the process's CPU time over each call (every thread
of it), not the wall clock's: on a machine other jobs share, the time they held the cores is
left out.

It writes ``{runtime}-b{batch}-output.npy`` (the timed input's output) and, where asked,
``{runtime}-b{batch}-agreement.npy`` (every agreement input's output) into the same folder.
Quantised models are kept there too, so the second thread setting reuses the first's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RUNTIMES = ("ort-int8", "ov-f32", "ov-bf16", "ov-int8")
CALIBRATION_INPUTS = 32  # the calibration set size, for both quantisers
TURNS_READY, TURN_DONE = "READY", "DONE"  # `serve_layer_turns`' answers
FOOTPRINT_WARM_CALLS = 5  # calls before the one `print_footprint` counts
# What a timed call's seconds are read from: the wall clock, or the process's CPU time (all its
# threads), which leaves out the time a loaded machine's other jobs held the cores.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter,
                                          "process": time.process_time}


def ort_int8(folder: Path, batch: int, threads: int) -> tuple[Callable[[np.ndarray], Any], dict]:
    """ONNX Runtime on a QDQ int8 copy of the model: static quantisation, per-channel weights,
    activations calibrated (min-max, ORT's default) on the calibration inputs. Every op ORT
    quantises in QDQ form but BatchNormalization: per-channel, ORT 1.32 gives a BatchNorm on
    the input image (ResNet v2's first layer) scales the runtime then refuses."""
    import onnxruntime
    from onnxruntime import quantization

    quantized = folder / "model-ort-int8.onnx"
    if not quantized.exists():
        samples = np.load(folder / "calibration.npy")[:CALIBRATION_INPUTS]
        name = onnxruntime.InferenceSession(
            str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).get_inputs()[0].name

        class Reader(quantization.CalibrationDataReader):
            def __init__(self) -> None:
                self.items = iter([{name: sample[None]} for sample in samples])

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.items, None)

        quantization.quantize_static(
            str(folder / "model.onnx"), str(quantized), Reader(),
            quant_format=quantization.QuantFormat.QDQ, per_channel=True,
            activation_type=quantization.QuantType.QUInt8,
            weight_type=quantization.QuantType.QInt8,
            op_types_to_quantize=[op for op in quantization.registry.QDQRegistry
                                  if op != "BatchNormalization"])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(quantized), options,
                                           providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    info = {"version": f"ONNX Runtime {onnxruntime.__version__}",
            "precision": "QDQ int8 (u8 activations, s8 per-channel weights)",
            "threads": f"intra-op {threads or 'default'}"}
    return lambda x: session.run(None, {input_name: x})[0], info


def openvino_model(folder: Path, precision: str) -> Any:
    """The OpenVINO model of ``model.onnx``; for int8 quantised by NNCF (and kept as IR)."""
    import openvino

    if precision != "int8":
        return openvino.Core().read_model(str(folder / "model.onnx"))
    ir = folder / "model-ov-int8.xml"
    if ir.exists():
        return openvino.Core().read_model(str(ir))
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        QuantizationParameters,
    )

    model = openvino.convert_model(str(folder / "model.onnx"))
    samples = np.load(folder / "calibration.npy")[:CALIBRATION_INPUTS]
    quantized = nncf.quantize(
        model, nncf.Dataset([sample[None] for sample in samples]),
        subset_size=len(samples),
        advanced_parameters=AdvancedQuantizationParameters(
            weights_quantization_params=QuantizationParameters(per_channel=True)))
    openvino.save_model(quantized, str(ir))
    return quantized


COMPUTE_LAYERS = ("Convolution", "FullyConnected", "MatMul")


def runtime_precisions(compiled: Any) -> str:
    """The precisions the CPU plugin runs the convolutions and products at (its runtime
    model's ``runtimePrecision``), with how many layers run at each, most first."""
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if str(info["layerType"].astype(str)) in COMPUTE_LAYERS:
            counts[str(info["runtimePrecision"].astype(str))] += 1
    return ", ".join(f"{precision} ×{count}" for precision, count in counts.most_common())


def openvino(folder: Path, batch: int, threads: int,
             precision: str) -> tuple[Callable[[np.ndarray], Any], dict]:
    """OpenVINO's CPU plugin, latency hint, the batch fixed at ``batch``; f32 and bf16 set the
    inference precision hint, int8 leaves it at the device's default for the layers NNCF did
    not quantise."""
    import openvino

    model = openvino_model(folder, precision)
    model.reshape({0: list(np.load(folder / f"data-b{batch}.npy", mmap_mode="r").shape)})
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    if precision in ("f32", "bf16"):
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = openvino.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    info = {"version": f"OpenVINO {openvino.__version__}",
            "precision": f"hint {compiled.get_property('INFERENCE_PRECISION_HINT').to_string()}"
                         f"; convolutions and products at {runtime_precisions(compiled)}",
            "threads": f"{compiled.get_property('INFERENCE_NUM_THREADS')} inference threads, "
                       f"{compiled.get_property('NUM_STREAMS')} stream(s)"}

    def run(x: np.ndarray) -> np.ndarray:
        return request.infer({0: x})[compiled.output(0)]

    return run, info


def build(runtime: str, folder: Path, batch: int,
          threads: int) -> tuple[Callable[[np.ndarray], Any], dict]:
    """The runtime's call on one input and its description."""
    if runtime == "ort-int8":
        return ort_int8(folder, batch, threads)
    if runtime.startswith("ov-"):
        return openvino(folder, batch, threads, runtime.removeprefix("ov-"))
    raise ValueError(f"unknown peer runtime {runtime!r}; known: {', '.join(RUNTIMES)}")


def outputs_in_batches(run: Callable[[np.ndarray], Any], inputs: np.ndarray,
                       batch: int) -> np.ndarray:
    """``run`` over ``inputs`` in slices of ``batch`` rows (their count a multiple of it)."""
    return np.concatenate([np.asarray(run(np.ascontiguousarray(inputs[start:start + batch])))
                           for start in range(0, len(inputs), batch)])


def serve(runtime: str, folder: Path, batch: int, threads: int, agreement: bool,
          clock: str = "wall") -> None:
    """Build, warm up, write the outputs, then answer timed rounds over stdin and stdout, each
    call timed by the ``clock`` named (`CLOCKS`)."""
    # The answers get stdout to themselves: what the libraries print (NNCF's progress bars)
    # goes to stderr, at the descriptor level so that native code's writes do too.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    run, info = build(runtime, folder, batch, threads)
    data = np.load(folder / f"data-b{batch}.npy")
    np.save(folder / f"{runtime}-b{batch}-output.npy", np.asarray(run(data)))
    if agreement:
        np.save(folder / f"{runtime}-b{batch}-agreement.npy",
                outputs_in_batches(run, np.load(folder / "agreement.npy"), batch))
    calls = []
    for _ in range(3):
        start = time.perf_counter()
        run(data)
        calls.append(time.perf_counter() - start)
    info["call_seconds"] = min(calls)
    print(json.dumps(info), file=answers, flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        print(json.dumps(timed_calls(lambda: run(data), int(line), CLOCKS[clock])),
              file=answers, flush=True)


def timed_calls(action: Callable[[], object], count: int,
                clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """The seconds by ``clock`` of each of ``count`` calls of ``action``, one after another."""
    seconds = []
    for _ in range(count):
        start = clock()
        action()
        seconds.append(clock() - start)
    return seconds


def profiled_request(runtime: str, folder: Path, batch: int, threads: int) -> tuple[Any, Any]:
    """An OpenVINO infer request with its performance counters on (``PERF_COUNT``), warmed
    by 10 calls, and the case's input."""
    import openvino

    if not runtime.startswith("ov-"):
        raise SystemExit(f"per-layer times are OpenVINO's counters; {runtime} has none")
    precision = runtime.removeprefix("ov-")
    model = openvino_model(folder, precision)
    data = np.load(folder / f"data-b{batch}.npy")
    model.reshape({0: list(data.shape)})
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    if precision in ("f32", "bf16"):
        config["INFERENCE_PRECISION_HINT"] = precision
    request = openvino.Core().compile_model(model, "CPU", config).create_infer_request()
    for _ in range(10):
        request.infer({0: data})
    return request, data


def layer_times(request: Any, data: Any, runs: int,
                layers: dict[tuple[str, str, str], list[float]]) -> None:
    """``runs`` calls, each layer's time (its counter's ``real_time``) appended to
    ``layers`` under (name, type, implementation)."""
    for _ in range(runs):
        request.infer({0: data})
        for layer in request.profiling_info:
            key = (layer.node_name, layer.node_type, layer.exec_type)
            layers.setdefault(key, []).append(layer.real_time.total_seconds())


def print_layer_table(label: str, layers: dict[tuple[str, str, str], list[float]],
                      runs: int) -> None:
    """Each layer's median time, in the order OpenVINO runs them."""
    medians = {key: float(np.median(times)) for key, times in layers.items()}
    print(f"{label}: layers sum to {sum(medians.values()) * 1e3:.2f} ms (median of {runs} "
          f"calls each)")
    for (name, kind, implementation), seconds in medians.items():
        if seconds > 0:
            print(f"  {seconds * 1e3:7.3f} ms  {name} ({kind}, {implementation})")


def print_layer_times(runtime: str, folder: Path, batch: int, threads: int, runs: int) -> None:
    """OpenVINO's time per layer (``PERF_COUNT``), median of ``runs`` calls after 10 of
    warm-up, in the order its runtime model runs them."""
    request, data = profiled_request(runtime, folder, batch, threads)
    layers: dict[tuple[str, str, str], list[float]] = {}
    layer_times(request, data, runs, layers)
    print_layer_table(f"OpenVINO {runtime.removeprefix('ov-')}, batch {batch}, "
                      f"{threads or 'default'} thread(s)", layers, runs)


def serve_layer_turns(runtime: str, folder: Path, batch: int, threads: int) -> None:
    """`print_layer_times` in turns another process paces: once warm, ``READY`` on stdout;
    then each line of stdin holding a count runs that many calls and answers ``DONE``; at the
    end of stdin, the table of every call's layers (so that a benchmark times ours and
    OpenVINO's layers in alternate turns, the host's slow spells falling on both)."""
    request, data = profiled_request(runtime, folder, batch, threads)
    layers: dict[tuple[str, str, str], list[float]] = {}
    print(TURNS_READY, flush=True)
    runs = 0
    for line in sys.stdin:
        layer_times(request, data, int(line), layers)
        runs += int(line)
        print(TURN_DONE, flush=True)
    print_layer_table(f"OpenVINO {runtime.removeprefix('ov-')}, batch {batch}, "
                      f"{threads or 'default'} thread(s), in turns with ours", layers, runs)


def print_footprint(runtime: str, folder: Path, batch: int, threads: int,
                    models: int = 0) -> None:
    """The megabytes one warm call touches, the process's every mapping (OpenVINO's code and
    its JIT kernels included), as JSON (`touched_memory`); with ``models``, instead the
    resident megabytes with the runtime imported, then after each of that many models built
    and run once."""
    import touched_memory

    data = np.load(folder / f"data-b{batch}.npy")
    if models:
        # the runtime's library loaded before the first count, as ours is
        __import__({"ort-int8": "onnxruntime"}.get(runtime, "openvino"))
        resident, kept = [touched_memory.resident_bytes() / 2**20], []
        for _ in range(models):
            kept.append(build(runtime, folder, batch, threads))
            kept[-1][0](data)
            resident.append(touched_memory.resident_bytes() / 2**20)
        print(json.dumps({"runtime": runtime, **kept[0][1], "resident_mb": resident}))
        return
    touched_memory.no_huge_pages()  # before the runtime allocates anything
    run, info = build(runtime, folder, batch, threads)
    for _ in range(FOOTPRINT_WARM_CALLS):
        run(data)
    mappings = touched_memory.touched_by(lambda: run(data))
    # the last line of the output (NNCF's progress may come before it)
    print(json.dumps({"runtime": runtime, **info,
                      "touched_mb": sum(touched for *_, touched in mappings) / 2**20}))


def print_scaling(runtime: str, folder: Path, batch: int, rounds: int,
                  calls: int = 8) -> None:
    """OpenVINO on every core against one thread, each compiled in this process and called
    ``calls`` times in turn for ``rounds`` rounds (the median of each turn's calls from the
    third on), so that a busy machine's load falls on both alike."""
    if not runtime.startswith("ov-"):
        raise SystemExit(f"--scaling compiles OpenVINO's models; {runtime} is not one")
    precision = runtime.removeprefix("ov-")
    data = np.load(folder / f"data-b{batch}.npy")
    every, _ = openvino(folder, batch, 0, precision)
    alone, _ = openvino(folder, batch, 1, precision)
    for run in (every, alone):
        timed_calls(lambda run=run: run(data), 5)
    turns: dict[str, list[float]] = {"every": [], "alone": []}
    for _ in range(rounds):
        for name, run in (("every", every), ("alone", alone)):
            turns[name].append(float(np.median(timed_calls(lambda run=run: run(data),
                                                           calls)[2:])))
    ratios = np.array(turns["every"]) / np.array(turns["alone"])
    every_ms, alone_ms = (float(np.median(turns[name])) * 1e3 for name in ("every", "alone"))
    quartiles = " ".join(f"{value:.3f}" for value in np.quantile(ratios, [0.25, 0.5, 0.75]))
    print(f"OpenVINO {precision}, batch {batch}: every core {every_ms:.2f} ms, one thread "
          f"{alone_ms:.2f} ms, ratio {every_ms / alone_ms:.3f} (per-round quartiles "
          f"{quartiles})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runtime", choices=RUNTIMES)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0, help="0: the runtime's default")
    parser.add_argument("--agreement", action="store_true",
                        help="also write the outputs of every agreement input")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="what each timed call's seconds are read from (process: the "
                             "process's CPU time, every thread of it)")
    parser.add_argument("--layers", type=int, metavar="RUNS", default=0,
                        help="print OpenVINO's time per layer over RUNS calls instead of serving")
    parser.add_argument("--layer-turns", action="store_true",
                        help="--layers in turns paced on stdin (`serve_layer_turns`)")
    parser.add_argument("--footprint", action="store_true",
                        help="print the memory one call touches instead of serving")
    parser.add_argument("--models", type=int, default=0,
                        help="with --footprint: the resident memory after each of this many "
                             "models built")
    parser.add_argument("--scaling", type=int, metavar="ROUNDS", default=0,
                        help="time OpenVINO on every core against one thread in turn for "
                             "ROUNDS rounds instead of serving")
    options = parser.parse_args()
    if options.footprint:
        print_footprint(options.runtime, options.folder, options.batch, options.threads,
                        options.models)
        return
    if options.scaling:
        print_scaling(options.runtime, options.folder, options.batch, options.scaling)
        return
    if options.layer_turns:
        serve_layer_turns(options.runtime, options.folder, options.batch, options.threads)
        return
    if options.layers:
        print_layer_times(options.runtime, options.folder, options.batch, options.threads,
                          options.layers)
        return
    serve(options.runtime, options.folder, options.batch, options.threads, options.agreement,
          options.clock)


if __name__ == "__main__":
    main()
