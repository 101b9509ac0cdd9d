"""Run the reference projects' table rows (data files in ``data/``) through the hook's outside interface.

Each row names its source (``source: {repo, file, test, case}``) and says what the reference does.
A row whose ``difference`` field is set is a deliberate difference: it states what the hook does
instead (``hook:``) and why, and ``docs/interface.md`` must name the row id. The hook runs
in-process through ``hook.cli.run`` (the same argv a user types), never through its internals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hook.cli import run

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
INTERFACE = REPO / "docs" / "interface.md"
SOURCES = ("cncf-tags/container-device-interface", "NVIDIA/nvidia-container-toolkit",
           "NVIDIA/libnvidia-container")


def tables() -> dict[str, list[dict[str, Any]]]:
    """Every data file's rows, keyed by file stem."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(DATA.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        out[path.stem] = list(doc["rows"])
    return out


def rows(kind: str) -> list[Any]:
    """``pytest.param`` rows of one kind (ids: ``<table>/<row id>``)."""
    import pytest

    return [pytest.param(row, id=f"{table}/{row['id']}")
            for table, items in tables().items() for row in items if row.get("kind") == kind]


def hook(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = run(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def hook_json(argv: list[str], capsys: Any) -> tuple[int, Any, str]:
    rc, out, err = hook([*argv, "--format", "json"], capsys)
    return rc, (json.loads(out) if out.strip() else None), err


def expected(row: dict[str, Any], key: str) -> Any:
    """What the hook must do: the reference's value, or the documented ``hook:`` value of a difference."""
    if "difference" in row and key in row.get("hook", {}):
        return row["hook"][key]
    return row[key]
