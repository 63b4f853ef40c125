"""Write small whole-model exports built with GluonCV and GluonNLP, with MXNet's outputs.

Usage (inside the fixture venv, see README.md)::

    python tools/mxnet_fixtures/generate_models.py --out tests/fixtures/mxnet_extra

Each model lands in ``<out>/models/<name>/`` in the layout of ``tests/fixtures/mxnet/models``:
``<name>-symbol.json``, ``<name>-0000.params``, ``io.npz`` and ``meta.json``. Models are tiny,
randomly initialised with fixed seeds (no pretrained downloads), and every BatchNorm gets random
running statistics so that inference-mode normalisation is really exercised.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import families as cv
import families_text as text
import gluonnlp as nlp
import mxnet as mx
import numpy as np
from gluoncv.model_zoo.ssd import SSD
from mxnet.gluon import nn

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
RAW_BEFORE = ("_contrib_box_nms", "topk")  # ops whose input is a detector's raw head output


@dataclass
class ModelSpec:
    """A model to export: how to build it, its input batches, and a line describing it."""

    name: str
    built_with: str
    seed: int
    build: Callable[[], mx.gluon.HybridBlock]
    batches: Callable[[np.random.Generator], list[dict[str, np.ndarray]]]
    fixed_batch: bool = False  # the graph itself fixes the batch size (see meta.json)


class TinyBackbone(mx.gluon.HybridBlock):
    """Two feature maps (strides 4 and 8) from three conv-BN-ReLU layers."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.stage1 = nn.HybridSequential()
            for _ in range(2):
                self.stage1.add(nn.Conv2D(8, 3, strides=2, padding=1), nn.BatchNorm(),
                                nn.Activation("relu"))
            self.stage2 = nn.HybridSequential()
            self.stage2.add(nn.Conv2D(16, 3, strides=2, padding=1), nn.BatchNorm(),
                            nn.Activation("relu"))

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's signature)
        first = self.stage1(x)
        return [first, self.stage2(first)]


def build_ssd() -> mx.gluon.HybridBlock:
    """GluonCV's SSD head (anchors, box decoder, per-class NMS) on a tiny backbone."""
    return SSD(None, 64, lambda **kwargs: TinyBackbone(), num_filters=[], sizes=[10, 30, 64],
               ratios=[[1, 2, 0.5]] * 2, steps=[4, 8], classes=["a", "b", "c"],
               nms_thresh=0.45, nms_topk=50, post_nms=20, anchor_alloc_size=32)


def build_bert() -> mx.gluon.HybridBlock:
    """GluonNLP's BERT (interleaved attention matmuls, arange_like positions), 2 tiny layers."""
    encoder = nlp.model.BERTEncoder(num_layers=2, units=16, hidden_size=32, max_length=32,
                                    num_heads=2, dropout=0.0, output_attention=False,
                                    output_all_encodings=False)
    return nlp.model.BERTModel(encoder, vocab_size=50, token_type_vocab_size=2, units=16,
                               embed_size=16, use_pooler=True, use_decoder=False,
                               use_classifier=False)


def ssd_batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    return [{"data": rng.uniform(-1, 1, (size, 3, 64, 64)).astype(np.float32)}
            for size in (1, 2)]


def bert_batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    batches = []
    for size, length in ((2, 7), (3, 7)):  # servers fix every axis but the batch
        batches.append({
            "data0": rng.integers(0, 50, (size, length)).astype(np.float32),
            "data1": rng.integers(0, 2, (size, length)).astype(np.float32),
            "data2": rng.integers(1, length + 1, (size,)).astype(np.float32),
        })
    return batches


