"""Write MXNet 1.9.1's own int8 exports (oneDNN backend) with MXNet's outputs.

Usage (inside the fixture venv, see README.md)::

    python tools/mxnet_fixtures/generate_quantized.py --out tests/fixtures/mxnet_quantized

Each model is built with random weights (fixed seeds, every BatchNorm with random affine
terms and running statistics measured on random inputs), calibrated on a few random batches
by ``mxnet.contrib.quantization`` and exported as MXNet writes it. ``<out>/<name>/`` holds
``<name>-symbol.json``, ``<name>-0000.params``, ``io.npz`` (fixed inputs, the int8 model's
outputs and the float model's outputs), ``internals.npz`` (every node output of the int8
graph on the fixed inputs, keyed ``<node>:<output>``, for per-operator checks) and
``meta.json`` (how it was made, the ops in the graph, and the int8 model's top-1 agreement
with the float model).

The committed files were written on a CPU with VNNI, where oneDNN sums int8 products exactly
in int32; on other CPUs oneDNN may take other paths, and the values may differ by a step.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import gluonnlp as nlp
import mxnet as mx
import numpy as np
from gluoncv.model_zoo.mobilenet import get_mobilenet_v2
from gluoncv.model_zoo.resnet import BasicBlockV1, BottleneckV1, ResNetV1
from mxnet.contrib import quantization
from mxnet.gluon import nn

AGREEMENT_SAMPLES = 64  # random inputs for the int8-vs-float top-1 agreement
CALIB_BATCHES = 4
BATCH = 4


def randomise(block: mx.gluon.HybridBlock, rng: np.random.Generator) -> None:
    """Random BatchNorm affine terms and statistics (the statistics settled on data later), so
    folding them into convs is exercised."""
    for name, param in block.collect_params().items():
        shape = param.shape
        if name.endswith("running_var"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 2.0, shape)))
        elif name.endswith(("running_mean", "beta")):
            param.set_data(mx.nd.array(rng.normal(0.0, 0.2, shape)))
        elif name.endswith("gamma"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, shape)))
        elif name.endswith("bias"):
            param.set_data(mx.nd.array(rng.normal(0.0, 0.1, shape)))


class ConcatNet(mx.gluon.HybridBlock):
    """Two conv branches joined by Concat, a standalone BatchNorm, pooling and a Dense head:
    the graph where MXNet keeps `_contrib_quantized_concat` and `_contrib_quantized_batch_norm`."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.left = nn.Conv2D(8, 3, padding=1)
            self.right = nn.Conv2D(8, 1)
            self.norm = nn.BatchNorm()
            self.pool = nn.AvgPool2D(2)
            self.head = nn.Dense(10)

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's signature)
        joined = F.concat(F.relu(self.left(x)), F.relu(self.right(x)), dim=1)
        return self.head(F.flatten(self.pool(self.norm(joined))))


class BertBlock(mx.gluon.HybridBlock):
    """GluonNLP's BERT encoder (fused self-attention cells) on float embeddings."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.encoder = nlp.model.BERTEncoder(
                num_layers=1, units=32, hidden_size=64, max_length=16, num_heads=2,
                dropout=0.0, output_attention=False, output_all_encodings=False)
            self.head = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, x):  # noqa: N803
        # The encoder reads (length, batch, units); the block takes and gives batch first.
        encoded, _ = self.encoder(F.transpose(x, axes=(1, 0, 2)))
        return self.head(F.transpose(encoded, axes=(1, 0, 2)))


def thin_resnet18() -> mx.gluon.HybridBlock:
    """resnet18_v1's layout (7x7 stem, max pooling, BasicBlock v1, 2-2-2-2) at an eighth of its
    widths: the full model's float weights alone take 45 MB."""
    return ResNetV1(BasicBlockV1, [2, 2, 2, 2], [8, 8, 16, 32, 64], classes=10)


