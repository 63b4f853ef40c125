"""A loaded model holds one copy of each parameter: weights bound in the order the plans read
them, nothing kept alive of the params file's buffer."""

from __future__ import annotations

import numpy as np

import engine
from engine.graph.params import save_params
from engine.runtime.binding import own_parameters
from tests.conformance.fixtures import model_files, model_io_sets


def _roots(model: engine.Model) -> set[int]:
    """The ids of the memory every parameter and plan constant lives in."""
    roots = set()
    for array in (*model.params.values(), *model.optimized_graph.constants.values()):
        while isinstance(array.base, np.ndarray):
            array = array.base
        roots.add(id(array if array.base is None else array.base))
    return roots


def test_weights_are_held_once_and_the_file_buffer_goes() -> None:
    symbol, params = model_files("seed_mlp")
    model = engine.load_model(symbol, params.read_bytes())
    constants = model.optimized_graph.constants
    weights = [name for name in model.params if name.endswith("_weight")]
    assert weights
    for name in weights:
        # The pass that lays weights out column-major found them so: the same array.
        assert model.params[name].flags.f_contiguous
        assert constants[name] is model.params[name]
    for array in model.params.values():
        assert array.base is None or isinstance(array.base, np.ndarray), \
            "a parameter still views the params file's bytes"
    held = sum(array.nbytes for array in model.params.values())
    assert held == model.param_bytes
    assert len(_roots(model)) == len(model.params)  # no two copies of one parameter
    inputs, expected = model_io_sets("seed_mlp")[1]
    got = model.infer(inputs)
    np.testing.assert_allclose(next(iter(got.values())), expected[0], rtol=1e-4, atol=1e-5)


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
