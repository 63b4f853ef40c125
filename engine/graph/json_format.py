"""MXNet symbol JSON: read it (legacy layouts too) into a `Graph`; write what MXNet 1.9.1 writes.

Reading validates everything a file can get wrong (types, references, arities, sizes) and raises
`ModelFormatError` naming the node by index and name. Files older than MXNet 1.9.1 get MXNet's
upgrades: legacy annotation keys become ``__x__`` keys, and files older than 0.9 get a variable for
every op input they omit. Writing reproduces MXNet's JSON writer byte for byte: two-space indent,
``", "`` separators before each newline, arrays on one line up to 10 plain items, objects on one
line up to 1 entry, sorted attribute keys and no final newline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from engine.errors import ModelFormatError, UnknownOperatorError
from engine.graph.ir import VARIABLE, Entry, Graph, Node, make_node, verify
from engine.ops.attrs import format_attr
from engine.ops.catalog import unsupported_reason
from engine.ops.control.flow import subgraph_count
from engine.ops.registry import is_annotation

MXNET_VERSION = 10901
MAX_NODES = 100_000
MAX_BYTES = 1 << 29
# Annotation keys that MXNet before 1.9.1 wrote without the ``__x__`` wrapping.
HIDDEN_KEYS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage",
               "profiler_scope")
_FIX_PARSING_BEFORE = MXNET_VERSION
_ADD_MISSING_INPUTS_BEFORE = 900
_LEGACY_VERSION = 800
_COUNT_ATTRS = ("num_args", "num_outputs")
MAX_SUBGRAPH_DEPTH = 8  # control flow nested deeper than this is refused, not recursed into


def graph_from_json(source: str | bytes | bytearray | memoryview | Mapping[str, Any], *,
                    max_nodes: int = MAX_NODES, max_bytes: int = MAX_BYTES) -> Graph:
    """Parse MXNet symbol JSON (text, bytes or an already-decoded dict) into a verified `Graph`.

    Args:
        source: the JSON document.
        max_nodes: refuse graphs with more nodes than this.
        max_bytes: refuse JSON text longer than this.

    Raises:
        ModelFormatError: malformed JSON, missing keys, wrong types, dangling or forward
            references, wrong input counts, bad heads, absurd sizes; the message names the node.
        UnknownOperatorError: a node names an operator the registry does not have.
    """
    document = _decode(source, max_bytes)
    return _read_graph(document, max_nodes, "symbol JSON", None, 0)


def _read_graph(document: Any, max_nodes: int, where: str, version: int | None,
                depth: int) -> Graph:
    """One graph document; a subgraph (``version`` given) inherits its parent's version."""
    if not isinstance(document, Mapping):
        raise ModelFormatError(f"{where}: expected an object at the top level; "
                               f"got {type(document).__name__}")
    raw_nodes = _require(document, "nodes", list, where)
    if len(raw_nodes) > max_nodes:
        raise ModelFormatError(f"{where}: {len(raw_nodes)} nodes is more than the limit of "
                               f"{max_nodes} (max_nodes)")
    graph_attrs = _graph_attrs(document.get("attrs", {}))
    if version is None:
        version = graph_attrs.get("mxnet_version", ("int", _LEGACY_VERSION))[1]
        graph_attrs["mxnet_version"] = ("int", MXNET_VERSION)
    reader = _Reader(version, max_nodes, len(raw_nodes), depth, where)
    for index, raw in enumerate(raw_nodes):
        reader.add(index, raw)
    raw_heads = _require(document, "heads", list, where)
    if not raw_heads:
        raise ModelFormatError(f"{where}: 'heads' is empty; a graph needs at least one output")
    heads = tuple(reader.entry(raw, f"{where} head #{position}", len(raw_nodes))
                  for position, raw in enumerate(raw_heads))
    graph = Graph(tuple(reader.nodes), heads, MappingProxyType(graph_attrs))
    return verify(graph)


def _decode(source: Any, max_bytes: int) -> Any:
    if isinstance(source, Mapping):
        return source
    if isinstance(source, memoryview):
        source = source.tobytes()
    if not isinstance(source, (str, bytes, bytearray)):
        raise ModelFormatError(f"symbol JSON: expected text, bytes or a dict; "
                               f"got {type(source).__name__}")
    if len(source) > max_bytes:
        raise ModelFormatError(f"symbol JSON: {len(source)} bytes is more than the limit of "
                               f"{max_bytes} (max_bytes)")
    try:
        return json.loads(source)
    except (ValueError, RecursionError) as error:
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; nesting too deep recurses.
        raise ModelFormatError(f"symbol JSON is not valid JSON: {error}") from None


