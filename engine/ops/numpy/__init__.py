"""NumPy-mode operators (``_np_*``, ``_npi_*``) that have no legacy twin elsewhere.

Importing this package registers its operators.
"""

from engine.ops.numpy import (  # noqa: F401  (imported for their registrations)
    arrays,
    functions,
    insert,
    mask_assign,
    norm,
    sequences,
    statistics,
)