def thin_resnet50() -> mx.gluon.HybridBlock:
    """ResNet-50 v1's layout (Bottleneck v1, 3-4-6-3) at a sixteenth of its widths."""
    return ResNetV1(BottleneckV1, [3, 4, 6, 3], [4, 16, 32, 64, 128], classes=10,
                    thumbnail=True)


# name -> (builder, input shape, quantize function, its keyword arguments, description)
MODELS = {
    "resnet18_v1_naive": (
        thin_resnet18, (3, 32, 32),
        "quantize_net", {"calib_mode": "naive", "quantized_dtype": "auto"},
        "ResNetV1 with GluonCV's BasicBlockV1 in resnet18_v1's layout (7x7 stem, max pooling, "
        "2-2-2-2) at widths 8-8-16-32-64, 32x32 input; quantize_net, calib naive (min/max)"),
    "resnet50_v1_thin_entropy": (
        thin_resnet50, (3, 32, 32),
        "quantize_net_v2", {"calib_mode": "entropy", "quantized_dtype": "auto"},
        "ResNetV1 with GluonCV's BottleneckV1 in ResNet-50's 3-4-6-3 layout, widths "
        "4-16-32-64-128, thumbnail stem, 32x32 input; quantize_net_v2, calib entropy"),
    "mobilenet_v2_naive": (
        lambda: get_mobilenet_v2(0.25, classes=10), (3, 32, 32),
        "quantize_net_v2", {"calib_mode": "naive", "quantized_dtype": "auto"},
        "GluonCV MobileNetV2 x0.25, 10 classes, 32x32 input; quantize_net_v2, calib naive"),
    "bert_encoder_naive": (
        BertBlock, (8, 32),
        "quantize_net_v2", {"calib_mode": "naive", "quantized_dtype": "auto"},
        "GluonNLP BERTEncoder (1 layer, 32 units, 2 heads, hidden 64) on (batch, 8, 32) float "
        "embeddings + Dense(4); quantize_net_v2, calib naive"),
    "concat_bn_int8_naive": (
        ConcatNet, (3, 12, 12),
        "quantize_net_v2", {"calib_mode": "naive", "quantized_dtype": "int8"},
        "two conv branches, Concat, standalone BatchNorm, avg pooling, Dense; int8 data; "
        "quantize_net_v2, calib naive"),
    "resnet18_v1_uncalibrated": (
        thin_resnet18, (3, 32, 32),
        "quantize_net_v2", {"calib_mode": "none", "quantized_dtype": "auto"},
        "the thin resnet18_v1 layout without calibration: every range is taken from the data "
        "at hand and int32 sums are requantized by their own reach; quantize_net_v2, calib "
        "none"),
}


def build(name: str, seed: int) -> tuple[mx.gluon.HybridBlock, tuple[int, ...]]:
    builder, shape = MODELS[name][:2]
    mx.random.seed(seed)
    net = builder()
    net.initialize(mx.init.Xavier(magnitude=2.0))
    rng = np.random.default_rng(seed)
    net(mx.nd.array(rng.uniform(-1, 1, (1, *shape)).astype("float32")))
    randomise(net, rng)
    settle_batchnorm(net, samples(rng, CALIB_BATCHES * BATCH, shape))
    net.hybridize(static_alloc=True)
    return net, shape


def settle_batchnorm(net: mx.gluon.HybridBlock, data: np.ndarray, rounds: int = 12) -> None:
    """Running statistics measured on ``data`` (training-mode passes, momentum 0.9), as a
    trained network has them: with random statistics a deep random network's output hardly
    depends on its input, and its int8-vs-float agreement would say nothing. MXNet's oneDNN
    BatchNorm updates the statistics in the backward pass, hence the ``backward``."""
    for _ in range(rounds):
        for start in range(0, len(data), BATCH):
            with mx.autograd.record(train_mode=True):
                output = net(mx.nd.array(data[start:start + BATCH]))
            output.backward()


