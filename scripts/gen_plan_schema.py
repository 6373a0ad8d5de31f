#!/usr/bin/env python3
"""Write schemas/plan.schema.json, the JSON Schema of `vgpu-state plan -o json`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vgpu_state.model.plan import Plan

TARGET = Path(__file__).resolve().parent.parent / "schemas" / "plan.schema.json"


def plan_schema_text() -> str:
    schema = Plan.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "vgpu-state plan"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> int:
    TARGET.write_text(plan_schema_text())
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
