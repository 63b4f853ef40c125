"""Arrays as data: creation, ranges, reshaping, transposing, slicing, indexing, joining,
splitting, tiling, assignment into a region, and the ops whose output shape depends on values.

Importing this package registers its operators.
"""

from engine.ops.tensor import (  # noqa: F401  (imported for their registrations)
    assign,
    creation,
    dynamic,
    gather,
    index_arrays,
    indexing,
    join,
    ranges,
    reshape,
    slicing,
    splits,
    tile,
    transpose,
)
