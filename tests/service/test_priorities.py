"""Triton's ``priority`` and ``timeout`` request parameters over REST (JSON and binary bodies)
and gRPC, against a model whose config sets priority levels and queue policies: a request
past a REJECT timeout, or over a level's bound, is answered 503 / UNAVAILABLE naming the model
and the queue; a priority past the levels joins the default level, as Triton places it, and
a negative or mistyped one is 400 / INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson

from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import start_grpc
from tests.e2e.server import free_port
from tests.service.gated import ROW, gate_batches, mlp_body, wait_until
from tests.service.helpers import MLP, config_for, files_for, run, serving, settings_for

CONFIG = {**config_for(MLP), "max_batch_size": 1, "dynamic_batching": {
    "priority_levels": 2, "default_priority_level": 2,
    "priority_queue_policy": {
        "1": {"max_queue_size": 1},
        "2": {"timeout_action": "REJECT", "default_timeout_microseconds": 50_000}}}}


async def _binary(client: httpx.AsyncClient, parameters: Mapping[str, Any]) -> httpx.Response:
    """A request whose tensor travels as binary data after its JSON header."""
    header = orjson.dumps({"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512],
                                       "parameters": {"binary_data_size": ROW.nbytes}}],
                           "parameters": dict(parameters)})
    return await client.post(f"/v2/models/{MLP}/infer", content=header + ROW.tobytes(),
                             headers={"Inference-Header-Content-Length": str(len(header))})


def _grpc_request(**parameters: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MLP, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="data", datatype="FP32", shape=[1, 512])], raw_input_contents=[ROW.tobytes()])
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request


async def _grpc_code(stub: pb_grpc.GRPCInferenceServiceStub,
                     request: pb.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    try:
        await stub.ModelInfer(request)
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def test_priorities_and_queue_policies_over_rest_and_grpc(tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = settings_for(tmp_path, grpc_port=free_port())
        async with serving(settings, models=()) as (client, runtime):
            symbol, params = files_for(MLP)
            await runtime.repository.add_version(MLP, symbol, params, config=CONFIG)
            handle = runtime.repository.get(MLP)
            server = await start_grpc(runtime)
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{settings.grpc_port}")
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            gate = gate_batches(handle)
            url = f"/v2/models/{MLP}/infer"
            try:
                running = asyncio.create_task(client.post(url, json=mlp_body({})))
                await wait_until(lambda: handle.batcher.computing == 1)

                # Level 2 (the default) rejects what waits past 50 ms, naming the queue.
                for response in (await client.post(url, json=mlp_body({"priority": 2})),
                                 await _binary(client, {"priority": 2}),
                                 await client.post(url, json=mlp_body({}))):
                    assert response.status_code == 503, response.text
                    error = response.json()["error"]
                    assert MLP in error and "priority level 2 queue" in error, error
                code, details = await _grpc_code(stub, _grpc_request(priority=2))
                assert code == grpc.StatusCode.UNAVAILABLE
                assert MLP in details and "priority level 2 queue" in details, details

                # Level 1 has no timeout and room for one request.
                waiting = asyncio.create_task(client.post(url, json=mlp_body({"priority": 1})))
                await wait_until(lambda: handle.batcher.queue_depth == 1)
                code, details = await _grpc_code(stub, _grpc_request(priority=1))
                assert code == grpc.StatusCode.UNAVAILABLE
                assert "priority level 1 queue is full" in details, details
                full = await _binary(client, {"priority": 1})
                assert full.status_code == 503 and "priority level 1 queue" in full.text

                # A priority past 1..2 joins the default level 2 (its 50 ms REJECT queue);
                # a negative or mistyped one is the request's mistake.
                past = await client.post(url, json=mlp_body({"priority": 3}))
                assert past.status_code == 503 and "priority level 2 queue" in past.text
                code, details = await _grpc_code(stub, _grpc_request(priority=3))
                assert code == grpc.StatusCode.UNAVAILABLE and "priority level 2" in details
                for priority in (-1, "1", True):
                    bad = await client.post(url, json=mlp_body({"priority": priority}))
                    assert bad.status_code == 400, (priority, bad.text)
                    assert "priority" in bad.json()["error"]
                code, details = await _grpc_code(stub, _grpc_request(priority=-1))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "negative" in details

                gate.set()
                for task in (running, waiting):
                    answer = await task
                    assert answer.status_code == 200, answer.text
                assert (await _grpc_code(stub, _grpc_request(priority=1)))[0] == (
                    grpc.StatusCode.OK)

                # gRPC's ModelConfig carries the levels in Triton's fields.
                batching = (await stub.ModelConfig(pb.ModelConfigRequest(name=MLP))
                            ).config.dynamic_batching
                assert (batching.priority_levels, batching.default_priority_level) == (2, 2)
                assert batching.priority_queue_policy[1].max_queue_size == 1
                level2 = batching.priority_queue_policy[2]
                assert level2.default_timeout_microseconds == 50_000
                assert level2.timeout_action == pb.ModelQueuePolicy.REJECT
            finally:
                gate.set()
                await channel.close()
                await server.stop(None)

    run(scenario())
