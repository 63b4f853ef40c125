"""Control flow: ``_foreach``, ``_while_loop`` and ``_cond``, whose subgraphs the runtime
evaluates (see `engine.ops.control.subgraphs`).

Importing this package registers its operators.
"""

from engine.ops.control import (  # noqa: F401  (imported for their registrations)
    flow,
)
