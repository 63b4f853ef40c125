"""A loaded model holds one copy of each parameter: weights bound in the order the plans read
them, nothing kept alive of the params file's buffer."""

from __future__ import annotations

import numpy as np

import engine
from engine.graph.params import save_params
from engine.kernels import gemm_kernel
from engine.kernels.packed_weight import PackedWeight
from engine.kernels.workspace import address
from engine.runtime.binding import own_parameters
from tests.conformance.fixtures import model_files, model_io_sets


def _roots(model: engine.Model) -> set[tuple[int, int]]:
    """Where every parameter and plan constant lives (a packed weight: its panels): the id of
    the memory it views and its first byte's offset there (packed weights share an arena's
    memory, each at an offset of its own; a view of a parameter starts where it does)."""
    roots = set()
    for value in (*map(model.params.held, model.params),
                  *model.optimized_graph.constants.values()):
        array = root = value.panels if isinstance(value, PackedWeight) else value
        while isinstance(root.base, np.ndarray):
            root = root.base
        roots.add((id(root if root.base is None else root.base),
                   address(array) - address(root)))
    return roots


def test_weights_are_held_once_and_the_file_buffer_goes() -> None:
    symbol, params = model_files("seed_mlp")
    model = engine.load_model(symbol, params.read_bytes())
    constants = model.optimized_graph.constants
    weights = [name for name in model.params if name.endswith("_weight")]
    assert weights
    for name in weights:
        held = model.params.held(name)
        assert constants[name] is held
        if not isinstance(held, PackedWeight):  # the last layer's 2 units: BLAS multiplies it
            # The pass that lays weights out column-major found them so: the same array.
            assert held.flags.f_contiguous
    packed = sum(isinstance(model.params.held(name), PackedWeight) for name in weights)
    assert packed == (2 if gemm_kernel.available() else 0)  # our GEMM's, where it compiles
    for name in model.params:
        array = model.params.held(name)
        if isinstance(array, PackedWeight):
            array = array.panels
        assert array.base is None or isinstance(array.base, np.ndarray), \
            "a parameter still views the params file's bytes"
    held_bytes = sum(model.params.held(name).nbytes for name in model.params)
    assert held_bytes == model.param_bytes
    assert len(_roots(model)) == len(model.params)  # no two copies of one parameter
    inputs, expected = model_io_sets("seed_mlp")[1]
    got = model.infer(inputs)
    np.testing.assert_allclose(next(iter(got.values())), expected[0], rtol=1e-4, atol=1e-5)
    assert model.derived_bytes == 0  # the plans packed nothing beside the packed weights


def test_own_parameters_copies_views_of_a_mostly_unused_buffer() -> None:
    buffer = save_params(None, {"a": np.arange(1000, dtype=np.float32),
                                "b": np.ones(4, np.float32)})
    big = np.frombuffer(buffer, np.float32, count=1000, offset=0)
    small = np.frombuffer(buffer, np.float32, count=4, offset=0)
    together = {"a": big, "b": small}
    own_parameters(together)  # the views fill the buffer: nothing to gain
    assert together["a"] is big and together["b"] is small
    alone = {"b": small}
    own_parameters(alone)
    assert alone["b"] is not small and alone["b"].base is None
    np.testing.assert_array_equal(alone["b"], small)
