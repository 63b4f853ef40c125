"""The operator registry and every operator definition, one subpackage per family.

Importing this package registers all operators; `get_op` looks one up by MXNet name or alias.
The families: `nn` (layers), `math`, `tensor` (arrays as data), `vision` (detection and
images), `numpy` (NumPy-mode names), `quantized` (MXNet's int8 exports), `control` (subgraph
ops) and `internal` (MXNet's own and the compiler's fused chains). Beside them sit what
every family uses: the registry, attribute parsing (`attrs`), shape helpers (`shapes`),
dtypes (`dtypes`), MXNet's names (`catalog`, `aliases`) and the coverage report.
"""

from engine.ops import (  # noqa: F401  (imported for their registrations)
    aliases,
    control,
    internal,
    math,
    nn,
    numpy,
    quantized,
    tensor,
    vision,
)
from engine.ops.registry import REQUIRED, Attrs, OpDef, Param, all_ops, get_op, has_op, register

aliases.register_aliases()  # after every family above: aliases resolve to their records

__all__ = ["REQUIRED", "Attrs", "OpDef", "Param", "all_ops", "get_op", "has_op", "register"]
