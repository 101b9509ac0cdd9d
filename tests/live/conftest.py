"""Live tests run real containers with runc; they need root, runc and a static busybox."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

_MISSING = [
    what
    for what, ok in (
        ("root", os.geteuid() == 0),
        ("runc", shutil.which("runc") or Path("/usr/sbin/runc").exists()),
        ("/usr/bin/busybox", Path("/usr/bin/busybox").exists()),
    )
    if not ok
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip (with the reason) only when the machine cannot run a container at all."""
    if not _MISSING:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason="live tests need " + ", ".join(_MISSING)))


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    """A fresh bundle directory (tmp_path is on a local, exec-able filesystem here)."""
    path = tmp_path / "bundle"
    path.mkdir()
    return path