def _require(mapping: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in mapping:
        raise ModelFormatError(f"{where}: required key {key!r} is missing")
    value = mapping[key]
    if not isinstance(value, kind):
        raise ModelFormatError(f"{where}: {key!r} must be a {kind.__name__}; "
                               f"got {type(value).__name__} {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _graph_attrs(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ModelFormatError(f"symbol JSON: 'attrs' must be an object; "
                               f"got {type(raw).__name__} {_short(raw)}")
    attrs: dict[str, Any] = {}
    for key, value in raw.items():
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
            raise ModelFormatError(f"symbol JSON: graph attribute {key!r} must be a "
                                   f"[type, value] pair; got {_short(value)}")
        attrs[key] = (value[0], value[1])
    version = attrs.get("mxnet_version")
    if version is not None and (version[0] != "int" or type(version[1]) is not int):
        raise ModelFormatError(f"symbol JSON: 'mxnet_version' must be [\"int\", N]; "
                               f"got {_short(raw['mxnet_version'])}")
    return attrs


class _Reader:
    """Builds nodes one by one, applying MXNet's legacy upgrades as it goes."""

    def __init__(self, version: int, max_nodes: int, total: int, depth: int = 0,
                 where: str = "symbol JSON") -> None:
        self.version = version
        self.depth = depth
        self.where = where  # "symbol JSON", or the path to a subgraph
        self.total = total
        self.max_nodes = max_nodes
        self.nodes: list[Node] = []
        self.position: list[int] = []  # file index -> index in self.nodes

    def add(self, index: int, raw: Any) -> None:
        if not isinstance(raw, Mapping):
            raise ModelFormatError(f"{self.where}: node #{index} must be an object; "
                                   f"got {type(raw).__name__} {_short(raw)}")
        where = f"{self.where}: node #{index}"
        op = _require(raw, "op", str, where)
        name = _require(raw, "name", str, where)
        where = f"{self.where}: node #{index} {name!r}"
        raw_inputs = _require(raw, "inputs", list, where)
        subgraphs = self._subgraphs(raw, where, op)
        attrs = _node_attrs(raw, where)
        hidden = _split_hidden(attrs) if self.version < _FIX_PARSING_BEFORE else {}
        inputs = tuple(self.entry(item, f"{where} input #{slot}", index)
                       for slot, item in enumerate(raw_inputs))
        if op == VARIABLE:
            if inputs:
                raise ModelFormatError(f"{where}: a variable (op 'null') must have no inputs; "
                                       f"got {len(inputs)}")
            # MXNet renames exact legacy keys on variables and keeps prefixed ones as written.
            attrs.update({(f"__{key}__" if key in HIDDEN_KEYS else key): value
                          for key, value in hidden.items()})
            node = make_node(VARIABLE, name, attrs)
        else:
            node = self._op_node(index, where, op, name, attrs, inputs, hidden, subgraphs)
        self.position.append(len(self.nodes))
        self.nodes.append(node)

    def _op_node(self, index: int, where: str, op: str, name: str, attrs: dict[str, str],
                 inputs: tuple[Entry, ...], hidden: dict[str, str],
                 subgraphs: tuple[Graph, ...]) -> Node:
        _check_counts(attrs, where, op, self.max_nodes)
        _refuse_unsupported(op, attrs, where)
        attrs.update({f"__{key}__": value for key, value in hidden.items() if key in HIDDEN_KEYS})
        try:
            node = make_node(op, name, attrs, inputs, subgraphs)
            expected = node.opdef.input_names(node.params)
        except ModelFormatError as error:
            raise type(error)(f"{self.where}: node #{index}: {error}") from None
        except Exception as error:  # a parser in the registry failed unexpectedly
            raise ModelFormatError(f"{where} ({op}): cannot read attributes: {error}") from error
        if len(inputs) < len(expected) and self.version < _ADD_MISSING_INPUTS_BEFORE:
            node = replace(node, inputs=inputs + self._missing_inputs(node, expected))
        if len(node.inputs) != len(expected):
            raise ModelFormatError(
                f"{where} ({op}): has {len(node.inputs)} inputs; expected {len(expected)} "
                f"({', '.join(expected)})")
        leftover = {key: value for key, value in hidden.items() if key not in HIDDEN_KEYS}
        return self._move_prefixed(node, expected, leftover) if leftover else node

    def _subgraphs(self, raw: Mapping[str, Any], where: str, op: str) -> tuple[Graph, ...]:
        """The graphs a control-flow node carries (``_foreach``'s body...), read recursively."""
        documents = raw.get("subgraphs", [])
        if not isinstance(documents, list):
            raise ModelFormatError(f"{where} ({op}): 'subgraphs' must be a list; "
                                   f"got {type(documents).__name__} {_short(documents)}")
        expected = subgraph_count(op)
        if len(documents) != expected:
            raise ModelFormatError(f"{where} ({op}): has {len(documents)} subgraphs; this op "
                                   f"takes {expected}")
        if documents and self.depth >= MAX_SUBGRAPH_DEPTH:
            raise ModelFormatError(f"{where} ({op}): subgraphs nested more than "
                                   f"{MAX_SUBGRAPH_DEPTH} deep")
        return tuple(_read_graph(document, self.max_nodes, f"{where} ({op}) subgraph #{number}",
                                 self.version, self.depth + 1)
                     for number, document in enumerate(documents))

    def _missing_inputs(self, node: Node, expected: tuple[str, ...]) -> tuple[Entry, ...]:
        # Files before MXNet 0.9 did not list auxiliary states: MXNet adds `<node>_<input>`.
        annotations = {key: value for key, value in node.attrs.items() if is_annotation(key)}
        added = []
        for input_name in expected[len(node.inputs):]:
            variable_name = f"{node.name}_{input_name}" if node.name else input_name
            added.append(Entry(len(self.nodes)))
            self.nodes.append(make_node(VARIABLE, variable_name, annotations))
        return tuple(added)

    def _move_prefixed(self, node: Node, expected: tuple[str, ...],
                       prefixed: dict[str, str]) -> Node:
        # `weight_lr_mult` on an op node becomes `__lr_mult__` on the variable feeding `weight`.
        kept: dict[str, str] = {}
        for key, value in prefixed.items():
            hidden_key = next(hk for hk in HIDDEN_KEYS if key.endswith("_" + hk))
            input_name = key[:-len(hidden_key) - 1]
            slot = expected.index(input_name) if input_name in expected else -1
            source = node.inputs[slot].node if slot >= 0 else -1
            if source >= 0 and self.nodes[source].is_variable:
                variable = self.nodes[source]
                self.nodes[source] = make_node(
                    VARIABLE, variable.name, {**variable.attrs, f"__{hidden_key}__": value})
            else:
                kept[key] = value
        if not kept:
            return node
        return replace(node, attrs=MappingProxyType({**node.attrs, **kept}))

    def entry(self, raw: Any, where: str, before: int) -> Entry:
        """One ``[node, index(, version)]`` entry, checked and renumbered to `self.nodes`."""
        if not (isinstance(raw, list) and len(raw) in (2, 3)
                and all(type(item) is int for item in raw)):
            raise ModelFormatError(f"{where}: expected [node, output, version] integers; "
                                   f"got {_short(raw)}")
        node, output = raw[0], raw[1]
        version = raw[2] if len(raw) == 3 else 0
        if not 0 <= node < before:
            if node < 0:
                problem = "a negative index"
            elif node < self.total:
                problem = ("not defined yet (a cycle, or nodes out of topological order); "
                           "inputs must refer to earlier nodes")
            else:
                problem = f"past the end (the file has {self.total} nodes)"
            raise ModelFormatError(f"{where} refers to node #{node}: {problem}")
        if output < 0 or version < 0:
            raise ModelFormatError(f"{where}: output index and version must not be negative; "
                                   f"got {_short(raw)}")
        source = self.nodes[self.position[node]]
        available = source.num_outputs()
        if output >= available:
            raise ModelFormatError(f"{where} reads output {output} of node #{node} "
                                   f"{source.describe()}, which has {available} outputs")
        return Entry(self.position[node], output, version)


def _refuse_unsupported(op: str, attrs: Mapping[str, str], where: str) -> None:
    """Refuse operators declared unsupported (``Custom``), naming a Custom node's ``op_type``."""
    reason = unsupported_reason(op)
    if reason is None:
        return
    op_type = f" with op_type {attrs['op_type']!r}" if "op_type" in attrs else ""
    raise UnknownOperatorError(f"{where}: operator {op!r}{op_type} is not supported: {reason}")


def _node_attrs(raw: Mapping[str, Any], where: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for field_name in ("param", "attr", "attrs"):  # legacy fields first; `attrs` wins
        values = raw.get(field_name)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ModelFormatError(f"{where}: {field_name!r} must be an object; "
                                   f"got {type(values).__name__} {_short(values)}")
        for key, value in values.items():
            if not isinstance(value, str):
                raise ModelFormatError(f"{where}: attribute {key!r} must be a string; "
                                       f"got {type(value).__name__} {_short(value)}")
            attrs[key] = value
    return attrs


def _split_hidden(attrs: dict[str, str]) -> dict[str, str]:
    """Remove and return legacy annotation keys (``lr_mult``, ``weight_lr_mult``...)."""
    hidden = {}
    for key in list(attrs):
        for hidden_key in HIDDEN_KEYS:
            exact = key == hidden_key
            prefixed = key.endswith("_" + hidden_key) and len(key) > len(hidden_key) + 1
            if exact or prefixed:
                hidden[key] = attrs.pop(key)
                break
    return hidden


def _check_counts(attrs: Mapping[str, str], where: str, op: str, limit: int) -> None:
    # Input and output lists are sized from these attributes: refuse absurd values before the
    # registry builds a list of a billion names.
    for key in _COUNT_ATTRS:
        text = attrs.get(key, "").strip()
        if text.isdigit() and len(text) < 40 and int(text) > limit:
            raise ModelFormatError(f"{where} ({op}): attribute {key!r} is {text}, more than the "
                                   f"limit of {limit}")


# ---------------------------------------------------------------------------------------------
# Writing


def graph_to_json(graph: Graph) -> str:
    """The symbol JSON MXNet 1.9.1 writes for ``graph`` (``mxnet_version`` set to 10901)."""
    graph_attrs = {key: _attr_pair(value) for key, value in graph.attrs.items()}
    graph_attrs["mxnet_version"] = ("int", MXNET_VERSION)
    return _graph_text(graph, graph_attrs, 0)


def _graph_text(graph: Graph, graph_attrs: dict[str, Any] | None, level: int) -> str:
    # A subgraph is written without graph attributes, as MXNet writes it.
    row_ptr = [0]
    for node in graph.nodes:
        total = 1 if node.is_variable else node.opdef.num_total_outputs(node.params)
        row_ptr.append(row_ptr[-1] + total)
    nodes = [_node_fields(node, level + 2) for node in graph.nodes]
    top = [
        ("nodes", _array([_object(fields, True, level + 2) for fields in nodes], True,
                         level + 1)),
        ("arg_nodes", _int_array(graph.variable_indices(), level + 1)),
        ("node_row_ptr", _int_array(row_ptr, level + 1)),
        ("heads", _entries(graph.heads, level + 1)),
    ]
    if graph_attrs is not None:
        top.append(("attrs", _string_map({key: _pair(value)
                                          for key, value in graph_attrs.items()}, level + 1)))
    return _object(top, True, level)


def _node_fields(node: Node, level: int = 2) -> list[tuple[str, str]]:
    fields = [("op", _string(node.op)), ("name", _string(node.name))]
    if node.attrs:
        attrs = {key: _string(format_attr(value)) for key, value in node.attrs.items()}
        fields.append(("attrs", _string_map(attrs, level + 1)))
    fields.append(("inputs", _entries(node.inputs, level + 1)))
    if not node.is_variable and node.subgraphs:
        subgraphs = [_graph_text(subgraph, None, level + 2) for subgraph in node.subgraphs]
        fields.append(("subgraphs", _array(subgraphs, True, level + 1)))
    return fields


def _attr_pair(value: Any) -> tuple[str, Any]:
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], str):
        return value[0], value[1]
    if isinstance(value, bool):
        return "int", int(value)
    if isinstance(value, int):
        return "int", value
    return "str", str(value)


