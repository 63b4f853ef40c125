"""Post-training int8 quantisation at load: a float32 graph rewritten into the int8 graph
MXNet's ``quantize_net`` (oneDNN backend) makes of it, with ranges calibrated on sample inputs.

`chains` finds the Convolution and FullyConnected layers with what oneDNN fuses into them,
`thresholds` turns the values a tensor takes into its calibrated range (min/max, or MXNet's
entropy threshold), `calibrate` runs the float graph to collect them, and `rewrite` builds the
int8 graph, whose nodes are the ones of `engine.ops.quantized`.
"""

from engine.quantize.calibrate import CalibrationSettings, calibrate_ranges
from engine.quantize.chains import find_chains
from engine.quantize.rewrite import quantize_graph

__all__ = ["CalibrationSettings", "calibrate_ranges", "find_chains", "quantize_graph"]
