"""pytest plugin (``-p bench.mutselect``): run only the listed test ids, in the listed order.

The list (``ODH_MUTSELECT``, a JSON file) is a mutant's coverage subset, cheapest files first,
so ``-x`` stops early on a killed mutant. Tests of one file stay together in collection order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get("ODH_MUTSELECT")
    if not path:
        return
    wanted: list[str] = json.loads(Path(path).read_text())
    rank = {nodeid: i for i, nodeid in enumerate(wanted)}
    keep = [it for it in items if it.nodeid in rank]
    drop = [it for it in items if it.nodeid not in rank]
    keep.sort(key=lambda it: rank[it.nodeid])
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