def quantize(name: str, net: mx.gluon.HybridBlock, calib: np.ndarray) -> mx.gluon.SymbolBlock:
    function, kwargs = MODELS[name][2:4]
    data = mx.io.NDArrayIter(data=calib, batch_size=BATCH)
    exclude = {"exclude_layers_match": ["pos_embed", "layer_norm"]} if "bert" in name else {}
    return getattr(quantization, function)(
        net, quantize_mode="full", calib_data=data, num_calib_examples=len(calib),
        ctx=mx.cpu(), **exclude, **kwargs)


def internals(prefix: Path, sample: np.ndarray) -> dict[str, np.ndarray]:
    """Every node output of the exported int8 graph on ``sample``, keyed ``node:output``."""
    symbol = mx.sym.load(f"{prefix}-symbol.json")
    params = mx.nd.load(f"{prefix}-0000.params")
    args = {key[4:]: value for key, value in params.items() if key.startswith("arg:")}
    auxs = {key[4:]: value for key, value in params.items() if key.startswith("aux:")}
    nodes = json.loads(symbol.tojson())["nodes"]
    group = symbol.get_internals()
    names = group.list_outputs()
    args["data"] = mx.nd.array(sample)
    executor = group.bind(mx.cpu(), args, aux_states=auxs, grad_req="null")
    outputs = executor.forward(is_train=False)
    arrays = {}
    known = sorted((node["name"] for node in nodes if node["op"] != "null"), key=len)
    counts: Counter[str] = Counter()
    for label, value in zip(names, outputs, strict=True):
        # A label is `<node>_<output name>`; the longest node name it starts with owns it.
        owners = [node for node in known if label.startswith(node + "_")]
        if owners:
            node = owners[-1]
            arrays[f"{node}:{counts[node]}"] = value.asnumpy()
            counts[node] += 1
    return arrays


def samples(rng: np.random.Generator, count: int, shape: tuple[int, ...],
            low: float = -1.0) -> np.ndarray:
    """Random inputs spread in scale and offset per sample (and per channel of images), so
    that a random network's classes differ from one input to the next."""
    values = rng.uniform(low, 1, (count, *shape))
    scale = rng.uniform(0.3, 2.0, (count,) + (1,) * len(shape))
    offset = rng.normal(0, 0.5, (count, shape[0]) + (1,) * (len(shape) - 1))
    spread = values * scale + (offset if low < 0 else np.abs(offset))
    return spread.astype("float32")


def agreement(float_many: np.ndarray, int8_many: np.ndarray) -> dict[str, object]:
    """Top-1 agreement of the int8 model with the float model, as is and on logits centred
    over the samples (a random network favours one class for most inputs; centring compares
    which class each input moves most)."""
    centred_float = float_many - float_many.mean(axis=0)
    centred_int8 = int8_many - int8_many.mean(axis=0)
    return {
        "samples": len(float_many),
        "agreement": float(np.mean(float_many.argmax(-1) == int8_many.argmax(-1))),
        "float_classes_seen": int(len(np.unique(float_many.argmax(-1)))),
        "centred_agreement": float(np.mean(centred_float.argmax(-1) == centred_int8.argmax(-1))),
    }


def write(folder: Path, name: str, inputs: np.ndarray, outputs: dict[str, np.ndarray],
          meta: dict[str, object]) -> None:
    """io.npz, internals.npz and meta.json beside an export already in ``folder``."""
    np.savez_compressed(folder / "io.npz", data=inputs, **outputs)
    np.savez_compressed(folder / "internals.npz", **internals(folder / name, inputs))
    graph = json.loads((folder / f"{name}-symbol.json").read_text())
    meta["ops"] = dict(sorted(Counter(node["op"] for node in graph["nodes"]).items()))
    meta["max_abs_int8_vs_float"] = float(
        np.abs(outputs["int8_output"] - outputs["float_output"]).max())
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(name, meta["ops"], meta["top1_agreement_int8_vs_float"])