MODELS = (
    ModelSpec("gluoncv_ssd_tiny", "gluoncv.model_zoo.ssd.SSD on a 3-layer conv-BN backbone, "
              "64x64 input, 3 classes", 21, build_ssd, ssd_batches),
    ModelSpec("gluonnlp_bert_tiny", "gluonnlp.model.BERTModel: 2 layers, 16 units, 2 heads, "
              "vocab 50, with pooler", 22, build_bert, bert_batches),
    ModelSpec("gluoncv_resnet_v1b_tiny", "gluoncv BasicBlockV1b + BottleneckV1b, 32x32, 5 classes",
              31, cv.build_resnet_v1b, cv.image_batches(32)),
    ModelSpec("mxnet_resnet_v1_wide", "mxnet model_zoo BasicBlockV1 at 64 channels, 32x32 and "
              "16x16, 5 classes", 39, cv.build_resnet_v1_wide, cv.image_batches(32, (1, 3))),
    ModelSpec("gluoncv_resnet_v1d_tiny", "gluoncv V1b blocks, deep stem, avg_down, 32x32",
              32, cv.build_resnet_v1d, cv.image_batches(32)),
    ModelSpec("gluoncv_se_resnext_tiny", "gluoncv ResNext Block use_se, cardinality 4, 32x32",
              33, cv.build_se_resnext, cv.image_batches(32)),
    ModelSpec("gluoncv_resnest_tiny", "gluoncv ResNeSt Bottleneck, split attention radix 2, "
              "32x32", 34, cv.build_resnest, cv.image_batches(32)),
    ModelSpec("gluoncv_mobilenet_v3_tiny", "gluoncv _MobileNetV3, 4 units, multiplier 0.5, 32x32",
              35, cv.build_mobilenet_v3, cv.image_batches(32)),
    ModelSpec("gluoncv_yolo3_tiny", "gluoncv YOLOV3 on 3 conv-BN stages, 64x64, 3 classes",
              36, cv.build_yolo3, cv.image_batches(64)),
    ModelSpec("gluoncv_faster_rcnn_tiny", "gluoncv FasterRCNN, stride-16 backbone, ROIAlign 4x4, "
              "64x64, batch 1", 46, cv.build_faster_rcnn, cv.image_batches(64, (1, 1)),
              fixed_batch=True),
    ModelSpec("mxnet_rcnn_tiny", "MXNet example/rcnn style: RPN, contrib.MultiProposal, "
              "ROIPooling, 48x48", 47, cv.build_classic_rcnn, cv.rcnn_batches),
    ModelSpec("gluoncv_center_net_tiny", "gluoncv CenterNet, stride-4 backbone, 64x64, top 10",
              37, cv.build_center_net, cv.image_batches(64)),
    ModelSpec("gluoncv_fcn_tiny", "gluoncv _FCNHead on a 3-layer backbone, 32x32, 4 classes",
              38, cv.build_fcn, cv.image_batches(32)),
    ModelSpec("gluoncv_deeplabv3_tiny", "gluoncv DeepLabV3 _ASPP head, 32x32, 4 classes",
              39, cv.build_deeplab, cv.image_batches(32)),
    ModelSpec("gluoncv_fast_scnn_tiny", "gluoncv FastSCNN, 64x64, 4 classes, no aux head",
              40, cv.build_fast_scnn, cv.image_batches(64)),
    ModelSpec("gluoncv_simple_pose_tiny", "gluoncv SimplePoseResNet, tiny ResNet, 2 deconvs, "
              "4 joints, 64x64", 41, cv.build_simple_pose, cv.image_batches(64)),
    ModelSpec("gluonnlp_transformer_tiny", "gluonnlp Transformer encoder-decoder, 1 layer each, "
              "16 units, valid lengths", 42, text.build_transformer, text.translator_batches),
    ModelSpec("gluonnlp_lstm_lm_tiny", "gluonnlp StandardRNN LSTM LM, 2 layers, 16 units, "
              "batch-first wrapper", 43, text.build_lstm_lm, text.token_batches),
    ModelSpec("gluonnlp_gru_lm_tiny", "gluonnlp StandardRNN GRU LM, 1 layer, 16 units, "
              "batch-first wrapper", 44, text.build_gru_lm, text.token_batches),
    ModelSpec("arcface_tiny", "ArcFace-style: conv-BN-PReLU, fix_gamma BatchNorm embedding, "
              "cosine logits, 32x32", 45, text.build_arcface, cv.image_batches(32)),
)


