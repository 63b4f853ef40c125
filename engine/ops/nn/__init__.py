"""Neural-network layers: convolution, dense, pooling, normalisation, activation, recurrent
and attention operators, loss heads (CTC among them), and MXNet's pre-1.0 layer names.

Importing this package registers its operators.
"""

from engine.ops.nn import (  # noqa: F401  (imported for their registrations)
    activation,
    adaptive_pool,
    attention,
    batchnorm_variants,
    conv,
    ctc,
    deformable,
    dense,
    legacy_v1,
    losses,
    norm,
    patches,
    pool,
    rnn,
    sequence,
)
