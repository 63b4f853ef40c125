"""MXNet's control-flow operators: ``_foreach``, ``_while_loop`` and ``_cond``.

Each node carries its subgraphs (``Node.subgraphs``, stored in the parsed attributes under
``subgraphs`` so that kernels see them). The kernels run a subgraph with the reference
interpreter (`subgraphs.evaluate`, which the runtime provides), once per step or branch:
correctness first, and the body is small in the exports that use these ops. The ``*_locs``
attributes say which node input feeds which subgraph input; a subgraph's inputs are its
variables in node order (MXNet's ``list_inputs``).

``_while_loop`` pads its stacked outputs to ``max_iterations`` rows; MXNet leaves the rows after
the last iteration uninitialised, this engine writes zeros there. ``_while_loop`` and ``_cond``
read a value on the host to decide what runs next, and ``_foreach`` allocates each step's values,
so none of them can run inside CUDA stream capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_int, parse_int_tuple
from engine.ops.control import subgraphs
from engine.ops.registry import Attrs, OpDef, Param, register
from engine.ops.shapes import merge

_LOCS = "node input positions feeding the subgraph's inputs, in its input order"
# How many subgraphs a node of each op carries: the loader checks every node against this.
SUBGRAPH_COUNTS = {"_foreach": 1, "_while_loop": 2, "_cond": 3}


def subgraph_count(op: str) -> int:
    """Subgraphs a node of ``op`` must carry (0 for every op but control flow and the fused
    ops that declared theirs with `carries_subgraphs`)."""
    return SUBGRAPH_COUNTS.get(op, 0)


def carries_subgraphs(op: str, count: int) -> None:
    """Declare that every node of ``op`` carries ``count`` subgraphs (oneDNN's fused
    ``_sg_mkldnn_*`` ops keep the layers they fuse as one), so the loader reads them."""
    SUBGRAPH_COUNTS[op] = count


def _outputs(attrs: Attrs) -> tuple[str, ...]:
    count = attrs.num_outputs
    return ("output",) if count == 1 else tuple(f"output{k}" for k in range(count))


def _subgraphs(attrs: Attrs, op: str) -> tuple[Any, ...]:
    graphs, count = attrs.get("subgraphs", ()), SUBGRAPH_COUNTS[op]
    if len(graphs) != count:
        raise ShapeError(f"{op} needs {count} subgraphs; the node has {len(graphs)}")
    return graphs


def _input_names(graph: Any) -> list[str]:
    return [graph.nodes[index].name for index in graph.variable_indices()]


def _run(graph: Any, values: Sequence[Any], xp: Any) -> list[Any]:
    """Run a subgraph on its inputs, given in its input order."""
    names = _input_names(graph)
    if len(names) != len(values):
        raise ShapeError(f"a subgraph takes {len(names)} inputs; the locations give "
                         f"{len(values)}")
    return subgraphs.evaluate(graph, dict(zip(names, values)), xp)


def _truth(value: Any, what: str) -> bool:
    """A one-element predicate read on the host, as MXNet reads it."""
    if value.size != 1:
        raise ShapeError(f"{what} must have one element; got shape {tuple(value.shape)}")
    return bool(value.reshape(-1)[0].item())


def _head_shapes(graph: Any, shapes: Sequence[Any]) -> list[Any]:
    """Shapes of a subgraph's outputs from its input shapes (None where unknown)."""
    known = {name: shape for name, shape in zip(_input_names(graph), shapes)
             if shape is not None}
    values = subgraphs.infer_shapes(graph, known)
    return [values[entry.node][entry.index] for entry in graph.heads]


def _head_dtypes(graph: Any, dtypes: Sequence[Any]) -> list[Any]:
    """Dtypes of a subgraph's outputs from its input dtypes."""
    known = {name: dtype for name, dtype in zip(_input_names(graph), dtypes)
             if dtype is not None}
    values = subgraphs.infer_dtypes(graph, known)
    return [values[entry.node][entry.index] for entry in graph.heads]


def _pick(values: Sequence[Any], locations: Sequence[int]) -> list[Any]:
    return [values[location] for location in locations]


# ---------------------------------------------------------------------------------------------
# _foreach: the body runs once per slice of the data inputs along axis 0, carrying states.


def _foreach_counts(attrs: Attrs) -> tuple[int, int, int]:
    return len(attrs.in_data_locs), len(attrs.in_state_locs), len(attrs.remain_locs)


def _foreach_inputs(attrs: Attrs) -> tuple[str, ...]:
    data, states, remain = _foreach_counts(attrs)
    return (tuple(f"data{k}" for k in range(data)) + tuple(f"state{k}" for k in range(states))
            + tuple(f"remain{k}" for k in range(remain)))