def export(name: str, seed: int, out: Path) -> None:
    net, shape = build(name, seed)
    rng = np.random.default_rng(seed + 1)
    calib = samples(rng, CALIB_BATCHES * BATCH, shape)
    inputs = samples(rng, 2, shape)
    many = samples(rng, AGREEMENT_SAMPLES, shape)
    float_out = net(mx.nd.array(inputs)).asnumpy()
    float_many = net(mx.nd.array(many)).asnumpy()
    qnet = quantize(name, net, calib)
    int8_out = qnet(mx.nd.array(inputs)).asnumpy()
    int8_many = qnet(mx.nd.array(many)).asnumpy()
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    qnet.export(str(folder / name))
    write(folder, name, inputs, {"int8_output": int8_out, "float_output": float_out}, {
        "description": MODELS[name][4],
        "quantize": MODELS[name][2], "options": MODELS[name][3], "quantize_mode": "full",
        "calib_examples": len(calib), "seed": seed, "input": "data", "input_shape": [2, *shape],
        "top1_agreement_int8_vs_float": agreement(float_many, int8_many),
    })


PLAIN = "plain_symbol_naive"


def export_plain(seed: int, out: Path) -> None:
    """A symbol graph quantized by ``quantize_model`` (no oneDNN fusion pass): the standalone
    ``_contrib_quantized_conv``, ``_contrib_requantize`` (uncalibrated, as that path writes
    it), ``_contrib_quantized_act``, pooling and ``_contrib_quantized_fully_connected``.
    oneDNN's standalone int8 convolution reads uint8 only, so the inputs are non-negative."""
    shape = (3, 8, 8)
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=8, kernel=(3, 3), pad=(1, 1), name="conv0")
    relu = mx.sym.Activation(conv, act_type="relu", name="relu0")
    pool = mx.sym.Pooling(relu, kernel=(2, 2), stride=(2, 2), pool_type="max", name="pool0")
    head = mx.sym.FullyConnected(pool, num_hidden=10, name="fc0")
    mx.random.seed(seed)
    rng = np.random.default_rng(seed)
    module = mx.mod.Module(head, label_names=None)
    module.bind([("data", (BATCH, *shape))], for_training=False)
    module.init_params(mx.init.Xavier(magnitude=2.0))
    args, auxs = module.get_params()
    args = {key: value + mx.nd.array(rng.normal(0, 0.1, value.shape)) if key.endswith("bias")
            else value for key, value in args.items()}
    calib = samples(rng, CALIB_BATCHES * BATCH, shape, low=0.0)
    inputs = samples(rng, 2, shape, low=0.0)
    many = samples(rng, AGREEMENT_SAMPLES, shape, low=0.0)
    qsym, qargs, qauxs = quantization.quantize_model(
        head, args, auxs, ctx=mx.cpu(), calib_mode="naive",
        calib_data=mx.io.NDArrayIter(calib, batch_size=BATCH), num_calib_examples=len(calib),
        quantized_dtype="auto", quantize_mode="full", data_names=("data",), label_names=())

    def run(symbol: mx.sym.Symbol, arrays: dict, aux: dict, batch: np.ndarray) -> np.ndarray:
        executor = symbol.bind(mx.cpu(), {**arrays, "data": mx.nd.array(batch)},
                               aux_states=aux, grad_req="null")
        return executor.forward(is_train=False)[0].asnumpy()

    folder = out / PLAIN
    folder.mkdir(parents=True, exist_ok=True)
    qsym.save(str(folder / f"{PLAIN}-symbol.json"))
    mx.nd.save(str(folder / f"{PLAIN}-0000.params"),
               {**{f"arg:{k}": v for k, v in qargs.items()},
                **{f"aux:{k}": v for k, v in qauxs.items()}})
    write(folder, PLAIN, inputs, {"int8_output": run(qsym, qargs, qauxs, inputs),
                                  "float_output": run(head, args, auxs, inputs)}, {
        "description": "Convolution, relu, max pooling and FullyConnected as a symbol graph, "
                       "8x8 non-negative input; quantize_model, calib naive (no fusion pass)",
        "quantize": "quantize_model", "options": {"calib_mode": "naive",
                                                 "quantized_dtype": "auto"},
        "quantize_mode": "full", "calib_examples": len(calib), "seed": seed, "input": "data",
        "input_shape": [2, *shape],
        "top1_agreement_int8_vs_float": agreement(run(head, args, auxs, many),
                                                  run(qsym, qargs, qauxs, many)),
    })


