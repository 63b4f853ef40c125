"""Export details seen in GluonCV/GluonNLP files: ``__init__`` reprs, and Custom refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.errors import UnknownOperatorError
from engine.graph.json_format import graph_from_json, graph_to_json
from tests.conformance.fixtures import model_files, model_io_sets

# GluonCV stores a parameter's initializer as whatever its repr was, Python object address and all.
INIT_REPRS = (
    '["normal", {"sigma": 0.01}]',
    "<gluoncv.nn.bbox.BBoxCornerToCenter object at 0x7f3a2c1d5e80>",
    "Xavier(rnd_type='gaussian', factor_type='out', magnitude=2)",
    '{"__class__": "Constant", "value": [0.5, {"nested": null}]}',
)


def _hybridnet() -> dict:
    return json.loads(model_files("hybridnet")[0].read_text())


@pytest.mark.parametrize("init", INIT_REPRS)
def test_init_attributes_holding_python_reprs_load_and_round_trip(init: str) -> None:
    document = _hybridnet()
    for node in document["nodes"]:
        node.setdefault("attrs", {})["__init__"] = init
    text = json.dumps(document)
    graph = graph_from_json(text)
    assert all(node.attrs["__init__"] == init for node in graph.nodes)
    assert json.loads(graph_to_json(graph))["nodes"][1]["attrs"]["__init__"] == init
    model = engine.load_model(text, model_files("hybridnet")[1])
    inputs, expected = model_io_sets("hybridnet")[0]
    np.testing.assert_allclose(list(model.infer(inputs).values())[0], expected[0],
                               rtol=1e-4, atol=1e-5)


def _with_custom(op_type: str | None) -> dict:
    document = _hybridnet()
    node = document["nodes"][-1]
    node["op"] = "Custom"
    node["attrs"] = {} if op_type is None else {"op_type": op_type}
    return document


def test_custom_is_refused_naming_its_op_type() -> None:
    with pytest.raises(UnknownOperatorError,
                       match=r"operator 'Custom' with op_type 'my_softmax' is not supported: "
                             r"runs user Python code"):
        graph_from_json(_with_custom("my_softmax"))
    with pytest.raises(UnknownOperatorError, match=r"operator 'Custom' is not supported"):
        graph_from_json(_with_custom(None))


def test_custom_upload_is_refused_with_422_and_op_type(tmp_path: Path) -> None:
    from tests.service.helpers import AUTH, config_for, files_for, run, serving, settings_for

    symbol, params = files_for("hybridnet")
    files = {"symbol": ("s.json", json.dumps(_with_custom("proposal_target")).encode()),
             "params": ("p.params", params),
             "config": ("config.json", json.dumps(config_for("hybridnet")).encode())}

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            response = await client.post("/models/det", files=files, headers=AUTH)
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert "'Custom'" in error and "'proposal_target'" in error

    run(scenario())
