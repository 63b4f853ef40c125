"""Triton Inference Server serving an ONNX file through ONNX Runtime behind its dynamic batcher.

Run by `bench/perf_analyzer_serve.py --triton` in Triton's own environment
(`bench/requirements-triton.txt`: PyTriton's wheel, which carries the ``tritonserver`` binary
and its Python backend), never in the project's. The model is the ONNX file our exporter
writes, one input ``data`` and one output, both float32, the batch dimension dynamic; Triton
gathers concurrent requests into batches of up to ``--max-batch-size`` within
``--delay-us`` (its dynamic batcher), and each batch runs in one ONNX Runtime session with its
default threads (every core), as Triton's ONNX Runtime backend does by default. PyTriton
hands a batch from the server to this process's Python through shared memory, where the
ONNX Runtime backend runs it inside the server: that hop is part of this peer's time.

Prints ``ready`` once the server answers, then serves until its standard input closes.

    python bench/triton_peer.py model.onnx --http-port 8000 --grpc-port 8001 \
        --metrics-port 8002
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnxruntime
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx", help="the model file (input 'data', batch dimension dynamic)")
    parser.add_argument("--name", default="resnet18")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--delay-us", type=int, default=2000)
    args = parser.parse_args()

    session = onnxruntime.InferenceSession(args.onnx, providers=["CPUExecutionProvider"])
    (source,), (result,) = session.get_inputs(), session.get_outputs()
    item_shape = tuple(int(size) for size in source.shape[1:])

    @batch
    def infer(data: np.ndarray) -> dict[str, np.ndarray]:
        (out,) = session.run([result.name], {source.name: data})
        return {"output": out}

    config = TritonConfig(http_address="127.0.0.1", http_port=args.http_port,
                          grpc_address="127.0.0.1", grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, log_verbose=0)
    # No endpoint behind PyTriton's access token: perf_analyzer reads the model's metadata and
    # configuration as from any Triton (the server listens on the loopback only).
    security = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=config, security_config=security) as triton:
        triton.bind(model_name=args.name, infer_func=infer,
                    inputs=[Tensor(name="data", dtype=np.float32, shape=item_shape)],
                    outputs=[Tensor(name="output", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=args.max_batch_size,
                                       batcher=DynamicBatcher(
                                           max_queue_delay_microseconds=args.delay_us)))
        triton.run()  # in the background: the server is up and the model loaded on return
        print("ready", flush=True)
        sys.stdin.read()  # until the benchmark closes the pipe


if __name__ == "__main__":
    main()
