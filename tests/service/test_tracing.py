"""Traces of inference requests, read through the SDK's in-memory exporter: the spans of REST
and gRPC requests in the caller's trace, their attributes, batches, failures, and tracing off."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode

from service import tracing
from service.grpc import inference_pb2 as pb
from service.tracing import NO_SPAN, Tracing, TracingUnavailable, from_environment, wanted
from service.tracing.otel import OpenTelemetryTracing
from tests.service import image_model
from tests.service.grpc_inprocess import grpc_client
from tests.service.helpers import MLP, config_for, files_for, first_io, run, serving, settings_for

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"
STEPS = ("receive", "decode", "queue", "compute", "encode")


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Every runtime created in the test traces into the returned exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr("service.runtime.from_environment",
                        lambda requested: OpenTelemetryTracing(provider))
    return exporter


def _v2_json(data: np.ndarray) -> dict:
    return {"inputs": [{"name": "data", "datatype": "FP32", "shape": list(data.shape),
                        "data": data.tolist()}]}


def _by_name(spans: tuple[ReadableSpan, ...], trace_id: int) -> dict[str, ReadableSpan]:
    """The spans of one trace by name (each name once)."""
    found: dict[str, ReadableSpan] = {}
    for span in spans:
        if span.context.trace_id == trace_id:
            assert span.name not in found, f"two {span.name} spans in one trace"
            found[span.name] = span
    return found


def _check_request_trace(spans: dict[str, ReadableSpan], protocol: str, rows: int) -> None:
    """One request's five spans: receive under the caller's span, the rest under receive, in
    order, each naming the model version."""
    assert set(spans) == set(STEPS), sorted(spans)
    receive = spans["receive"]
    assert receive.kind is SpanKind.SERVER
    assert receive.parent is not None and receive.parent.span_id == PARENT_ID
    assert receive.parent.is_remote
    assert receive.attributes["hybridserve.protocol"] == protocol
    for name in STEPS[1:]:
        span = spans[name]
        assert span.parent is not None and span.parent.span_id == receive.context.span_id, name
        assert receive.start_time <= span.start_time <= span.end_time <= receive.end_time, name
    for name in STEPS:
        attributes = spans[name].attributes
        assert attributes["hybridserve.model.name"] == MLP, name
        assert attributes["hybridserve.model.version"] == 1, name
        assert attributes["hybridserve.request.rows"] == rows, name
    assert spans["decode"].end_time <= spans["queue"].start_time
    assert spans["queue"].end_time <= spans["compute"].start_time
    assert spans["compute"].end_time <= spans["encode"].start_time
    for name in ("queue", "compute"):
        assert spans[name].attributes["hybridserve.batch.size"] == rows
        assert spans[name].attributes["hybridserve.batch.requests"] == 1


def test_rest_requests_continue_the_callers_trace(tmp_path: Path,
                                                  exporter: InMemorySpanExporter) -> None:
    data = first_io(MLP)[0]["data"]

    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            response = await client.post(f"/v2/models/{MLP}/infer", json=_v2_json(data),
                                         headers={"traceparent": TRACEPARENT})
            assert response.status_code == 200, response.text
            spans = _by_name(exporter.get_finished_spans(), TRACE_ID)
            _check_request_trace(spans, "http", len(data))
            assert spans["receive"].attributes["url.path"] == f"/v2/models/{MLP}/infer"
            exporter.clear()

            other = TRACE_ID + 1
            response = await client.post(
                "/predict", json={"model": MLP, "inputs": {"data": data.tolist()}},
                headers={"traceparent": f"00-{other:032x}-{PARENT_ID:016x}-01"})
            assert response.status_code == 200, response.text
            _check_request_trace(_by_name(exporter.get_finished_spans(), other), "http",
                                 len(data))

    run(scenario())


def test_a_request_without_traceparent_starts_a_trace_of_its_own(
        tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    data = first_io(MLP)[0]["data"]

    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            response = await client.post(f"/v2/models/{MLP}/infer", json=_v2_json(data))
            assert response.status_code == 200, response.text

    run(scenario())
    spans = exporter.get_finished_spans()
    receive = [span for span in spans if span.name == "receive"]
    assert len(receive) == 1 and receive[0].parent is None
    assert {span.name for span in spans if span.context.trace_id ==
            receive[0].context.trace_id} == set(STEPS)


class CountingSampler(Sampler):
    """The default sampler (the caller's decision, else sampled), counting its decisions."""

    def __init__(self) -> None:
        self.inner = ParentBased(ALWAYS_ON)
        self.asked: list[str] = []

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        self.asked.append(args[2])  # the span's name
        return self.inner.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "counting"


def test_a_caller_that_does_not_sample_gets_no_spans(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``traceparent`` flagged unsampled (00) leaves the whole request out, and its steps,
    queue and compute are not even offered to the sampler (their cost is the SDK's)."""
    exporter, sampler = InMemorySpanExporter(), CountingSampler()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr("service.runtime.from_environment",
                        lambda requested: OpenTelemetryTracing(provider))
    data = first_io(MLP)[0]["data"]

    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            for path, body in ((f"/v2/models/{MLP}/infer", _v2_json(data)),
                               ("/predict", {"model": MLP, "inputs": {"data": data.tolist()}})):
                response = await client.post(path, json=body, headers={
                    "traceparent": f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-00"})
                assert response.status_code == 200, response.text
            sampled = await client.post(f"/v2/models/{MLP}/infer", json=_v2_json(data),
                                        headers={"traceparent": TRACEPARENT})
            assert sampled.status_code == 200, sampled.text

    run(scenario())
    spans = exporter.get_finished_spans()
    assert sorted(span.name for span in spans) == sorted(STEPS)  # the sampled request's only
    assert sorted(sampler.asked) == sorted(["receive", "receive", *STEPS])


def test_a_batch_of_two_requests_gives_each_trace_the_shared_compute(
        tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    data = first_io(MLP)[0]["data"][:1]
    # A 2-row batch first, so that a lone 1-row request waits (up to the long delay) for
    # company; the preferred size 2 dispatches the pair as soon as both are queued.
    config = {**config_for(MLP), "max_batch_size": 8, "dynamic_batching": {
        "max_queue_delay_us": 20_000_000, "preferred_batch_sizes": [2]}}
    ids = [TRACE_ID + 10, TRACE_ID + 11]

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            symbol, params = files_for(MLP)
            await runtime.repository.add_version(MLP, symbol, params, config=config)
            url = f"/v2/models/{MLP}/infer"
            warm = await client.post(url, json=_v2_json(np.concatenate([data, data])))
            assert warm.status_code == 200, warm.text
            responses = await asyncio.gather(*(
                client.post(url, json=_v2_json(data),
                            headers={"traceparent": f"00-{trace:032x}-{PARENT_ID:016x}-01"})
                for trace in ids))
            assert [response.status_code for response in responses] == [200, 200]

    run(scenario())
    finished = exporter.get_finished_spans()
    computes = []
    for trace in ids:
        spans = _by_name(finished, trace)
        assert set(spans) == set(STEPS)
        computes.append(spans["compute"])
        assert spans["queue"].attributes["hybridserve.batch.size"] == 2
    first, second = computes
    assert (first.start_time, first.end_time) == (second.start_time, second.end_time)
    for compute in computes:
        assert compute.attributes["hybridserve.batch.size"] == 2
        assert compute.attributes["hybridserve.batch.requests"] == 2
        assert compute.attributes["hybridserve.request.rows"] == 1
    assert (first.attributes["hybridserve.batch.number"]
            == second.attributes["hybridserve.batch.number"])


def test_images_are_preprocessed_in_a_span_of_their_own(
        tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    symbol, params = image_model.model_files()

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            await runtime.repository.add_version(image_model.NAME, symbol, params,
                                                 config=image_model.CONFIG)
            image = image_model.encode(image_model.photo(64, 48, seed=3), "PNG")
            response = await client.post(f"/predict?model={image_model.NAME}", content=image,
                                         headers={"Content-Type": "image/png",
                                                  "traceparent": TRACEPARENT})
            assert response.status_code == 200, response.text

    run(scenario())
    spans = _by_name(exporter.get_finished_spans(), TRACE_ID)
    assert set(spans) == {*STEPS, "preprocess"}
    preprocess = spans["preprocess"]
    assert preprocess.parent is not None
    assert preprocess.parent.span_id == spans["receive"].context.span_id
    assert spans["decode"].end_time <= preprocess.start_time
    assert preprocess.end_time <= spans["queue"].start_time
    assert preprocess.attributes["hybridserve.model.name"] == image_model.NAME


def test_a_refused_request_ends_its_spans_with_the_error(
        tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            body = {"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 1],
                                "data": [1.0]}]}
            response = await client.post(f"/v2/models/{MLP}/infer", json=body,
                                         headers={"traceparent": TRACEPARENT})
            assert response.status_code == 400, response.text

    run(scenario())
    spans = _by_name(exporter.get_finished_spans(), TRACE_ID)
    assert set(spans) == {"receive", "decode"}
    for span in spans.values():
        assert span.status.status_code is StatusCode.ERROR
        assert "nope" in (span.status.description or "")


@pytest.fixture
def grpc_running(tmp_path: Path, exporter: InMemorySpanExporter) -> Iterator[object]:
    with grpc_client(tmp_path / "repository") as running:
        yield running


def test_grpc_calls_read_traceparent_from_metadata(grpc_running: object,
                                                   exporter: InMemorySpanExporter) -> None:
    data = first_io(MLP)[0]["data"]
    request = pb.ModelInferRequest(model_name=MLP)
    request.inputs.add(name="data", datatype="FP32", shape=data.shape)
    request.raw_input_contents.append(data.astype(np.float32).tobytes())
    response = grpc_running.call("ModelInfer", request,  # type: ignore[attr-defined]
                                 metadata=(("traceparent", TRACEPARENT),))
    assert response.model_name == MLP
    spans = _by_name(exporter.get_finished_spans(), TRACE_ID)
    _check_request_trace(spans, "grpc", len(data))
    assert spans["receive"].attributes["rpc.method"] == "ModelInfer"

    exporter.clear()
    call = grpc_running.channel.stream_stream(  # type: ignore[attr-defined]
        "/inference.GRPCInferenceService/ModelStreamInfer")
    messages = [request.SerializeToString()] * 2

    async def exchange() -> list[bytes]:
        return [answer async for answer in call(
            iter(messages), metadata=(("traceparent", TRACEPARENT),))]

    answers = grpc_running.run(exchange)  # type: ignore[attr-defined]
    assert [pb.ModelStreamInferResponse.FromString(answer).error_message
            for answer in answers] == ["", ""]
    # Both messages of the stream join the trace its metadata names, a receive span each.
    streamed = [span for span in exporter.get_finished_spans()
                if span.context.trace_id == TRACE_ID]
    receives = [span for span in streamed if span.name == "receive"]
    assert len(receives) == 2
    assert {span.attributes["rpc.method"] for span in receives} == {"ModelStreamInfer"}
    assert sorted(span.name for span in streamed) == sorted(STEPS * 2)

    exporter.clear()
    missing = pb.ModelInferRequest(model_name="absent")
    code, _ = grpc_running.code("ModelInfer", missing,  # type: ignore[attr-defined]
                                metadata=(("traceparent", TRACEPARENT),))
    assert code is grpc.StatusCode.NOT_FOUND
    spans = _by_name(exporter.get_finished_spans(), TRACE_ID)
    assert set(spans) == {"receive", "decode"}
    assert spans["receive"].status.status_code is StatusCode.ERROR


def test_tracing_is_off_unless_asked_for() -> None:
    assert not wanted(False, {})
    assert wanted(True, {})
    assert wanted(False, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted(True, {"OTEL_TRACES_EXPORTER": "none"})
    assert not wanted(True, {"OTEL_SDK_DISABLED": "true"})
    assert not wanted(False, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"})
    off = from_environment(False, {})
    assert type(off) is Tracing and not off.enabled and off.batch_observer is None
    assert off.http([(b"traceparent", TRACEPARENT.encode())], "POST", "/") is NO_SPAN
    assert off.grpc(lambda: (("traceparent", TRACEPARENT),), "ModelInfer") is NO_SPAN
    with off.step("preprocess") as span:
        assert span is NO_SPAN
    assert off.traced("decode", _v2_json) is _v2_json


def test_a_runtime_without_tracing_never_imports_the_sdk(tmp_path: Path) -> None:
    """Off, nothing of OpenTelemetry's SDK is loaded, the batchers get no observer, the steps
    are the plain methods and the app's stack has no tracing layer."""
    script = (
        "import sys\n"
        "from service.dataplane.inference import InferenceService\n"
        "from service.grpc.servicer import InferenceServicer\n"
        "from service.rest.app import create_app\n"
        "from service.rest.gate import Gate\n"
        "from service.rest.routes import Router\n"
        "from service.runtime import Runtime\n"
        "from service.settings import Settings\n"
        f"runtime = Runtime.create(Settings(model_repository={str(tmp_path)!r}))\n"
        "assert not runtime.tracing.enabled\n"
        "assert runtime.repository.batch_observer is None\n"
        "assert runtime.inference._v2_decode.__func__ is InferenceService._v2_decode\n"
        "assert runtime.inference._predict_encode is InferenceService._predict_encode\n"
        "servicer = InferenceServicer(runtime)\n"
        "assert servicer._infer.__func__ is InferenceServicer._infer_steps\n"
        "assert servicer._decode.__func__ is InferenceServicer._decode\n"
        "stack = create_app(runtime).build_middleware_stack()\n"
        "assert type(stack) is Gate and type(stack.app) is Router, stack.app\n"
        "loaded = sorted(name for name in sys.modules if name.startswith("
        "('opentelemetry.sdk', 'service.tracing.otel')))\n"
        "assert not loaded, loaded\n")
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("OTEL_", "HYBRIDSERVE_"))}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_without_the_extra_the_server_refuses_to_start_saying_what_to_install(
        tmp_path: Path) -> None:
    # The SDK made unimportable, as in an install without the tracing extra.
    script = ("import sys\n"
              "sys.modules['service.tracing.otel'] = None\n"
              "from service.__main__ import main\n"
              f"sys.exit(main(['--trace', '--model-repository', {str(tmp_path)!r}, "
              "'--port', '0', '--grpc-port', '0', '--admin-token', 't']))\n")
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("OTEL_", "HYBRIDSERVE_"))}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "pip install 'hybridserve[tracing]'" in done.stderr
    assert "--trace or OTEL_TRACES_EXPORTER" in done.stderr


@pytest.mark.parametrize(("variables", "named"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "'zipkin'"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "'grpc'"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "'http/json'"),
])
def test_an_exporter_this_server_lacks_is_refused_by_name(variables: dict[str, str],
                                                          named: str) -> None:
    with pytest.raises(TracingUnavailable, match=named):
        tracing.from_environment(True, variables)


def test_on_with_the_sdk_the_otlp_exporter_batches_spans() -> None:
    traced = from_environment(True, {"OTEL_TRACES_EXPORTER": "otlp,console"})
    try:
        assert isinstance(traced, OpenTelemetryTracing) and traced.batch_observer is not None
        processors = traced.provider._active_span_processor._span_processors
        assert [type(processor).__name__ for processor in processors] == [
            "BatchSpanProcessor", "BatchSpanProcessor"]
        assert traced.provider.resource.attributes["service.name"] == "hybridserve"
    finally:
        traced.shutdown()
