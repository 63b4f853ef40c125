"""``GET /v2/models/{name}[/versions/{v}]/config``: a version's config in Triton's form."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.engine.serving.sequence_lstm import LSTM, sequence_config
from tests.service.helpers import AUTH, MLP, config_for, files_for, run, serving, settings_for

MODELS = Path(__file__).resolve().parents[3] / "models"


def test_the_seed_mlp_config_in_triton_form(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            newest = await client.get(f"/v2/models/{MLP}/config")
            versioned = await client.get(f"/v2/models/{MLP}/versions/1/config")
        assert newest.status_code == 200, newest.text
        assert versioned.json() == newest.json()
        assert newest.json() == {
            "name": MLP, "platform": "mxnet_mxnet",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": 32,
            "input": [{"name": "data", "data_type": "TYPE_FP32", "dims": [512]}],
            "output": [{"name": "seed_mlp_dense2_fwd_output", "data_type": "TYPE_FP32",
                        "dims": [2]}],
            "dynamic_batching": {
                "preferred_batch_size": [], "max_queue_delay_microseconds": 1000,
                "preserve_ordering": False, "priority_levels": 0, "default_priority_level": 0,
                "default_queue_policy": {"timeout_action": "REJECT",
                                         "default_timeout_microseconds": 0,
                                         "allow_timeout_override": True,
                                         "max_queue_size": 1024}},
            "instance_group": [{"name": MLP, "kind": "KIND_CPU", "count": 1}]}
    run(scenario())


def test_batching_and_version_policy_are_carried_over(tmp_path: Path) -> None:
    config = {**config_for(MLP), "max_batch_size": 8, "version_policy": {"all": {}},
              "dynamic_batching": {"max_queue_delay_us": 250, "preferred_batch_sizes": [4, 2],
                                   "max_queue_size": 7, "timeout_us": 90_000},
              "instance_group": [{"count": 3, "kind": "KIND_AUTO"}]}

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            symbol, params = files_for(MLP)
            await runtime.repository.add_version(MLP, symbol, params, config=config)
            answer = (await client.get(f"/v2/models/{MLP}/config")).json()
        assert answer["max_batch_size"] == 8
        assert answer["version_policy"] == {"all": {}}
        assert answer["dynamic_batching"] == {
            "preferred_batch_size": [2, 4], "max_queue_delay_microseconds": 250,
            "preserve_ordering": False, "priority_levels": 0, "default_priority_level": 0,
            "default_queue_policy": {"timeout_action": "REJECT",
                                     "default_timeout_microseconds": 90_000,
                                     "allow_timeout_override": True, "max_queue_size": 7}}
        # Three batches at once, on the device the model loaded on (KIND_AUTO resolved).
        assert answer["instance_group"] == [{"name": MLP, "kind": "KIND_CPU", "count": 3}]
    run(scenario())


def test_priority_levels_and_queue_policies_in_triton_form(tmp_path: Path) -> None:
    config = {**config_for(MLP), "dynamic_batching": {
        "priority_levels": 3, "default_priority_level": 3,
        "default_queue_policy": {"timeout_action": "DELAY",
                                 "default_timeout_microseconds": 5000},
        "priority_queue_policy": {"1": {"allow_timeout_override": True, "max_queue_size": 4,
                                        "default_timeout_microseconds": 700}}}}

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            symbol, params = files_for(MLP)
            await runtime.repository.add_version(MLP, symbol, params, config=config)
            answer = (await client.get(f"/v2/models/{MLP}/config")).json()
        batching = answer["dynamic_batching"]
        assert (batching["priority_levels"], batching["default_priority_level"]) == (3, 3)
        assert batching["default_queue_policy"] == {
            "timeout_action": "DELAY", "default_timeout_microseconds": 5000,
            "allow_timeout_override": False, "max_queue_size": 0}
        assert batching["priority_queue_policy"] == {"1": {
            "timeout_action": "REJECT", "default_timeout_microseconds": 700,
            "allow_timeout_override": True, "max_queue_size": 4}}
    run(scenario())


def test_an_image_input_and_labelled_output_as_clients_see_them(tmp_path: Path) -> None:
    """The input with a pipeline takes one encoded image a row (BYTES: Triton's TYPE_STRING,
    a batch dimension alone: dims [1] reshaped to []), as model metadata shows it; the
    labelled output names its labels file."""
    shutil.copytree(MODELS / "digits_image", tmp_path / "digits_image")

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            answer = (await client.get("/v2/models/digits_image/config")).json()
            metadata = (await client.get("/v2/models/digits_image")).json()
        assert answer["input"] == [{"name": "image", "data_type": "TYPE_STRING", "dims": [1],
                                    "reshape": {"shape": []}}]
        assert metadata["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
        assert answer["output"] == [{"name": "scores", "data_type": "TYPE_FP32", "dims": [10],
                                     "label_filename": "labels.txt"}]
    run(scenario())


def test_unknown_models_and_versions_are_404(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            missing = await client.get("/v2/models/nothing/config")
            version = await client.get(f"/v2/models/{MLP}/versions/9/config")
        assert missing.status_code == 404 and "nothing" in missing.text
        assert version.status_code == 404 and "9" in version.text
    run(scenario())


def test_dims_leave_out_the_batch_at_its_axis_or_nothing_without_one(tmp_path: Path) -> None:
    """A time-major GRU language model batches along axis 1, so Triton's dims leave that one
    out; with max_batch_size 0 they are the whole shapes."""
    name = "gluonnlp_gru_lm_tnc"

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            symbol, params = files_for(name)
            await runtime.repository.add_version(name, symbol, params)
            batched = (await client.get(f"/v2/models/{name}/config")).json()
            await runtime.repository.add_version(name, symbol, params,
                                                 config={"max_batch_size": 0})
            whole = (await client.get(f"/v2/models/{name}/config")).json()
        assert batched["max_batch_size"] == 32
        assert [tensor["dims"] for tensor in batched["input"]] == [[-1]]
        assert [tensor["dims"] for tensor in batched["output"]] == [[-1, 100], [2, 32]]
        assert whole["max_batch_size"] == 0
        assert [tensor["dims"] for tensor in whole["input"]] == [[-1, -1]]
        assert [tensor["dims"] for tensor in whole["output"]] == [[-1, -1, 100], [2, -1, 32]]
    run(scenario())


def test_a_sequence_model_shows_sequence_batching_and_hides_its_states(tmp_path: Path) -> None:
    """The oldest strategy with its defaults written out (candidates: max_batch_size); the
    states' input and output are in sequence_batching, not among the tensors."""
    config = {**sequence_config(oldest={"preferred_batch_size": [4]}), "max_batch_size": 16}

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            symbol, params = files_for(LSTM)
            await runtime.repository.add_version(LSTM, symbol, params, config=config)
            answer = (await client.get(f"/v2/models/{LSTM}/config")).json()
            metadata = (await client.get(f"/v2/models/{LSTM}")).json()
        assert [tensor["name"] for tensor in answer["input"]] == ["tokens"]
        assert [tensor["name"] for tensor in answer["output"]] == ["logits"]
        assert [tensor["name"] for tensor in metadata["inputs"]] == ["tokens"]
        assert "dynamic_batching" not in answer
        assert answer["sequence_batching"] == {
            "max_sequence_idle_microseconds": 60_000_000,
            "oldest": {"max_candidate_sequences": 16, "preferred_batch_size": [4],
                       "max_queue_delay_microseconds": 0},
            "state": [{"input_name": "h_in", "output_name": "h", "data_type": "TYPE_FP32",
                       "dims": [2, 32], "initial_state": [{"zero_data": True}]},
                      {"input_name": "c_in", "output_name": "c", "data_type": "TYPE_FP32",
                       "dims": [2, 32], "initial_state": [{"zero_data": True}]}]}
    run(scenario())


