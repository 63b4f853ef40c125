"""Maths: elementwise functions and arithmetic, reductions, products, linear algebra,
special functions, densities and spectral transforms.

Importing this package registers its operators.
"""

from engine.ops.math import (  # noqa: F401  (imported for their registrations)
    along_axes,
    contrib,
    elementwise,
    factorizations,
    linalg,
    pdf,
    products,
    reduce,
    special,
    special_functions,
    spectral,
    stable_functions,
    unary_functions,
)