# Exported as they are for serving, with their own layouts (time-major language models
# included), to ``<out>/serving/<name>``: what a configless upload must serve as MXNet runs it.
SERVING_MODELS = (
    ModelSpec("gluonnlp_bert_masked", "gluonnlp.model.BERTModel with pooler, classifier and "
              "masked-LM decoder: 2 layers, 64 units, 4 heads, vocab 100; batches 1 and 4",
              51, text.build_bert_masked, text.bert_masked_batches),
    ModelSpec("gluonnlp_lstm_lm_tnc", "gluonnlp StandardRNN LSTM LM (TNC), 2 layers, 32 units, "
              "begin states as inputs; batches 1 and 4", 52, text.build_lstm_lm_tnc,
              text.lstm_tnc_batches),
    ModelSpec("gluonnlp_gru_lm_tnc", "gluonnlp StandardRNN GRU LM (TNC) exported as it is, "
              "2 layers, 32 units; batches 1 and 4", 53, text.build_gru_lm_tnc,
              text.gru_tnc_batches),
    ModelSpec("gluonnlp_transformer_small", "gluonnlp Transformer encoder-decoder, 1 layer "
              "each, 32 units, vocab 100, valid lengths; batches 1 and 4", 54,
              text.build_transformer_small, text.transformer_small_batches),
)


def randomise_batchnorm(block: mx.gluon.HybridBlock, rng: np.random.Generator) -> None:
    """Give every BatchNorm non-trivial running statistics, gamma and beta."""
    for name, param in block.collect_params().items():
        shape = param.shape
        if name.endswith("running_mean") or name.endswith("beta"):
            param.set_data(mx.nd.array(rng.normal(0, 0.3, shape)))
        elif name.endswith("running_var") or name.endswith("gamma"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, shape)))


def widen_tiny_weights(block: mx.gluon.HybridBlock, rng: np.random.Generator) -> None:
    """Redraw weights that their layer initialised near zero (GluonCV's heads use Normal(0.001)
    or Normal(0.01)), so that outputs are large enough for the tolerances to mean something."""
    for name, param in block.collect_params().items():
        if name.endswith("weight") and float(param.data().abs().max().asscalar()) < 0.05:
            param.set_data(mx.nd.array(rng.normal(0, 0.3, param.shape)))


def flatten(outputs: object) -> list[mx.nd.NDArray]:
    """A block's outputs in the order export() writes them (nested lists, e.g. RNN states)."""
    if isinstance(outputs, (list, tuple)):
        return [leaf for item in outputs for leaf in flatten(item)]
    return [outputs]


