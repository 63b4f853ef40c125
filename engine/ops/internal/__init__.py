"""Operators that are nobody's public API: MXNet's internal ones, and the fused chains the
compiler makes.

Importing this package registers its operators.
"""

from engine.ops.internal import (  # noqa: F401  (imported for their registrations)
    fused,
    mxnet_internals,
)