def test_an_upload_whose_states_do_not_fit_the_graph_is_a_422_naming_the_field(
        tmp_path: Path) -> None:
    config = {"sequence_batching": {"state": [{"input_name": "h_in", "output_name": "h"}]}}

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            symbol, params = files_for(LSTM)
            response = await client.post(f"/models/{LSTM}", headers=AUTH, files={
                "symbol": ("s.json", symbol), "params": ("p.params", params),
                "config": ("config.json", json.dumps(config).encode())})
        assert response.status_code == 422, response.text
        assert ("sequence_batching.state.0: the model has no input 'h_in'; its inputs are "
                "['data0', 'data1', 'data2']") in response.json()["error"]
    run(scenario())


def test_warmup_samples_are_shown_with_what_the_load_filled_in(tmp_path: Path) -> None:
    from google.protobuf import json_format

    from service.grpc import inference_pb2 as pb

    config = {**config_for(MLP), "max_batch_size": 8, "warmup": [
        {"name": "zeros", "batch_size": 2},
        {"name": "noise", "batch_size": 8, "count": 3,
         "inputs": {"data": {"data_type": "FP32", "random_data": True}}}]}

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            symbol, params = files_for(MLP)
            await runtime.repository.add_version(MLP, symbol, params, config=config)
            answer = (await client.get(f"/v2/models/{MLP}/config")).json()
        assert answer["model_warmup"] == [
            {"name": "zeros", "batch_size": 2, "count": 1, "inputs": {
                "data": {"data_type": "TYPE_FP32", "dims": [512], "zero_data": True}}},
            {"name": "noise", "batch_size": 8, "count": 3, "inputs": {
                "data": {"data_type": "TYPE_FP32", "dims": [512], "random_data": True}}}]
        # gRPC's ModelConfig answers the same (Triton's field 16).
        message = json_format.ParseDict(answer, pb.ModelConfig())
        assert [sample.name for sample in message.model_warmup] == ["zeros", "noise"]
        assert message.model_warmup[1].inputs["data"].random_data
    run(scenario())
