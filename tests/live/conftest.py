"""Live tests run real containers with runc; they need root, runc and a static busybox."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.hosttree import make_host_tree

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


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """The seed-000 driver root (fake nodes), no CDI specs, settings with a log and cache in tmp_path."""
    root = tmp_path / "driver-root"
    make_host_tree(root, "8x-mig", mknod=True)
    empty = tmp_path / "no-cdi"
    empty.mkdir()
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"log_file: {tmp_path}/hook.log\ncache_dir: {tmp_path}/cache\n")
    return {"root": root, "no_cdi": empty, "settings": settings, "log": tmp_path / "hook.log"}