def export(spec: ModelSpec, out_dir: Path, group: str = "models",
           finish: Callable[[list[mx.nd.NDArray]], list[mx.nd.NDArray]] | None = None) -> None:
    """Build, run and export one model with its reference inputs and outputs.

    The model lands in ``<out_dir>/<group>/<name>``; ``finish`` may rewrite a batch's outputs
    before they are saved (control flow zeroes what MXNet leaves uninitialised).
    """
    mx.random.seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    with mx.name.NameManager():  # fresh name counters: names do not depend on the run's order
        block = spec.build()
    block.initialize(mx.init.Xavier(magnitude=3))
    batches = spec.batches(rng)
    block(*[mx.nd.array(value) for value in batches[0].values()])  # finish deferred shapes
    randomise_batchnorm(block, rng)
    widen_tiny_weights(block, rng)
    block.hybridize(static_alloc=True)
    folder = out_dir / group / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    arrays, io_sets = {}, []
    for number, batch in enumerate(batches):
        outputs = flatten(block(*[mx.nd.array(value) for value in batch.values()]))
        outputs = finish(outputs) if finish else outputs
        prefix = "" if number == 0 else f"batch{number}/"
        io_sets.append({"inputs": {name: prefix + name for name in batch},
                        "outputs": [f"{prefix}out{k}" for k in range(len(outputs))]})
        arrays.update({prefix + name: value for name, value in batch.items()})
        arrays.update({f"{prefix}out{k}": value.asnumpy() for k, value in enumerate(outputs)})
    block.export(str(folder / spec.name))
    raw = raw_heads(folder, spec.name, batches[0])
    arrays.update({entry["key"]: value for entry, value in raw})
    np.savez_compressed(folder / "io.npz", **arrays)
    write_meta(spec, folder, batches[0], arrays, io_sets)
    if raw:
        meta = json.loads((folder / "meta.json").read_text())
        meta["raw_outputs"] = [entry for entry, _ in raw]
        (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def raw_heads(folder: Path, name: str,
              batch: dict[str, np.ndarray]) -> list[tuple[dict, np.ndarray]]:
    """What a detector feeds its NMS or top-k, computed by MXNet from the exported files.

    Post-NMS rows are compared as sets; these raw head outputs are compared position by position.
    Returns ({"node", "index", "key"}, value) pairs for the first io set.
    """
    symbol_json = json.loads((folder / f"{name}-symbol.json").read_text())
    nodes = symbol_json["nodes"]
    entries = [nodes[node["inputs"][0][0]]["name"] for node in nodes if node["op"] in RAW_BEFORE]
    if not entries:
        return []
    indexes = [node["inputs"][0][1] for node in nodes if node["op"] in RAW_BEFORE]
    internals = mx.sym.load(str(folder / f"{name}-symbol.json")).get_internals()
    outputs = internals.list_outputs()
    group = mx.sym.Group([internals[[out for out in outputs if out.startswith(entry + "_")][index]]
                          for entry, index in zip(entries, indexes)])
    saved = mx.nd.load(str(folder / f"{name}-0000.params"))
    values = {key.split(":", 1)[1]: value for key, value in saved.items()}
    values.update({key: mx.nd.array(value) for key, value in batch.items()})
    executor = group.bind(mx.cpu(), {key: values[key] for key in group.list_arguments()},
                          aux_states={key: values[key] for key in group.list_auxiliary_states()},
                          grad_req="null")
    results = executor.forward(is_train=False)
    return [({"node": entry, "index": index, "key": f"raw/out{k}"}, result.asnumpy())
            for k, (entry, index, result) in enumerate(zip(entries, indexes, results))]


def write_meta(spec: ModelSpec, folder: Path, first: dict[str, np.ndarray],
               arrays: dict[str, np.ndarray], io_sets: list[dict]) -> None:
    """``meta.json`` in the conformance models' format."""
    symbol = json.loads((folder / f"{spec.name}-symbol.json").read_text())
    meta = {
        "name": spec.name,
        "built_with": spec.built_with,
        "symbol_file": f"{spec.name}-symbol.json",
        "params_file": f"{spec.name}-0000.params",
        "inputs": [{"name": name, "shape": list(value.shape), "dtype": value.dtype.name}
                   for name, value in first.items()],
        "outputs": [{"key": key, "shape": list(arrays[key].shape),
                     "dtype": arrays[key].dtype.name} for key in io_sets[0]["outputs"]],
        "io_sets": io_sets,
        "ops": sorted({node["op"] for node in symbol["nodes"]} - {"null"}),
        "np_shape_mode": False,
        "fixed_batch": spec.fixed_batch,
        "seed": spec.seed,
        "produced_by": f"MXNet {mx.__version__}, CPU, inference mode",
        "tolerance": TOLERANCE,
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="fixture root; models go to <out>/models/<name>, the serving "
                        "set to <out>/serving/<name>")
    parser.add_argument("--only", nargs="*", help="export just these model names")
    args = parser.parse_args()
    for group, specs in (("models", MODELS), ("serving", SERVING_MODELS)):
        for spec in specs:
            if args.only and spec.name not in args.only:
                continue
            export(spec, args.out, group)
            print(f"exported {group}/{spec.name}")


if __name__ == "__main__":
    main()
