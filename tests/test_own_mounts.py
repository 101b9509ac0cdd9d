"""``hook nri``'s StartContainer locates each container's cgroup through the daemon's own
``/proc/self/mountinfo``: a resident daemon parses it once and again only when the kernel marks the
table changed (``hook.adapters.apply.ownmounts``), the per-start hook every time. Counted, not timed.

The session runs in its own mount namespace (conftest), so the tmpfs mounted here is private."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.apply import locate
from hook.sources import warm


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []
    real = locate.parse_mountinfo

    def counting(text: str, source: str) -> Any:
        seen.append(real(text, source))
        return seen[-1]

    monkeypatch.setattr(locate, "parse_mountinfo", counting)
    return seen


@pytest.fixture
def warm_on() -> Iterator[None]:
    warm.enable()
    yield
    warm.enable(False)


def _points(mounts: tuple[Any, ...]) -> set[str]:
    return {m.mount_point for m in mounts}


def test_the_daemon_parses_its_mount_table_again_only_after_a_change(
    tmp_path: Path, parses: list[tuple[Any, ...]], warm_on: None
) -> None:
    """Seen failing without the keeper: five locates parsed the table five times."""
    for _ in range(5):
        locate.find(os.getpid())
    assert len(parses) <= 1  # 0 when an earlier test of this process already holds it
    before = len(parses)
    point = tmp_path / "m"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "odh-test", str(point)], check=True)
    try:
        locate.find(os.getpid())
        assert len(parses) == before + 1 and str(point) in _points(parses[-1])
        locate.find(os.getpid())
        assert len(parses) == before + 1
    finally:
        subprocess.run(["umount", str(point)], check=True)
    locate.find(os.getpid())
    assert len(parses) == before + 2 and str(point) not in _points(parses[-1])


def test_the_per_start_hook_reads_its_mount_table_each_time(parses: list[tuple[Any, ...]]) -> None:
    for _ in range(3):
        locate.find(os.getpid())
    assert len(parses) == 3