OPS = "ops"


def op_cases(rng: np.random.Generator) -> list[tuple[str, mx.sym.Symbol, dict]]:
    """One-op graphs for int8 ops the model exports do not hold: ``_contrib_quantize`` (the
    first quantize op, range given as inputs), ``_contrib_quantized_elemwise_mul`` and the
    entropy calibration's ``_contrib_calibrate_entropy``."""
    x, low, high = mx.sym.var("x"), mx.sym.var("low"), mx.sym.var("high")
    cases = []
    for out_type, floor in (("uint8", 0.1), ("int8", -1.0)):
        node = mx.sym.contrib.quantize(x, low, high, out_type=out_type, name="quantize")
        cases.append((f"quantize_{out_type}", node, {
            "x": rng.uniform(min(floor, 0.0), 1.0, (4, 16)),
            "low": np.array([floor]), "high": np.array([1.0])}))
    a, b = mx.sym.var("a"), mx.sym.var("b")
    qa = mx.sym.contrib.quantize_v2(a, min_calib_range=-1.0, max_calib_range=1.0,
                                    out_type="int8", name="qa")
    qb = mx.sym.contrib.quantize_v2(b, min_calib_range=-0.5, max_calib_range=0.5,
                                    out_type="int8", name="qb")
    for label, options in (("int32", {}), ("calibrated", {"min_calib_range": -0.3,
                                                          "max_calib_range": 0.3}),
                           ("float", {"enable_float_output": True})):
        node = mx.sym.contrib.quantized_elemwise_mul(qa[0], qb[0], qa[1], qa[2], qb[1], qb[2],
                                                     name="mul", **options)
        cases.append((f"elemwise_mul_{label}", node, {
            "a": rng.uniform(-1, 1, (4, 16)), "b": rng.uniform(-0.5, 0.5, (4, 16))}))
    hist, edges = mx.sym.var("hist"), mx.sym.var("edges")
    for label, values, bins, quantized in (
            ("normal", rng.normal(0, 1, 20000), 801, 255),
            ("laplace", rng.laplace(0, 0.5, 20000), 1001, 511)):
        counts, bounds = np.histogram(values, bins=bins, range=(-4, 4))
        node = mx.sym.contrib.calibrate_entropy(hist, edges, num_quantized_bins=quantized,
                                                name="calibrate")
        cases.append((f"calibrate_entropy_{label}", node, {"hist": counts, "edges": bounds}))
    return cases


def export_ops(seed: int, out: Path) -> None:
    """``<out>/ops/cases.json`` (each case's graph as MXNet writes it) and ``cases.npz``
    (``<case>/<input>`` and ``<case>/out<k>``)."""
    rng = np.random.default_rng(seed)
    documents, arrays = {}, {}
    for case, node, feed in op_cases(rng):
        group = mx.sym.Group([node[k] for k in range(len(node.list_outputs()))])
        feed = {name: value.astype("float32") for name, value in feed.items()}
        executor = group.bind(mx.cpu(), {k: mx.nd.array(v) for k, v in feed.items()},
                              grad_req="null")
        documents[case] = json.loads(group.tojson())
        arrays.update({f"{case}/{name}": value for name, value in feed.items()})
        for number, value in enumerate(executor.forward(is_train=False)):
            arrays[f"{case}/out{number}"] = value.asnumpy()
    folder = out / OPS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cases.json").write_text(json.dumps(documents, indent=1) + "\n")
    np.savez_compressed(folder / "cases.npz", **arrays)
    print(OPS, sorted(documents))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None)
    options = parser.parse_args()
    for seed, name in enumerate(MODELS):
        if options.only is None or name in options.only:
            export(name, 100 + seed, options.out)
    if options.only is None or PLAIN in options.only:
        export_plain(150, options.out)
    if options.only is None or OPS in options.only:
        export_ops(200, options.out)


if __name__ == "__main__":
    main()
