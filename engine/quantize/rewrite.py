"""The int8 graph of a float32 graph, as MXNet's ``quantize_net`` (oneDNN) builds it.

Each chain (`chains`) becomes one fused node, ``_sg_mkldnn_conv`` or
``_sg_mkldnn_fully_connected``, carrying the float nodes it replaces as its subgraph, reading
int8/uint8 data and writing int8/uint8 over its calibrated output range: the requantization
happens inside the producing kernel. The fused nodes keep the float weights (and BatchNorm's
statistics), which they fold and quantize per output channel once when a plan binds. A float
value a fused node reads goes through ``_contrib_quantize_v2`` over its calibrated range; a
fused node's value a float node (or a graph output) reads goes through
``_contrib_dequantize``. A fully connected layer read only by float nodes writes float32
(``enable_float_output``), as MXNet's last layer does. A max pooling of int8/uint8 values
pools them as they are (``_contrib_quantized_pooling``), keeping their range; a BatchNorm of
int8/uint8 values with a relu after it runs on them as one node writing uint8 over the relu's
calibrated range (``_quantized_batch_norm_relu``), and a relu of int8/uint8 values whose
result a quantized layer reads as one writing uint8 (``_quantized_relu``); a global average
pooling of int8/uint8 values whose result a quantized layer reads (flattened or not) sums
them exactly and requantizes over that result's range (``_quantized_global_average``), its
Flatten as ``_contrib_quantized_flatten``. A residual sum
whose other operand is signed keeps its relu fused: the node carries ``out_of_place_sum``,
writing the relu's uint8 over its whole range where MXNet's in-place sum would saturate it
at 127 steps through the int8 residual's buffer.

On a host whose int8 GEMM is the AVX2 kernel (no AVX-512 VNNI), a convolution of one group
carries ``narrow_weights``: its weights are quantized within ±63 (7 bits with the sign, half
the steps of MXNet's ±127), which that host multiplies on ``vpmaddubsw`` without saturating,
about 1.5 times as fast as full-range weights (`gemm_int8.narrow_weights_pay`). The model's
quantization then depends on the host; the load-time precision check records it
(`engine.serving.precision_check`). MXNet's own int8 exports keep their full-range weights.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from engine.graph.ir import Entry, Graph, Node, make_node
from engine.quantize.chains import Chain, is_global_average

Range = tuple[float, float]


def quantize_graph(graph: Graph, chains: Sequence[Chain], ranges: Mapping[Entry, Range],
                   narrow_weights: bool | None = None) -> Graph:
    """``graph`` with ``chains`` quantized over ``ranges`` (by float entry, as
    `calibrate.watched_entries` lists them). ``narrow_weights``: whether convolutions of one
    group take weights within ±63 (see the module); by default where this host's int8 GEMM
    runs them faster."""
    if narrow_weights is None:
        narrow_weights = narrow_weights_here()
    return _Rewriter(graph, chains, ranges, narrow_weights).run()


def narrow_weights_here() -> bool:
    """Whether this host's int8 GEMM multiplies weights within ±63 faster than full-range
    ones (AVX2 without VNNI), so that the rewrite quantizes convolutions' weights so."""
    from engine.kernels import gemm_int8

    return gemm_int8.narrow_weights_pay()


def narrowed_layers(graph: Graph) -> int:
    """How many of ``graph``'s nodes carry ``narrow_weights`` (weights within ±63)."""
    return sum(node.attrs.get("narrow_weights") == "True" for node in graph.nodes)