def _body_order(attrs: Attrs, data: Sequence[Any], states: Sequence[Any],
                remain: Sequence[Any]) -> list[Any]:
    """Node-side values placed in the body's input order."""
    locations = (*attrs.in_data_locs, *attrs.in_state_locs, *attrs.remain_locs)
    ordered: list[Any] = [None] * len(locations)
    for location, value in zip(locations, (*data, *states, *remain)):
        ordered[location] = value
    return ordered


def _foreach_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> tuple[Any, ...]:
    (body,) = _subgraphs(attrs, "_foreach")
    count, state_count, _ = _foreach_counts(attrs)
    data, states = inputs[:count], list(inputs[count:count + state_count])
    remain = inputs[count + state_count:]
    if data[0].shape[0] == 0:
        raise ShapeError("_foreach over an empty sequence (axis 0 has length 0)")
    steps: list[list[Any]] = [[] for _ in range(attrs.num_out_data)]
    for step in range(data[0].shape[0]):
        results = _run(body, _body_order(attrs, [item[step] for item in data], states, remain),
                       xp)
        for stacked, value in zip(steps, results):
            stacked.append(value)
        states = results[attrs.num_out_data:]
    return (*[xp.stack(stacked) for stacked in steps], *states)


def _foreach_shape(attrs: Attrs, shapes: list[Any]) -> tuple[list[Any], list[Any]]:
    (body,) = _subgraphs(attrs, "_foreach")
    count, state_count, _ = _foreach_counts(attrs)
    data = [None if shape is None else tuple(shape[1:]) for shape in shapes[:count]]
    heads = _head_shapes(body, _body_order(attrs, data, shapes[count:count + state_count],
                                           shapes[count + state_count:]))
    length = next((shape[0] for shape in shapes[:count] if shape is not None), None)
    outputs = [None if head is None or length is None else (length, *head)
               for head in heads[:attrs.num_out_data]]
    new_states = heads[attrs.num_out_data:]
    for slot, head in enumerate(new_states):  # a state keeps its shape from step to step
        shapes[count + slot] = merge(shapes[count + slot], head, f"state {slot}")
    return shapes, outputs + list(shapes[count:count + state_count])


def _foreach_dtype(attrs: Attrs, dtypes: list[Any]) -> tuple[list[Any], list[Any]]:
    (body,) = _subgraphs(attrs, "_foreach")
    count, state_count, _ = _foreach_counts(attrs)
    heads = _head_dtypes(body, _body_order(attrs, dtypes[:count],
                                           dtypes[count:count + state_count],
                                           dtypes[count + state_count:]))
    return dtypes, heads


# ---------------------------------------------------------------------------------------------
# _while_loop: run ``func`` while ``cond`` holds, at most ``max_iterations`` times.


def _loop_inputs(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"input{k}" for k in range(attrs.num_args - 2))


def _loop_var_slots(attrs: Attrs) -> list[int]:
    """Node input positions of the loop variables, in the order ``func`` returns them."""
    return [attrs.func_input_locs[location] for location in attrs.func_var_locs]


def _while_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> tuple[Any, ...]:
    cond, func = _subgraphs(attrs, "_while_loop")
    values, slots = list(inputs), _loop_var_slots(attrs)
    steps: list[list[Any]] = [[] for _ in range(attrs.num_out_data)]
    for _ in range(attrs.max_iterations):
        keep_going = _run(cond, _pick(values, attrs.cond_input_locs), xp)[0]
        if not _truth(keep_going, "the _while_loop condition"):
            break
        results = _run(func, _pick(values, attrs.func_input_locs), xp)
        for stacked, value in zip(steps, results):
            stacked.append(value)
        for slot, value in zip(slots, results[attrs.num_out_data:]):
            values[slot] = value
    outputs = _padded(xp, attrs, func, inputs, steps)
    return (*outputs, *_pick(values, slots))


def _padded(xp: Any, attrs: Attrs, func: Any, inputs: Sequence[Any],
            steps: list[list[Any]]) -> list[Any]:
    """Stacked step outputs, zero-padded to ``max_iterations`` rows."""
    given = _pick(inputs, attrs.func_input_locs)
    shapes = _head_shapes(func, [tuple(value.shape) for value in given])
    dtypes = _head_dtypes(func, [value.dtype for value in given])
    outputs = []
    for stacked, shape, dtype in zip(steps, shapes, dtypes):
        if shape is None:
            raise ShapeError("cannot infer the shape of a _while_loop output")
        padded = xp.zeros((attrs.max_iterations, *shape), dtype=dtype)
        if stacked:
            padded[:len(stacked)] = xp.stack(stacked)
        outputs.append(padded)
    return outputs


def _while_shape(attrs: Attrs, shapes: list[Any]) -> tuple[list[Any], list[Any]]:
    _, func = _subgraphs(attrs, "_while_loop")
    heads = _head_shapes(func, _pick(shapes, attrs.func_input_locs))
    outputs = [None if head is None else (attrs.max_iterations, *head)
               for head in heads[:attrs.num_out_data]]
    slots = _loop_var_slots(attrs)
    for slot, head in zip(slots, heads[attrs.num_out_data:]):
        shapes[slot] = merge(shapes[slot], head, f"loop variable {slot}")
    return shapes, outputs + _pick(shapes, slots)


