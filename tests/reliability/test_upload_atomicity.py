"""A refused upload changes nothing: not the versions, and not the model's config.json."""

from __future__ import annotations

import json
from pathlib import Path

from tests.reliability.inprocess import app_client
from tests.service.helpers import config_for, files_for


def test_conflicting_upload_leaves_the_existing_config_untouched(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    with app_client(root, ("seed_mlp",)) as client:
        config_path = root / "seed_mlp" / "config.json"
        before = config_path.read_bytes()
        symbol, params = files_for("seed_mlp")
        changed = {**config_for("seed_mlp"), "max_batch_size": 3}
        response = client.upload("seed_mlp", symbol, params, json.dumps(changed).encode(),
                                 version="1")
        assert response.status_code == 409, response.text
        assert config_path.read_bytes() == before, "a refused upload rewrote config.json"
        described = client.request("GET", "/models/seed_mlp").json()
        assert described["config"]["max_batch_size"] != 3
