"""The fused-chain op (`engine.ops.internal.fused`) is an ordinary registered op: it splits its
inputs, sizes its scratch, binds and names its parts through its `OpDef`, so plans need no
special case."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine import sym
from engine.kernels import epilogue
from engine.ops import get_op
from engine.ops.internal.fused import FUSED_ELEMENTWISE, FusedStep, split_inputs
from engine.ops.registry import Attrs
from tests.engine.runtime.helpers import load_pair, step_funcs

RNG = np.random.default_rng(31)
ENGINE = Path(__file__).resolve().parents[4] / "engine"


def fused_step(name: str, position: int = 0, **raw: str) -> FusedStep:
    op = get_op(name)
    attrs = op.parse_attrs(raw)
    return FusedStep(op, attrs, position, len(op.input_names(attrs)))


def chain(head: FusedStep, *steps: FusedStep) -> Attrs:
    return Attrs({"head": head, "steps": steps})


def test_inputs_split_into_the_heads_and_each_steps_extras() -> None:
    attrs = chain(fused_step("Convolution", kernel="(1, 1)", num_filter="2"),
                  fused_step("relu"), fused_step("elemwise_add", position=1),
                  fused_step("_mul_scalar", scalar="2"), fused_step("elemwise_mul"))
    assert split_inputs(attrs, ["x", "w", "b", "skip", "scale"]) == (
        ["x", "w", "b"], [[], ["skip"], [], ["scale"]])
    assert FUSED_ELEMENTWISE.input_names(attrs) == ("arg0", "arg1", "arg2", "arg3", "arg4")


def test_scratch_is_the_heads_and_parts_name_every_op() -> None:
    conv = fused_step("Convolution", kernel="(3, 3)", num_filter="8")
    attrs = chain(conv, fused_step("relu"))
    shapes = [(2, 4, 16, 16), (8, 4, 3, 3), (8,)]
    need = conv.op.scratch(conv.attrs, shapes, np.dtype(np.float32))
    assert need > 0
    assert FUSED_ELEMENTWISE.scratch(attrs, shapes, np.dtype(np.float32)) == need
    assert FUSED_ELEMENTWISE.scratch(chain(fused_step("relu"), fused_step("sigmoid")),
                                     [(3, 4)], np.dtype(np.float32)) == 0
    assert [op.name for op in FUSED_ELEMENTWISE.components(attrs)] == ["Convolution", "relu"]
    assert get_op("relu").components(Attrs({})) == (get_op("relu"),)


def test_a_chain_with_an_absorbed_clamp_then_a_binary_step_matches_unfused() -> None:
    # The clip folds into the convolution's last pass; the add after it must still find `data`.
    data = sym.var("data")
    conv = sym.Convolution(data, kernel=(1, 1), num_filter=3, name="conv")
    clamped = sym.clip(conv, a_min=-0.5, a_max=1.5)
    net = sym.sigmoid(sym.elemwise_add(clamped, data), name="out")
    shape = (2, 3, 7, 6)
    optimized, reference = load_pair(net, shape, RNG)
    x = RNG.normal(size=shape).astype(np.float32)
    plan = optimized.plan_for({"data": x})
    assert {step.node.opdef for step in plan.steps} == {FUSED_ELEMENTWISE}
    assert epilogue.bias_clamp in step_funcs(plan)
    np.testing.assert_allclose(optimized.infer({"data": x})["out_output"],
                               reference.infer({"data": x})["out_output"], rtol=1e-5, atol=1e-5)


def test_only_the_ops_package_and_the_fusion_pass_name_the_fused_op() -> None:
    # The registry's promise: the runtime and the GPU backend treat it like any other op.
    allowed = {ENGINE / "compiler" / "fuse_elementwise.py", ENGINE / "onnx" / "refused.py"}
    naming = [path.relative_to(ENGINE).as_posix() for path in ENGINE.rglob("*.py")
              if ENGINE / "ops" not in path.parents and path not in allowed
              and ('"_fused_elementwise"' in path.read_text()
                   or "FUSED_ELEMENTWISE" in path.read_text())]
    assert naming == []
