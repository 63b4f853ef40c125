"""Write a float32 export, its calibration inputs and MXNet 1.9.1's own int8 version of it
(``quantize_net``, oneDNN backend, naive calibration), the reference for ``precision="int8"``.

Usage (inside the fixture venv, see README.md)::

    python tools/mxnet_fixtures/generate_ptq.py --out tests/fixtures/mxnet_quantized/ptq

``<out>/`` holds ``float-symbol.json`` and ``float-0000.params`` (the float model as exported
by Gluon), ``int8-symbol.json`` (MXNet's int8 graph: its fused nodes carry the calibrated
ranges) and ``io.npz`` (``calibration``, ``data``, and MXNet's ``int8_output`` and
``float_output`` on ``data``). The model is the thin ResNet-18 of generate_quantized.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mxnet as mx
import numpy as np
from generate_quantized import BATCH, build, samples
from mxnet.contrib import quantization


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    net, shape = build("resnet18_v1_naive", 7)
    rng = np.random.default_rng(8)
    calibration = samples(rng, 16, shape)
    data = samples(rng, 24, shape)
    float_output = net(mx.nd.array(data)).asnumpy()
    net.export(str(out / "float"))
    quantized = quantization.quantize_net(
        net, quantize_mode="full", calib_data=mx.io.NDArrayIter(data=calibration,
                                                                batch_size=BATCH),
        num_calib_examples=len(calibration), ctx=mx.cpu(), calib_mode="naive",
        quantized_dtype="auto")
    int8_output = quantized(mx.nd.array(data)).asnumpy()
    quantized.export(str(out / "int8"))
    (out / "int8-0000.params").unlink()  # the ranges are in the symbol; the weights are float's
    np.savez_compressed(out / "io.npz", calibration=calibration, data=data,
                        int8_output=int8_output, float_output=float_output)
    print("int8 vs float top-1", np.mean(int8_output.argmax(1) == float_output.argmax(1)))


if __name__ == "__main__":
    main()
