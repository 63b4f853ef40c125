"""The operator registry: every fact about an operator lives in its `OpDef`.

`nd`, `sym`, shape and dtype inference, the JSON reader and writer, the compiler and the executor
all read these records; no other module hard-codes operator names or defaults.

A kernel is a plain function ``kernel(xp, attrs, *inputs)`` written against an array module
``xp`` (numpy or cupy) that returns one array or a tuple of arrays (the visible outputs). Kernels
that can write straight into preallocated outputs declare ``writes_out=True`` and accept
``out=`` (an array, or a tuple for several outputs); others are adapted by `OpDef.compute`.

Importing this module runs ``engine/ops/__init__.py`` first, which imports every family and so
registers every operator: the lookups below always see the whole table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from engine.errors import ModelFormatError, UnknownOperatorError
from engine.ops.attrs import Parser

Shape = tuple[int, ...]
MaybeShape = Shape | None
ShapeFn = Callable[["Attrs", list[MaybeShape]], tuple[list[MaybeShape], list[MaybeShape]]]
DTypeFn = Callable[["Attrs", list["np.dtype | None"]], tuple[list["np.dtype | None"],
                                                              list["np.dtype | None"]]]
Names = tuple[str, ...] | Callable[["Attrs"], tuple[str, ...]]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One operator attribute: its MXNet spelling, a parser and a default (or `REQUIRED`)."""

    name: str
    parse: Parser
    default: Any = REQUIRED
    doc: str = ""


class Attrs(Mapping[str, Any]):
    """Parsed, typed attribute values of one node; read as ``attrs.num_hidden`` or ``attrs[k]``."""

    __slots__ = ("_values", "_hash")

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)
        self._hash: int | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(sorted((k, repr(v)) for k, v in self._values.items())))
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"Attrs({inner})"


def is_annotation(key: str) -> bool:
    """Keys such as ``__shape__`` or ``__init__`` are annotations, not operator parameters."""
    return len(key) > 4 and key.startswith("__") and key.endswith("__")


def default_dtype(attrs: Attrs, dtypes: list[np.dtype | None]) -> tuple[list, list]:
    """Every input and output shares the first known dtype (float32 when none is known)."""
    known = next((dtype for dtype in dtypes if dtype is not None), None)
    return [known if dtype is None else dtype for dtype in dtypes], [known]


def first_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    """Output takes input 0's dtype; other inputs keep theirs."""
    return dtypes, [dtypes[0]]


def keep_input_dtypes(out_dtype: Callable[[Attrs, list], Any]) -> DTypeFn:
    """A dtype rule: inputs keep their dtypes, the output gets ``out_dtype(attrs, dtypes)``."""

    def infer(attrs: Attrs, dtypes: list) -> tuple[list, list]:
        return dtypes, [out_dtype(attrs, dtypes)]

    return infer


def emit(xp: Any, value: Any, out: Any) -> Any:
    """A fresh C-ordered copy of ``value``, or ``value`` written into ``out``."""
    if out is None:
        return value.copy()
    xp.copyto(out, value, casting="unsafe")
    return out


