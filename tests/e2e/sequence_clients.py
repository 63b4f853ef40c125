"""Feed sentences token by token as sequences through tritonclient.grpc, in its own process
(tritonclient's protobuf messages and the server's cannot share one; see
`tests.e2e.grpc_clients`):

    python -m tests.e2e.sequence_clients HOST:PORT MODEL OUT_DIR FIRST_ID

Reads the sentences of ``sequences.npz`` (`tests.engine.serving.sequence_lstm.reference`),
runs each as one sequence (ids FIRST_ID, FIRST_ID + 1, ...) from its own thread, all at once,
and writes every step's ``logits`` to ``OUT_DIR/logits.npz`` (``[steps, sentences, vocab]``;
``streamed``: the first sentence again, every step sent at once on one stream)
, the refusal of a step of a sequence never started to ``OUT_DIR/refusal.txt`` and the model's
configuration to ``OUT_DIR/config.json``; the test compares them with MXNet's and Triton's.
"""

from __future__ import annotations

import json
import queue
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tests.engine.serving.sequence_lstm import reference


def stream(triton: Any, url: str, model: str, tokens: np.ndarray, sequence_id: int
           ) -> list[np.ndarray]:
    """The first sentence as one sequence on one stream, every step sent before the first
    answer is read (the server must run them in order); its logits by step."""
    arrived: queue.Queue[tuple[Any, Any]] = queue.Queue()
    steps = len(tokens)
    logits: dict[str, np.ndarray] = {}
    with triton.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: arrived.put((result, error)))
        for step in range(steps):
            tensor = triton.InferInput("tokens", [1, 1], "FP32")
            tensor.set_data_from_numpy(tokens[step:step + 1, :1])
            client.async_stream_infer(model, [tensor], request_id=str(step),
                                      sequence_id=sequence_id, sequence_start=step == 0,
                                      sequence_end=step == steps - 1)
        for _ in range(steps):
            result, error = arrived.get(timeout=120)
            if error is not None:
                raise RuntimeError(f"stream step failed: {error}")
            logits[result.get_response().id] = result.as_numpy("logits")[0, 0]
        client.stop_stream()
    return [logits[str(step)] for step in range(steps)]


def main(argv: list[str]) -> int:
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    url, model, out, first = argv[0], argv[1], Path(argv[2]), int(argv[3])
    tokens, _ = reference()
    steps, sentences = tokens.shape

    def feed(sentence: int) -> list[np.ndarray]:
        logits = []
        with triton.InferenceServerClient(url) as client:
            for step in range(steps):
                tensor = triton.InferInput("tokens", [1, 1], "FP32")
                tensor.set_data_from_numpy(tokens[step:step + 1, sentence:sentence + 1])
                result = client.infer(model, [tensor], sequence_id=first + sentence,
                                      sequence_start=step == 0,
                                      sequence_end=step == steps - 1)
                logits.append(result.as_numpy("logits")[0, 0])
        return logits

    with ThreadPoolExecutor(sentences) as pool:
        answers = list(pool.map(feed, range(sentences)))
    np.savez(out / "logits.npz", logits=np.array(answers).transpose(1, 0, 2),
             streamed=np.array(stream(triton, url, model, tokens, first + sentences)))
    with triton.InferenceServerClient(url) as client:
        tensor = triton.InferInput("tokens", [1, 1], "FP32")
        tensor.set_data_from_numpy(tokens[:1, :1])
        try:
            client.infer(model, [tensor], sequence_id="never-started")
            refusal = "answered"
        except InferenceServerException as error:
            refusal = f"{error.status()} {error.message()}"
        config = client.get_model_config(model, as_json=True)
    (out / "refusal.txt").write_text(refusal)
    (out / "config.json").write_text(json.dumps(config))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
