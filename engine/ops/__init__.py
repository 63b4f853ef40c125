"""The operator registry and every operator definition.

Importing this package registers all operators; `get_op` looks one up by MXNet name or alias.
"""

from engine.ops import (  # noqa: F401  (imported for their registrations)
    activation,
    adaptive,
    aliases,
    attention,
    batchnorm_variants,
    boxes,
    control_flow,
    conv,
    correlation,
    creation,
    crop,
    dense,
    elementwise,
    fused,
    gather,
    image,
    indexing,
    join,
    legacy_v1,
    linalg,
    linalg_np,
    mathextra,
    multibox,
    nms,
    norm,
    npextra,
    npinsert,
    npmode,
    npnorm,
    npsequences,
    npstats,
    pool,
    products,
    proposal,
    ranges,
    reduce,
    reshape,
    rnn,
    roi,
    sequence,
    slicing,
    spatial,
    splits,
    tile,
    transpose,
    utilities,
)
from engine.ops.registry import REQUIRED, Attrs, OpDef, Param, all_ops, get_op, has_op, register

aliases.register_aliases()  # after every module above: aliases resolve to their records

__all__ = ["REQUIRED", "Attrs", "OpDef", "Param", "all_ops", "get_op", "has_op", "register"]
