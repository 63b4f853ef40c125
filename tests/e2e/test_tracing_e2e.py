"""Traces exported by a real server process over OTLP/HTTP, read back with opentelemetry-proto.

A small HTTP receiver in the test takes the exporter's ``POST /v1/traces`` bodies; the server is
switched on by the standard variables alone (``OTEL_TRACES_EXPORTER``, pointed at the receiver
by ``OTEL_EXPORTER_OTLP_ENDPOINT``). A REST and a gRPC request, each with its own
``traceparent``, must arrive as five spans in the caller's trace.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from tests.e2e.server import TOKEN, running_server
from tests.service.helpers import MLP, config_for, files_for, first_io

pytestmark = pytest.mark.e2e
PARENT_ID = 0x00F067AA0BA902B7
REST_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
GRPC_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
STEPS = {"receive", "decode", "queue", "compute", "encode"}


def _traceparent(trace_id: int) -> str:
    return f"00-{trace_id:032x}-{PARENT_ID:016x}-01"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on a free loopback port: keeps each decoded export."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.exports: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[tuple[dict[str, str], Span]]:
        """Every span received so far, with its resource's string attributes."""
        with self.lock:
            exports = list(self.exports)
        found = []
        for export in exports:
            for resource_spans in export.resource_spans:
                resource = {item.key: item.value.string_value
                            for item in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found += [(resource, span) for span in scope_spans.spans]
        return found


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        export = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            self.server.exports.append(export)
            self.server.content_types.append(self.headers.get("Content-Type", ""))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _wait_for_traces(receiver: Receiver, trace_ids: list[int], timeout_s: float = 60.0
                     ) -> dict[int, dict[str, tuple[dict[str, str], Span]]]:
    """Each trace's spans by name, once all five of each have arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        traces: dict[int, dict[str, tuple[dict[str, str], Span]]] = {
            trace_id: {} for trace_id in trace_ids}
        for resource, span in receiver.spans():
            trace_id = int.from_bytes(span.trace_id, "big")
            if trace_id in traces:
                traces[trace_id][span.name] = (resource, span)
        if all(set(spans) == STEPS for spans in traces.values()):
            return traces
        if time.monotonic() > deadline:
            raise AssertionError(f"spans after {timeout_s} s: "
                                 f"{ {hex(key): sorted(value) for key, value in traces.items()} }")
        time.sleep(0.1)


def test_rest_and_grpc_requests_are_exported_in_their_callers_traces(
        tmp_path: Path, receiver: Receiver) -> None:
    variables = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                 "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "hybridserve-e2e"}
    data = first_io(MLP)[0]["data"].astype(np.float32)
    with running_server(tmp_path / "repository", variables=variables) as server:
        symbol, params = files_for(MLP)
        files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
                 "config": ("config.json", json.dumps(config_for(MLP)).encode())}
        response = httpx.post(f"{server.url}/models/{MLP}", files=files, timeout=120,
                              headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 201, response.text

        response = httpx.post(f"{server.url}/v2/models/{MLP}/infer", timeout=60, json={
            "inputs": [{"name": "data", "datatype": "FP32", "shape": list(data.shape),
                        "data": data.ravel().tolist()}]},
            headers={"traceparent": _traceparent(REST_TRACE)})
        assert response.status_code == 200, response.text

        request = pb.ModelInferRequest(model_name=MLP)
        request.inputs.add(name="data", datatype="FP32", shape=data.shape)
        request.raw_input_contents.append(data.tobytes())
        with grpc.insecure_channel(server.grpc) as channel:
            answer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request, metadata=(("traceparent", _traceparent(GRPC_TRACE)),), timeout=60)
        assert answer.model_name == MLP

        traces = _wait_for_traces(receiver, [REST_TRACE, GRPC_TRACE])

    assert set(receiver.content_types) == {"application/x-protobuf"}
    for trace_id, protocol in ((REST_TRACE, "http"), (GRPC_TRACE, "grpc")):
        spans = traces[trace_id]
        resource, receive = spans["receive"]
        assert resource["service.name"] == "hybridserve-e2e"
        assert receive.kind == Span.SpanKind.SPAN_KIND_SERVER
        assert int.from_bytes(receive.parent_span_id, "big") == PARENT_ID
        for name in STEPS - {"receive"}:
            assert spans[name][1].parent_span_id == receive.span_id, name
        for name in STEPS:
            attributes = {item.key: item.value for item in spans[name][1].attributes}
            assert attributes["hybridserve.model.name"].string_value == MLP, name
            assert attributes["hybridserve.model.version"].int_value == 1, name
        compute = {item.key: item.value for item in spans["compute"][1].attributes}
        assert compute["hybridserve.batch.size"].int_value == len(data)
        receive_attributes = {item.key: item.value for item in receive.attributes}
        assert receive_attributes["hybridserve.protocol"].string_value == protocol
