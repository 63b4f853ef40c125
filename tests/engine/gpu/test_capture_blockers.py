"""Ops that cannot run inside stream capture (`OpDef.uncapturable` says why) keep a GPU plan
uncaptured, openly: the plan never tries, and its stats name the node and the reason. Checked
through the CuPy stand-in."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
import engine.cuda.executor as executor_module
from engine.compiler.fuse_elementwise import fuse_elementwise
from engine.graph.ir import Entry, Graph, make_node
from engine.ops.math.linalg import CUPY_LINALG
from engine.ops.quantized import QUANTIZED_OPS
from engine.ops.registry import all_ops
from engine.runtime.plan import capture_blocker
from tests.conformance.fixtures import (
    assert_close,
    model_files,
    model_io_sets,
    op_arrays,
    op_cases,
    tolerance_for,
)
from tests.engine.gpu import fake_cupy


def _case(case_id: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    case = next(case for case in op_cases() if case["id"] == case_id)
    arrays = op_arrays()
    feed = {spec["name"]: arrays[f"{case_id}/in{k}"] for k, spec in enumerate(case["inputs"])}
    return case, feed


def test_only_host_bound_and_cupy_linalg_ops_are_uncapturable() -> None:
    # A new entry here is a GPU plan that silently loses its CUDA graph: it needs a reason.
    blocking = {op.name: op.uncapturable for op in all_ops().values() if not op.capturable}
    host_bound = {name for name, reason in blocking.items() if "on the host" in reason}
    assert host_bound == {"_contrib_ROIAlign", "ROIPooling", "_contrib_Proposal",
                          "_contrib_MultiProposal", "_while_loop", "_cond",
                          "_contrib_RROIAlign", "_npx_constraint_check",
                          # output shapes set by the data (a staged plan runs them on the host)
                          "_contrib_boolean_mask", "_npx_nonzero", "_npi_unique",
                          "_npi_bincount", "_npi_delete",
                          # MXNet's int8 ops run in NumPy, through host copies on a GPU
                          *QUANTIZED_OPS}
    assert {name for name, reason in blocking.items() if reason == CUPY_LINALG} == {
        "_linalg_det", "_linalg_inverse", "_linalg_potrf", "_linalg_potri", "_linalg_slogdet",
        "_linalg_trsm", "_npi_cholesky", "_npi_solve", "_linalg_gelqf", "_linalg_syevd",
        "_npi_eig", "_npi_eigh", "_npi_eigvals", "_npi_eigvalsh", "_npi_svd", "_npi_pinv",
        "_npi_pinv_scalar_rcond", "_npi_tensorinv", "_npi_tensorsolve", "_npi_norm"}
    # _foreach allocates each step's values as it runs its body through the interpreter.
    assert "allocating" in blocking["_foreach"]
    assert set(blocking) == host_bound | {"_foreach"} | {
        name for name, reason in blocking.items() if reason == CUPY_LINALG}


def test_capture_blocker_names_the_node_and_its_op() -> None:
    case, feed = _case("roi_align_default")
    graph = engine.load_model(case["symbol"], device="cpu").plan_for(feed).graph
    assert capture_blocker(graph) == (
        "node 'op' (_contrib_ROIAlign) cannot run inside a CUDA graph (_contrib_ROIAlign reads "
        "each ROI's sampling grid (its size too) from rois on the host), so the plan runs "
        "uncaptured")
    inputs, _ = model_io_sets("gluoncv_ssd_tiny")[0]
    ssd = engine.load_model(*model_files("gluoncv_ssd_tiny"), device="cpu")
    assert capture_blocker(ssd.plan_for(inputs).graph) is None  # box_nms runs on the device


def test_an_uncapturable_head_of_a_fused_chain_still_blocks_capture() -> None:
    nodes = (make_node("null", "data"), make_node("null", "rois"),
             make_node("_contrib_ROIAlign", "align",
                       {"pooled_size": "(3, 3)", "spatial_scale": "0.25"},
                       (Entry(0), Entry(1))),
             make_node("relu", "relu", {}, (Entry(2),)))
    graph = fuse_elementwise(Graph(nodes, (Entry(3),)))
    fused = graph.nodes[-1]
    assert [op.name for op in fused.opdef.components(fused.params)] == [
        "_contrib_ROIAlign", "relu"]
    assert capture_blocker(graph) == (
        f"{fused.describe()} cannot run inside a CUDA graph (_contrib_ROIAlign reads each "
        "ROI's sampling grid (its size too) from rois on the host), so the plan runs "
        "uncaptured")


@pytest.mark.parametrize("case_id", ["roi_align_default", "roi_pooling"])
def test_a_plan_with_a_host_bound_op_never_tries_capture(monkeypatch: pytest.MonkeyPatch,
                                                         case_id: str) -> None:
    fake_cupy.install(monkeypatch)
    attempts: list[int] = []
    monkeypatch.setattr(executor_module, "capture",
                        lambda *args: attempts.append(1) or pytest.fail("capture attempted"))
    case, feed = _case(case_id)
    model = engine.load_model(case["symbol"], device="gpu")
    runs = executor_module.WARMUP_RUNS + 3
    for _ in range(runs):
        output = list(model.infer(feed).values())[0]
    expected = op_arrays()[f"{case_id}/out0"]
    assert_close(output, expected, tolerance_for(expected.dtype, case.get("tolerance")), case_id)
    stats = model.plan_for(feed).execution_stats()
    assert not attempts
    assert stats["cuda_graph"] is False and stats["eager_runs"] == runs
    assert stats["cuda_graph_error"].startswith("node 'op' (") and "host" in \
        stats["cuda_graph_error"]


def test_stand_in_refuses_reading_device_values_as_numbers_during_capture(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cupy = fake_cupy.install(monkeypatch)
    value = cupy.ones((1,), np.float32)
    assert int(value[0]) == 1 and bool(value[0])  # outside capture: allowed, as in CuPy
    stream = cupy.cuda.Stream()
    stream.begin_capture()
    try:
        for read in (int, float, bool, lambda v: v.item(), lambda v: v.tolist()):
            with pytest.raises(fake_cupy.CaptureError, match="device-to-host copy"):
                read(value[0])
    finally:
        stream.end_capture()


def test_stand_in_linalg_gives_device_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    cupy = fake_cupy.install(monkeypatch)
    matrices = cupy.asarray(np.eye(3, dtype=np.float32)[None].repeat(2, axis=0))
    assert isinstance(cupy.linalg.det(matrices), fake_cupy.FakeArray)
    sign, logdet = cupy.linalg.slogdet(matrices)
    assert isinstance(sign, fake_cupy.FakeArray) and isinstance(logdet, fake_cupy.FakeArray)
    with pytest.raises(AttributeError, match="cupy.linalg"):
        _ = cupy.linalg.matrix_exp
