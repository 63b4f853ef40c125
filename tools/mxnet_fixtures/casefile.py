"""Run one-node MXNet graphs and write them as operator cases (``cases.json`` + ``cases.npz``).

The format is the one ``tests/fixtures/mxnet/ops`` uses, so ``tests/conformance`` reads both:
each case carries the op, its string attributes, named inputs (with the ``aux`` flag MXNet gives
them), MXNet's own symbol JSON, the output shapes and dtypes, and optionally a tolerance. Arrays
live in the npz under ``<id>/in<k>`` and ``<id>/out<k>``.

Runs only inside the fixture venv (it imports mxnet); the engine never imports this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

MXNET_VERSION = 10901
OP_NODE = "op"


@dataclass
class Case:
    """One operator case: op, string attributes and named input arrays (in the op's order)."""

    id: str
    op: str
    inputs: dict[str, np.ndarray]
    attrs: dict[str, str] = field(default_factory=dict)
    tolerance: dict[str, float] | None = None
    unspecified: tuple[int, ...] = ()  # outputs whose values MXNet leaves undefined
    # MXNet runs the op only in place (_scatter_set_nd, _npi_boolean_mask_assign_*): it refuses
    # a graph variable as the array written, so the run copies input 0 first (see run_case).
    in_place: bool = False


def one_node_symbol(case: Case) -> mx.sym.Symbol:
    """MXNet's symbol for the case: a variable per input and one op node with every output.

    Built twice: the second time the entries feeding auxiliary states carry version 1, as
    MXNet's own composition writes them (the op mutates those variables).
    """
    first = _load(case, set())
    return _load(case, set(first.list_auxiliary_states()))


def _load(case: Case, aux: set[str]) -> mx.sym.Symbol:
    nodes = [{"op": "null", "name": name, "inputs": []} for name in case.inputs]
    nodes.append({"op": case.op, "name": OP_NODE, "attrs": case.attrs,
                  "inputs": [[k, 0, int(name in aux)] for k, name in enumerate(case.inputs)]})
    document = {"nodes": nodes, "arg_nodes": list(range(len(case.inputs))),
                "heads": [[len(nodes) - 1, 0, 0]],
                "attrs": {"mxnet_version": ["int", MXNET_VERSION]}}
    loaded = mx.sym.load_json(json.dumps(document))
    internals = loaded.get_internals()
    prefix = OP_NODE + "_"
    outputs = [internals[name] for name in internals.list_outputs() if name.startswith(prefix)]
    return mx.sym.Group(outputs) if len(outputs) > 1 else outputs[0]


def _after_copy(symbol: mx.sym.Symbol) -> mx.sym.Symbol:
    """The one-node graph with its first input read through ``_copy``: an intermediate array,
    which MXNet's planner lets the op write in place."""
    document = json.loads(symbol.tojson())
    nodes = document["nodes"]
    op_index = document["heads"][0][0]
    copied = nodes[op_index]["inputs"][0]
    nodes.insert(op_index, {"op": "_copy", "name": "in_place_copy", "inputs": [copied]})
    op_node = nodes[op_index + 1]
    op_node["inputs"] = [[op_index, 0, 0], *op_node["inputs"][1:]]
    document["heads"] = [[op_index + 1, k, 0] for _, k, _ in document["heads"]]
    document.pop("node_row_ptr", None)
    return mx.sym.load_json(json.dumps(document))


def run_case(case: Case) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The case's JSON record and arrays, with outputs computed by MXNet (CPU, inference)."""
    symbol = one_node_symbol(case)
    aux_names = set(symbol.list_auxiliary_states())
    args = {name: mx.nd.array(value, dtype=value.dtype) for name, value in case.inputs.items()
            if name not in aux_names}
    aux = {name: mx.nd.array(value, dtype=value.dtype) for name, value in case.inputs.items()
           if name in aux_names}
    runnable = _after_copy(symbol) if case.in_place else symbol
    executor = runnable.bind(mx.cpu(), args=args, aux_states=aux, grad_req="null")
    outputs = [output.asnumpy() for output in executor.forward(is_train=False)]
    arrays = {f"{case.id}/in{k}": value for k, value in enumerate(case.inputs.values())}
    arrays.update({f"{case.id}/out{k}": value for k, value in enumerate(outputs)})
    record: dict[str, Any] = {
        "id": case.id,
        "op": case.op,
        "attrs": case.attrs,
        "inputs": [{"name": name, "shape": list(value.shape), "dtype": value.dtype.name,
                    "aux": name in aux_names} for name, value in case.inputs.items()],
        "num_outputs": len(outputs),
        "outputs": [_output_spec(k, value, case) for k, value in enumerate(outputs)],
        "symbol": json.loads(symbol.tojson()),
    }
    if case.tolerance:
        record["tolerance"] = case.tolerance
    return record, arrays


def _output_spec(index: int, value: np.ndarray, case: Case) -> dict[str, Any]:
    spec: dict[str, Any] = {"shape": list(value.shape), "dtype": value.dtype.name}
    if index in case.unspecified:
        spec["unspecified"] = True
    return spec


def write_cases(cases: list[Case], out_dir: Path) -> None:
    """Run every case and write ``cases.json`` and ``cases.npz`` under ``out_dir``."""
    ids = [case.id for case in cases]
    duplicates = sorted({name for name in ids if ids.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate case ids: {duplicates}")
    records, arrays = [], {}
    for case in cases:
        try:
            record, case_arrays = run_case(case)
        except mx.base.MXNetError as error:
            raise RuntimeError(f"case {case.id!r} ({case.op}) failed in MXNet") from error
        records.append(record)
        arrays.update(case_arrays)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"format_version": 1,
                "produced_by": f"MXNet {mx.__version__}, CPU, forward with is_train=False",
                "generator": "tools/mxnet_fixtures/generate_ops.py",
                "num_cases": len(records), "cases": records}
    (out_dir / "cases.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    np.savez_compressed(out_dir / "cases.npz", **arrays)
