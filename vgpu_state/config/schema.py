"""The JSON Schema of the config file (for editors and CI)."""

from __future__ import annotations

import json
from typing import Any

from vgpu_state.config.document import ConfigFile

SCHEMA_ID = "https://vgpu-state.dev/schemas/vgpu-state-config.schema.json"


def json_schema() -> dict[str, Any]:
    schema = ConfigFile.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"