@dataclass(frozen=True)
class OpDef:
    """Everything the engine knows about one operator.

    Attributes:
        name: MXNet's canonical operator name, as written in symbol JSON.
        kernel: ``kernel(xp, attrs, *inputs[, out=])`` returning the visible outputs.
        infer_shape: ``(attrs, input_shapes) -> (input_shapes, output_shapes)``; shapes may be
            ``None`` (unknown) or contain 0 for an unknown dimension, and the function fills in
            what it can (for example a FullyConnected weight from the data width).
        params: the attribute schema, in MXNet's spelling, with defaults.
        inputs: input names (or a function of the attrs, for variadic ops and optional bias).
        aux: which input names are auxiliary states (BatchNorm's moving statistics).
        outputs: visible output names (or a function of the attrs).
        hidden_outputs: outputs MXNet counts in ``node_row_ptr`` but never exposes.
        infer_dtype: ``(attrs, input_dtypes) -> (input_dtypes, output_dtypes)``.
        aliases: other names that resolve to this op (NumPy-mode ``_npi_*`` names, ``split``...).
        elementwise: for elementwise ops, a C expression over inputs ``a``, ``b`` (and attrs as
            ``{name}``) that the fusion pass can inline into one generated kernel, or a function
            of the attrs giving it (ops such as Activation whose formula depends on an attr).
        inplace: the output may share storage with input 0.
        writes_ahead: a node reading this op's output may have its own output written by
            this op's step (a second output asked at bind), while the step still reads its
            input 0: memory planning gives that reader's outputs no buffer of input 0 (or a
            function of the attrs saying which nodes of the op may).
        view: the output is a view of input 0 (reshape-like); memory planning keeps it alive.
        writes_out: the kernel accepts ``out=`` and writes into it.
        bind: optional ``bind(xp, attrs, inputs, out) -> [call, ...]`` giving zero-argument
            calls that compute into ``out`` for arrays fixed at plan compile time: the hot path
            of a plan, with views and checks done once (FullyConnected as matmul + bias add).
        scratch: optional ``scratch(attrs, input_shapes, dtype) -> bytes`` of working memory
            the bound op needs; a plan sizes its `Workspace` scratch buffer (shared by all its
            steps) to the largest need and passes it as ``bind(xp, attrs, inputs, out,
            workspace)``.
        uncapturable: why the kernel cannot run inside CUDA stream capture, for one that must
            read its inputs on the host on every run (a data-dependent loop, such as ROIAlign's
            per-ROI sampling grids) or calls a CuPy routine CuPy refuses during capture
            (``cupy.linalg``'s cuSOLVER). A GPU plan with such a node is never captured as a
            CUDA graph: it runs its steps one by one and its stats name the node and the reason
            (see `engine.runtime.plan.capture_blocker`). Empty for every other op.
        dynamic_shape: why an output's shape depends on the input values, not only on their
            shapes (``_contrib_boolean_mask`` keeps the rows its mask selects), or a function of
            the attrs giving it (empty when the shape does not: ``_npi_delete`` with a static
            index). Shape inference leaves such dimensions unknown (0); a compiled model then
            runs in stages cut after these nodes (see `engine.runtime.staged`), and a server
            never batches its requests together. Empty for every other op.
        batch_positions: why a row's result depends on where the row sits along axis 0 while
            every shape stays the same (``_slice_assign_scalar`` writing rows 1 to 3), or a
            function of the attrs giving it (empty when the attrs keep axis 0 whole). A batch
            cut into runs of rows would apply those positions within each run, so such a node
            keeps the batch whole (see `engine.runtime.batch_split.split_blocker`). Empty for
            every other op.
        parts: for a composite op (a fused chain), ``parts(attrs) -> (OpDef, ...)``: the ops
            one of its nodes runs, in order. Capture checks read these rather than the
            composite's own ``uncapturable``, and profiles label the node by their names.
    """

    name: str
    kernel: Callable[..., Any]
    infer_shape: ShapeFn
    params: tuple[Param, ...] = ()
    inputs: Names = ("data",)
    aux: tuple[str, ...] = ()
    outputs: Names = ("output",)
    hidden_outputs: int | Callable[[Attrs], int] = 0
    infer_dtype: DTypeFn = default_dtype
    aliases: tuple[str, ...] = ()
    elementwise: str | Callable[[Attrs], str | None] | None = None
    inplace: bool = False
    writes_ahead: bool | Callable[[Attrs], bool] = False
    view: bool = False
    writes_out: bool = False
    bind: Callable[..., list[Callable[[], Any]]] | None = None
    scratch: Callable[[Attrs, list[Any], Any], int] | None = None
    uncapturable: str = ""
    dynamic_shape: str | Callable[[Attrs], str] = ""
    batch_positions: str | Callable[[Attrs], str] = ""
    parts: Callable[[Attrs], tuple[OpDef, ...]] | None = None
    doc: str = ""
    _params_by_name: dict[str, Param] = field(default_factory=dict, init=False, repr=False,
                                              compare=False)

    @property
    def capturable(self) -> bool:
        """Whether the kernel can run inside CUDA stream capture (see ``uncapturable``)."""
        return not self.uncapturable

    def shape_depends_on_data(self, attrs: Attrs) -> str:
        """Why a node with ``attrs`` has an output shape set by its input values ("" if not)."""
        return self.dynamic_shape(attrs) if callable(self.dynamic_shape) else self.dynamic_shape

    def may_write_ahead(self, attrs: Attrs) -> bool:
        """Whether a node with ``attrs`` may write its readers' outputs (``writes_ahead``)."""
        return bool(self.writes_ahead(attrs) if callable(self.writes_ahead)
                    else self.writes_ahead)

    def reads_batch_positions(self, attrs: Attrs) -> str:
        """Why a node with ``attrs`` works at fixed positions of axis 0 ("" if it does not)."""
        positions = self.batch_positions
        return positions(attrs) if callable(positions) else positions

    def components(self, attrs: Attrs) -> tuple[OpDef, ...]:
        """The ops a node of this op with ``attrs`` runs: its ``parts``, or just itself."""
        return (self,) if self.parts is None else self.parts(attrs)

    def __post_init__(self) -> None:
        self._params_by_name.update({param.name: param for param in self.params})

    def parse_attrs(self, raw: Mapping[str, Any], where: str = "") -> Attrs:
        """Typed attributes from MXNet strings or Python values; defaults filled in.

        Raises:
            ModelFormatError: an unknown attribute, a missing required one, or a bad value;
                the message names ``where`` (the node), the op and the attribute.
        """
        prefix = f"{where} ({self.name})" if where else f"op {self.name}"
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if is_annotation(key):
                continue
            param = self._params_by_name.get(key)
            if param is None:
                known = ", ".join(sorted(self._params_by_name)) or "none"
                raise ModelFormatError(
                    f"{prefix}: unknown attribute {key!r}; this op takes: {known}")
            try:
                values[key] = param.parse(value)
            except ValueError as error:
                raise ModelFormatError(f"{prefix}: attribute {key!r}: {error}") from None
        for param in self.params:
            if param.name not in values:
                if param.default is REQUIRED:
                    raise ModelFormatError(
                        f"{prefix}: required attribute {param.name!r} is missing")
                values[param.name] = param.default
        return Attrs(values)

    def input_names(self, attrs: Attrs) -> tuple[str, ...]:
        """Names of this node's inputs, in order."""
        return self.inputs(attrs) if callable(self.inputs) else self.inputs

    def output_names(self, attrs: Attrs) -> tuple[str, ...]:
        """Names of the visible outputs, in order."""
        return self.outputs(attrs) if callable(self.outputs) else self.outputs

    def num_outputs(self, attrs: Attrs) -> int:
        """Number of visible outputs."""
        return len(self.output_names(attrs))

    def num_total_outputs(self, attrs: Attrs) -> int:
        """Visible plus hidden outputs, as counted by MXNet's ``node_row_ptr``."""
        hidden = self.hidden_outputs
        if callable(hidden):
            hidden = hidden(attrs)
        return self.num_outputs(attrs) + hidden

    def expression(self, attrs: Attrs) -> str | None:
        """The elementwise C expression for these attrs, or None when the op is not elementwise."""
        return self.elementwise(attrs) if callable(self.elementwise) else self.elementwise

    def bind_calls(self, xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                   workspace: Any = None) -> list[Callable[[], Any]]:
        """Zero-argument calls computing into ``out`` for arrays fixed at plan compile time:
        ``bind`` where the op has one (given ``workspace`` when it declares ``scratch``),
        else the kernel."""
        if self.bind is not None and self.scratch is not None:
            return self.bind(xp, attrs, inputs, out, workspace)
        if self.bind is not None:
            return self.bind(xp, attrs, inputs, out)
        if self.writes_out:
            return [partial(self.kernel, xp, attrs, *inputs, out=out)]
        return [partial(self.compute, xp, attrs, inputs, out)]

    def compute(self, xp: Any, attrs: Attrs, inputs: Sequence[Any],
                out: Any = None) -> tuple[Any, ...]:
        """Run the kernel; return the visible outputs as a tuple (written into ``out`` if given)."""
        if out is not None and self.writes_out:
            result = self.kernel(xp, attrs, *inputs, out=out)
        else:
            result = self.kernel(xp, attrs, *inputs)
        results = result if isinstance(result, tuple) else (result,)
        if out is None or self.writes_out:
            return results
        targets = out if isinstance(out, tuple) else (out,)
        for target, value in zip(targets, results, strict=True):
            if target is not value:
                xp.copyto(target, value, casting="unsafe")
        return targets


_REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add an operator (and its aliases) to the registry; names must be new."""
    for name in (op.name, *op.aliases):
        if name in _REGISTRY:
            raise ValueError(f"operator name {name!r} is registered twice")
        _REGISTRY[name] = op
    return op


def register_alias(alias: str, target: str) -> OpDef:
    """Make ``alias`` resolve to the op registered as ``target``; ``alias`` must be new.

    For MXNet names that run the same op as an existing record (see `engine.ops.aliases`),
    found after the record was written.
    """
    op = _REGISTRY[target]
    if alias in _REGISTRY:
        raise ValueError(f"operator name {alias!r} is registered twice")
    _REGISTRY[alias] = op
    return op


def get_op(name: str, where: str = "") -> OpDef:
    """The operator registered under ``name`` (canonical or alias).

    Raises:
        UnknownOperatorError: naming the op and ``where`` (the node) when it is not registered.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        place = f"{where}: " if where else ""
        raise UnknownOperatorError(f"{place}unknown operator {name!r}") from None


def has_op(name: str) -> bool:
    """Whether ``name`` is a registered operator or alias."""
    return name in _REGISTRY


def all_ops() -> dict[str, OpDef]:
    """Every registered name (aliases included) mapped to its `OpDef`."""
    return dict(_REGISTRY)