class _Rewriter:
    def __init__(self, graph: Graph, chains: Sequence[Chain],
                 ranges: Mapping[Entry, Range], narrow_weights: bool = False) -> None:
        self.graph, self.ranges = graph, ranges
        self.narrow_weights = narrow_weights
        self.by_last = {chain.last: chain for chain in chains}
        self.inside = {index for chain in chains for index in chain.members} - set(self.by_last)
        self.nodes: list[Node] = []
        self.floats: dict[Entry, Entry] = {}  # float value of the old graph -> new entry
        self.quantized: dict[Entry, tuple[Entry, Entry, Entry]] = {}  # -> (q, min, max)
        self.quantized_readers = Counter(
            Entry(graph.nodes[chain.main].inputs[0].node, graph.nodes[chain.main].inputs[0].index)
            for chain in chains)
        self.quantized_readers.update(chain.summand for chain in chains if chain.summand)
        self.readers: dict[Entry, list[int]] = {}
        for index, node in enumerate(graph.nodes):
            for entry in node.inputs:
                self.readers.setdefault(Entry(entry.node, entry.index), []).append(index)
        self.outputs = {Entry(entry.node, entry.index) for entry in graph.heads}

    def run(self) -> Graph:
        for index, node in enumerate(self.graph.nodes):
            if index in self.inside:
                continue
            if index in self.by_last:
                self._fused(self.by_last[index])
            elif not (self._int8_max_pool(index, node)
                      or self._int8_batchnorm_relu(index, node)
                      or self._int8_relu(index, node)
                      or self._int8_global_average(index, node)
                      or self._int8_flatten(index, node)):
                inputs = tuple(self._float(entry) for entry in node.inputs)
                self.floats.update({Entry(index, out): Entry(len(self.nodes), out)
                                    for out in range(node.num_outputs())})
                self.nodes.append(Node(node.op, node.name, node.attrs, inputs, node.params))
        heads = tuple(self._float(entry) for entry in self.graph.heads)
        return self.graph.replace(nodes=tuple(self.nodes), heads=heads)

    def _append(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _float(self, old: Entry) -> Entry:
        """The new graph's float value of the old graph's ``old``."""
        key = Entry(old.node, old.index)
        if key not in self.floats:
            q, low, high = self.quantized[key]
            name = f"{self.graph.nodes[key.node].name}_dequantize"
            self.floats[key] = Entry(self._append(
                make_node("_contrib_dequantize", name, {}, (q, low, high))))
        return self.floats[key]

    def _int8(self, old: Entry) -> tuple[Entry, Entry, Entry]:
        """The new graph's int8/uint8 value (with its range) of the old graph's ``old``."""
        key = Entry(old.node, old.index)
        if key not in self.quantized:
            low, high = self.ranges[key]
            name = f"{self.graph.nodes[key.node].name}_quantize"
            index = self._append(make_node(
                "_contrib_quantize_v2", name,
                {"out_type": "auto", "min_calib_range": repr(low), "max_calib_range": repr(high)},
                (self._float(key),)))
            self.quantized[key] = (Entry(index, 0), Entry(index, 1), Entry(index, 2))
        return self.quantized[key]

    def _int8_max_pool(self, index: int, node: Node) -> bool:
        """Max pooling of a value the new graph holds in int8/uint8 becomes
        ``_contrib_quantized_pooling`` on those values, over their range (the largest of
        quantized values is the quantized largest, exactly), as MXNet quantizes it: no
        dequantize and quantize around it, and the values stay in the layers' hand-off."""
        source = Entry(node.inputs[0].node, node.inputs[0].index) if node.inputs else None
        if not (node.op == "Pooling" and node.params.pool_type == "max"
                and node.params.get("layout") in (None, "NCHW") and source in self.quantized):
            return False
        pooled = self._append(make_node("_contrib_quantized_pooling", node.name, {
            key: value for key, value in node.attrs.items() if not key.startswith("__")},
            self.quantized[source]))
        self.quantized[Entry(index, 0)] = (Entry(pooled, 0), Entry(pooled, 1),
                                           Entry(pooled, 2))
        return True

    def _int8_batchnorm_relu(self, index: int, node: Node) -> bool:
        """A BatchNorm over the channels of an int8/uint8 value, read alone by a relu whose
        value a quantized layer reads (so it has a calibrated range), becomes one
        ``_quantized_batch_norm_relu`` writing uint8 over the relu's range: a pre-activation
        block's BatchNorm runs on the integers, with no dequantize and quantize around it."""
        if node.op != "BatchNorm" or node.params.axis != 1 or len(node.inputs) < 5:
            return False
        source = Entry(node.inputs[0].node, node.inputs[0].index)
        relu = self._lone_reader(Entry(index, 0))
        if source not in self.quantized or relu is None or any(
                Entry(index, out) in self.readers or Entry(index, out) in self.outputs
                for out in (1, 2)):
            return False
        relu_node, relu_out = self.graph.nodes[relu], Entry(relu, 0)
        if not (relu_node.op == "Activation" and relu_node.params.act_type == "relu"
                and relu_out in self.ranges and self.ranges[relu_out][1] > 0):
            return False
        attrs = {key: value for key, value in node.attrs.items() if not key.startswith("__")}
        attrs.update(min_calib_range="0.0", max_calib_range=repr(self.ranges[relu_out][1]))
        q, low, high = self.quantized[source]
        params = tuple(self._float(entry) for entry in node.inputs[1:5])
        made = self._append(make_node("_quantized_batch_norm_relu", relu_node.name, attrs,
                                      (q, *params, low, high)))
        self.quantized[relu_out] = (Entry(made, 0), Entry(made, 1), Entry(made, 2))
        self.inside.add(relu)
        return True

    def _int8_relu(self, index: int, node: Node) -> bool:
        """A relu of an int8/uint8 value whose result a quantized layer reads (one no chain
        took in: its input read by other nodes too) becomes one ``_quantized_relu`` writing
        uint8 over the relu's calibrated range, with no dequantize and quantize around it."""
        out = Entry(index, 0)
        if not (node.op == "Activation" and node.params.act_type == "relu" and node.inputs
                and Entry(node.inputs[0].node, node.inputs[0].index) in self.quantized
                and self.quantized_readers[out] and self.ranges[out][1] > 0):
            return False
        made = self._append(make_node("_quantized_relu", node.name, {
            "min_calib_range": "0.0", "max_calib_range": repr(self.ranges[out][1])},
            self.quantized[Entry(node.inputs[0].node, node.inputs[0].index)]))
        self.quantized[out] = (Entry(made, 0), Entry(made, 1), Entry(made, 2))
        return True

    def _int8_global_average(self, index: int, node: Node) -> bool:
        """A global average pooling of an int8/uint8 value whose result (or its flattened
        result) has a calibrated range, a quantized layer reading it, becomes one
        ``_quantized_global_average`` writing over that range: each channel's integers
        summed exactly and scaled once, no dequantize and quantize around it."""
        source = Entry(node.inputs[0].node, node.inputs[0].index) if node.inputs else None
        if not (is_global_average(node) and source in self.quantized):
            return False
        out = Entry(index, 0)
        flatten = self._lone_reader(out)
        if out in self.ranges:
            low, high = self.ranges[out]
        elif flatten is not None and self.graph.nodes[flatten].op == "Flatten" and \
                Entry(flatten, 0) in self.ranges:
            low, high = self.ranges[Entry(flatten, 0)]
        else:
            return False
        if max(abs(low), abs(high)) <= 0:
            return False
        made = self._append(make_node("_quantized_global_average", node.name, {
            "min_calib_range": repr(low), "max_calib_range": repr(high)},
            self.quantized[source]))
        self.quantized[out] = (Entry(made, 0), Entry(made, 1), Entry(made, 2))
        return True

    def _int8_flatten(self, index: int, node: Node) -> bool:
        """A Flatten of an int8/uint8 value a quantized layer reads becomes
        ``_contrib_quantized_flatten``: the same bytes and range."""
        out = Entry(index, 0)
        source = Entry(node.inputs[0].node, node.inputs[0].index) if node.inputs else None
        if not (node.op == "Flatten" and source in self.quantized
                and self.quantized_readers[out]):
            return False
        made = self._append(make_node("_contrib_quantized_flatten", node.name, {},
                                      self.quantized[source]))
        self.quantized[out] = (Entry(made, 0), Entry(made, 1), Entry(made, 2))
        return True

    def _lone_reader(self, entry: Entry) -> int | None:
        """The one node reading ``entry`` once, when nothing else does (no graph output)."""
        readers = self.readers.get(entry, [])
        if len(readers) != 1 or entry in self.outputs:
            return None
        reader = self.graph.nodes[readers[0]]
        uses = sum(Entry(item.node, item.index) == entry for item in reader.inputs)
        return readers[0] if uses == 1 else None

    def _fused(self, chain: Chain) -> None:
        main = self.graph.nodes[chain.main]
        conv = main.op == "Convolution"
        data = self._int8(main.inputs[0])
        params = [self._float(entry) for entry in main.inputs[1:]]
        attrs = {"quantized": "True"}
        if conv:
            if chain.batchnorm is not None:
                params += [self._float(entry)
                           for entry in self.graph.nodes[chain.batchnorm].inputs[1:5]]
            summand = self._int8(chain.summand) if chain.summand is not None else None
            inputs = [data[0], *params, *(() if summand is None else (summand[0],)),
                      data[1], data[2], *(() if summand is None else summand[1:])]
            if self.narrow_weights and main.params.num_group == 1:
                attrs["narrow_weights"] = "True"
            attrs.update(with_bn=str(chain.batchnorm is not None),
                         with_act=str(chain.act is not None), with_sum=str(summand is not None),
                         with_postsum_act=str(chain.postsum_act is not None))
            if chain.postsum_act is not None and summand is not None \
                    and self.ranges[chain.summand][0] < 0:
                # a signed residual under the relu's uint8 output: written to the node's own
                # buffer, over its whole range (MXNet's in-place sum would cut it at 127)
                attrs["out_of_place_sum"] = "True"
        else:
            inputs = [data[0], *params, data[1], data[2]]
            attrs.update(with_eltwise=str(chain.act is not None), channel_wise_quantize="True")
        out = Entry(chain.last, 0)
        float_output = not conv and not self.quantized_readers[out]
        if float_output:
            attrs["enable_float_output"] = "True"
        else:
            low, high = self.ranges[out]
            attrs.update(min_calib_range=repr(low), max_calib_range=repr(high))
        name = self.graph.nodes[chain.last].name
        op = "_sg_mkldnn_conv" if conv else "_sg_mkldnn_fully_connected"
        index = self._append(make_node(op, name, attrs, tuple(inputs),
                                       (self._subgraph(chain),)))
        if float_output:
            self.floats[out] = Entry(index, 0)
        else:
            self.quantized[out] = (Entry(index, 0), Entry(index, 1), Entry(index, 2))

    def _subgraph(self, chain: Chain) -> Graph:
        """The chain's float nodes as a graph of their own (variables for what comes from
        outside), which the fused node reads its layer attributes from."""
        nodes: list[Node] = []
        local: dict[Entry, Entry] = {}
        for index in chain.members:
            node = self.graph.nodes[index]
            inputs = []
            for entry in node.inputs:
                key = Entry(entry.node, entry.index)
                if key not in local:
                    name = self.graph.nodes[key.node].name
                    nodes.append(make_node("null", name))
                    local[key] = Entry(len(nodes) - 1)
                inputs.append(local[key])
            attrs = {key: value for key, value in node.attrs.items()
                     if not key.startswith("__")}
            nodes.append(make_node(node.op, node.name, attrs, tuple(inputs)))
            local[Entry(index, 0)] = Entry(len(nodes) - 1)
        return Graph(tuple(nodes), (Entry(len(nodes) - 1),))