def _pair(value: tuple[str, Any]) -> str:
    kind, content = value
    return _array([_string(kind), _scalar(content)], False, 0)


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    return json.dumps(value, separators=(", ", ": "))


def _entries(entries: tuple[Entry, ...] | list[Entry], level: int) -> str:
    items = [f"[{entry.node}, {entry.index}, {entry.version}]" for entry in entries]
    return _array(items, len(items) > 10, level)


def _int_array(values: list[int], level: int) -> str:
    return _array([str(value) for value in values], len(values) > 10, level)


def _string_map(values: Mapping[str, str], level: int) -> str:
    items = [(key, values[key]) for key in sorted(values)]
    return _object(items, len(items) > 1, level)


def _array(items: list[str], multi_line: bool, level: int) -> str:
    if not multi_line or not items:
        return "[" + ", ".join(items) + "]"
    indent = "\n" + "  " * (level + 1)
    return "[" + ", ".join(indent + item for item in items) + "\n" + "  " * level + "]"


def _object(items: list[tuple[str, str]], multi_line: bool, level: int) -> str:
    rendered = [f"{_string(key)}: {value}" for key, value in items]
    if not multi_line or not rendered:
        return "{" + ", ".join(rendered) + "}"
    indent = "\n" + "  " * (level + 1)
    return "{" + ", ".join(indent + item for item in rendered) + "\n" + "  " * level + "}"


_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(text: str) -> str:
    # MXNet escapes only these five; other control characters get \u escapes so the output
    # stays valid JSON (MXNet would write them raw).
    if _PLAIN.fullmatch(text):
        return '"' + text + '"'
    out = []
    for char in text:
        escaped = _ESCAPES.get(char)
        if escaped is None and char < " ":
            escaped = f"\\u{ord(char):04x}"
        out.append(escaped or char)
    return '"' + "".join(out) + '"'
