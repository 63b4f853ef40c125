"""MXNet 1.9.1's int8 operators, as its oneDNN backend exports and runs them
(``mxnet.contrib.quantization.quantize_net``): conversions between float and int8/uint8
(`convert`), quantized layers that carry a range (`layers`), the fused convolution and fully
connected layers (`fused`), the fused self-attention products (`attention`) and the standalone
int8 convolution and fully connected layer of exports made without the fusion pass (`products`)
and the entropy calibration's threshold (`calibrate`); and two of ours the post-training
rewrite makes, a BatchNorm with its relu and a relu, each into uint8 (`rescale`), and a global
average pooling requantized over its calibrated range (`average`).

Values carry their real range beside them as two float32 scalars; `ranges` holds the scale
arithmetic and rounding they share, `integer` the exact integer products, `requantize` the
output stage of a fused layer and `subgraph_attrs` what a fused node's subgraph says.
The kernels run in NumPy on the host (`ranges.on_host`), on a GPU through host copies.

Importing this package registers its operators.
"""

from engine.ops.control.flow import carries_subgraphs
from engine.ops.quantized import (  # noqa: F401  (imported for their registrations)
    attention,
    average,
    calibrate,
    convert,
    fused,
    layers,
    products,
    rescale,
)
from engine.ops.registry import OpDef

for _fused in ("_sg_mkldnn_conv", "_sg_mkldnn_fully_connected", "_sg_mkldnn_selfatt_qk",
               "_sg_mkldnn_selfatt_valatt"):
    carries_subgraphs(_fused, 1)

# Every operator of this family, by its MXNet name.
QUANTIZED_OPS = tuple(sorted(
    op.name for module in (attention, average, calibrate, convert, fused, layers, products,
                           rescale)
    for op in vars(module).values() if isinstance(op, OpDef)))
