"""Shared builders for the CDI tests: a valid base spec and spec-dir writers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def base_spec(**top: Any) -> dict[str, Any]:
    """A minimal valid spec; keyword arguments replace top-level keys (None deletes)."""
    spec: dict[str, Any] = {
        "cdiVersion": "1.1.0",
        "kind": "vendor.com/dev",
        "devices": [{"name": "d0", "containerEdits": {"env": ["A=1"]}}],
    }
    for key, value in top.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = copy.deepcopy(value)
    return spec


def device(name: str = "d0", **edits: Any) -> dict[str, Any]:
    return {"name": name, "containerEdits": edits or {"env": ["A=1"]}}


def write_spec(directory: Path, filename: str, spec: dict[str, Any] | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return path
