"""Call a running server through tritonclient.grpc or KServe's InferenceGRPCClient.

Both clients register their own copy of the ``inference.*`` protobuf messages, as does
`service.grpc`, and one process cannot hold two (protobuf refuses duplicate symbols). So each
client runs here, in its own process:

    python -m tests.e2e.grpc_clients {triton,triton-stream,kserve} HOST:PORT OUT_DIR MODEL...
    python -m tests.e2e.grpc_clients triton-repository HOST:PORT OUT_DIR MODEL BROKEN TOKEN

It writes what the client got, and nothing it checked itself: ``OUT_DIR/answers.json`` (health
and metadata) and ``OUT_DIR/outputs.npz`` (``MODEL/SET/MODE/OUTPUT`` arrays); the tests compare
them with MXNet's outputs. ``triton-repository`` writes the answers of tritonclient's
repository and readiness calls (`run_triton_repository`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from engine.serving.config import datatype_of
from tests.conformance.fixtures import model_io_sets, model_meta


def matching_sets(name: str) -> list[tuple[dict[str, np.ndarray], list[np.ndarray]]]:
    """io sets whose input dtypes are the model's (text_lstm's float tokens are not)."""
    declared = {spec["name"]: spec["dtype"] for spec in model_meta(name)["inputs"]}
    return [(inputs, expected) for inputs, expected in model_io_sets(name)
            if all(str(array.dtype) == declared[key] for key, array in inputs.items())]


def run_triton(url: str, models: list[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Health, metadata and inference (raw contents) of every model through tritonclient."""
    import tritonclient.grpc as triton

    answers: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    with triton.InferenceServerClient(url) as client:
        answers["live"] = client.is_server_live()
        answers["ready"] = client.is_server_ready()
        answers["server"] = client.get_server_metadata(as_json=True)
        for name in models:
            answers[f"{name}/ready"] = client.is_model_ready(name)
            answers[f"{name}/metadata"] = client.get_model_metadata(name, as_json=True)
            outputs = [tensor["name"] for tensor in answers[f"{name}/metadata"]["outputs"]]
            for index, (inputs, _) in enumerate(matching_sets(name)):
                tensors = []
                for key, array in inputs.items():
                    tensor = triton.InferInput(key, list(array.shape), datatype_of(array.dtype))
                    tensor.set_data_from_numpy(array)
                    tensors.append(tensor)
                result = client.infer(name, tensors, request_id=f"{name}-{index}",
                                      outputs=[triton.InferRequestedOutput(output)
                                               for output in outputs])
                answers[f"{name}/{index}/id"] = result.get_response().id
                for output in outputs:
                    arrays[f"{name}/{index}/raw/{output}"] = result.as_numpy(output)
    return answers, arrays


def run_triton_stream(url: str, models: list[str]) -> tuple[dict[str, Any],
                                                            dict[str, np.ndarray]]:
    """Model configs, then every model's io sets (and one request naming no such input) on
    one stream of tritonclient.grpc's ``start_stream``, all sent before the first answer is
    read; each answer is kept under the id its request carried."""
    import queue

    import tritonclient.grpc as triton

    answers: dict[str, Any] = {"stream/ids": [], "stream/errors": []}
    arrays: dict[str, np.ndarray] = {}
    arrived: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with triton.InferenceServerClient(url) as client:
        for name in models:
            answers[f"{name}/config"] = client.get_model_config(name, as_json=True)["config"]
        client.start_stream(callback=lambda result, error: arrived.put((result, error)))
        sent = 0
        for name in models:
            for index, (inputs, _) in enumerate(matching_sets(name)):
                tensors = []
                for key, array in inputs.items():
                    tensor = triton.InferInput(key, list(array.shape), datatype_of(array.dtype))
                    tensor.set_data_from_numpy(array)
                    tensors.append(tensor)
                client.async_stream_infer(name, tensors, request_id=f"{name}/{index}")
                sent += 1
        wrong = triton.InferInput("no_such_input", [1, 1], "FP32")
        wrong.set_data_from_numpy(np.zeros((1, 1), np.float32))
        client.async_stream_infer(models[0], [wrong], request_id="wrong")
        for _ in range(sent + 1):
            result, error = arrived.get(timeout=120)
            if error is not None:
                answers["stream/errors"].append(str(error))
                continue
            response = result.get_response()
            answers["stream/ids"].append(response.id)
            for output in response.outputs:
                arrays[f"{response.id}/{output.name}"] = result.as_numpy(output.name)
        client.stop_stream()
    return answers, arrays


def run_triton_repository(url: str, model: str, broken: str, token: str
                          ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """tritonclient's repository calls as a user makes them: unload `model` (tritonclient
    always sends ``unload_dependents``), ask whether unknown models and versions are ready,
    load `model` again, infer with ``timeout=0``, and load `broken` (no version loads). Each
    answer, or the error the client raised."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    headers = {"authorization": f"Bearer {token}"}
    answers: dict[str, Any] = {}

    def attempt(key: str, call: Any) -> None:
        try:
            answers[key] = call()
        except InferenceServerException as error:
            answers[key] = {"status": error.status(), "message": error.message()}

    with triton.InferenceServerClient(url) as client:
        attempt("unload", lambda: client.unload_model(model, headers=headers))
        attempt("unloaded ready", lambda: client.is_model_ready(model))
        attempt("unknown ready", lambda: client.is_model_ready("no_such_model"))
        attempt("unknown version ready", lambda: client.is_model_ready(model, "9"))
        attempt("load", lambda: client.load_model(model, headers=headers))
        attempt("loaded ready", lambda: client.is_model_ready(model))
        inputs, _ = matching_sets(model)[0]
        tensors = []
        for key, array in inputs.items():
            tensor = triton.InferInput(key, list(array.shape), datatype_of(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        attempt("infer timeout 0", lambda: client.infer(model, tensors, timeout=0)
                .get_response().model_name)
        attempt("load broken", lambda: client.load_model(broken, headers=headers))
    return answers, {}


async def _kserve(url: str, models: list[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from kserve import InferenceGRPCClient, InferInput, InferRequest

    answers: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    client = InferenceGRPCClient(url, retries=0)
    try:
        answers["live"] = await client.is_server_live()
        answers["ready"] = await client.is_server_ready()
        for name in models:
            answers[f"{name}/ready"] = await client.is_model_ready(name)
            for index, (inputs, _) in enumerate(matching_sets(name)):
                # An ndarray travels as raw_input_contents, a flat list as typed contents.
                for mode, data in (("raw", lambda a: a), ("contents",
                                                          lambda a: a.reshape(-1).tolist())):
                    tensors = [InferInput(key, list(array.shape), datatype_of(array.dtype),
                                          data(array)) for key, array in inputs.items()]
                    response = await client.infer(InferRequest(name, tensors,
                                                               request_id=f"{name}-{index}"))
                    answers[f"{name}/{index}/id"] = response.id
                    for output in response.outputs:
                        arrays[f"{name}/{index}/{mode}/{output.name}"] = output.as_numpy()
    finally:
        await client.close()
    return answers, arrays


def main(argv: list[str]) -> int:
    """Run one client against ``argv[1]`` and write its answers into ``argv[2]``."""
    client, url, out, *models = argv
    if client == "triton-repository":
        answers, arrays = run_triton_repository(url, *models)
    else:
        runner = {"triton": run_triton, "triton-stream": run_triton_stream}.get(
            client, lambda url, models: asyncio.run(_kserve(url, models)))
        answers, arrays = runner(url, models)
    Path(out, "answers.json").write_text(json.dumps(answers))
    np.savez(Path(out, "outputs.npz"), **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