def _while_dtype(attrs: Attrs, dtypes: list[Any]) -> tuple[list[Any], list[Any]]:
    _, func = _subgraphs(attrs, "_while_loop")
    heads = _head_dtypes(func, _pick(dtypes, attrs.func_input_locs))
    return dtypes, heads[:attrs.num_out_data] + _pick(dtypes, _loop_var_slots(attrs))


# ---------------------------------------------------------------------------------------------
# _cond: run ``then`` or ``else`` on the value of a one-element predicate.


def _cond_inputs(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"input{k}" for k in range(attrs.num_args - 3))


def _cond_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> tuple[Any, ...]:
    predicate, then_graph, else_graph = _subgraphs(attrs, "_cond")
    value = _run(predicate, _pick(inputs, attrs.cond_input_locs), xp)[0]
    if _truth(value, "the _cond predicate"):
        return tuple(_run(then_graph, _pick(inputs, attrs.then_input_locs), xp))
    return tuple(_run(else_graph, _pick(inputs, attrs.else_input_locs), xp))


def _cond_shape(attrs: Attrs, shapes: list[Any]) -> tuple[list[Any], list[Any]]:
    _, then_graph, else_graph = _subgraphs(attrs, "_cond")
    then_heads = _head_shapes(then_graph, _pick(shapes, attrs.then_input_locs))
    else_heads = _head_shapes(else_graph, _pick(shapes, attrs.else_input_locs))
    return shapes, [merge(first, second, f"branch output {slot}") for slot, (first, second)
                    in enumerate(zip(then_heads, else_heads, strict=True))]


def _cond_dtype(attrs: Attrs, dtypes: list[Any]) -> tuple[list[Any], list[Any]]:
    _, then_graph, else_graph = _subgraphs(attrs, "_cond")
    then_heads = _head_dtypes(then_graph, _pick(dtypes, attrs.then_input_locs))
    else_heads = _head_dtypes(else_graph, _pick(dtypes, attrs.else_input_locs))
    for slot, (first, second) in enumerate(zip(then_heads, else_heads)):
        if first is not None and second is not None and np.dtype(first) != np.dtype(second):
            raise ShapeError(f"_cond branch output {slot}: then gives {np.dtype(first).name}, "
                             f"else {np.dtype(second).name}")
    return dtypes, [first if first is not None else second
                    for first, second in zip(then_heads, else_heads)]


_COUNTS = (Param("num_args", parse_int, doc="inputs plus subgraphs"),
           Param("num_outputs", parse_int, doc="visible outputs"))

register(OpDef(
    name="_foreach", kernel=_foreach_kernel, infer_shape=_foreach_shape,
    infer_dtype=_foreach_dtype, inputs=_foreach_inputs, outputs=_outputs,
    params=(*_COUNTS, Param("num_out_data", parse_int, 0, "stacked per-step outputs"),
            Param("in_data_locs", parse_int_tuple, (), _LOCS),
            Param("in_state_locs", parse_int_tuple, (), _LOCS),
            Param("remain_locs", parse_int_tuple, (), _LOCS)),
    uncapturable="runs its body through the interpreter each step, allocating its values",
    doc="Run the body over axis 0 of the data inputs, carrying states; stack the outputs."))

register(OpDef(
    name="_while_loop", kernel=_while_kernel, infer_shape=_while_shape,
    infer_dtype=_while_dtype, inputs=_loop_inputs, outputs=_outputs,
    params=(*_COUNTS, Param("num_out_data", parse_int, 0, "stacked per-step outputs"),
            Param("max_iterations", parse_int, doc="rows the stacked outputs are padded to"),
            Param("cond_input_locs", parse_int_tuple, (), _LOCS),
            Param("func_input_locs", parse_int_tuple, (), _LOCS),
            Param("func_var_locs", parse_int_tuple, (), "func inputs that are loop variables")),
    uncapturable="reads its condition on the host after every step (a data-dependent loop)",
    doc="Run func while cond holds, at most max_iterations times; outputs zero-padded."))

register(OpDef(
    name="_cond", kernel=_cond_kernel, infer_shape=_cond_shape, infer_dtype=_cond_dtype,
    inputs=_cond_inputs, outputs=_outputs,
    params=(*_COUNTS, Param("cond_input_locs", parse_int_tuple, (), _LOCS),
            Param("then_input_locs", parse_int_tuple, (), _LOCS),
            Param("else_input_locs", parse_int_tuple, (), _LOCS)),
    uncapturable="reads its predicate on the host to pick a branch (data-dependent)",
    doc="Run the then or else subgraph, chosen by a one-element predicate."))
