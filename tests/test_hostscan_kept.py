"""A resident process keeps the host scan's accelerator nodes while every char node's path, mode
and numbers and the patterns are the same (issue 34 item 8: building them was most of the 64 GPU +
224 MIG node's scan). Every change is checked against a scan with warm views off; the kept scan's
work is counted, not timed. Real char nodes under tmp_path (the suite runs as root)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.core.settings import DEFAULT_ACCELERATOR_NODES
from hook.routes import hostscan
from hook.sources import warm

PATTERNS = dict(DEFAULT_ACCELERATOR_NODES)


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "dev" / "nvidia-caps").mkdir(parents=True)
    for i in range(4):
        os.mknod(tmp_path / f"dev/nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
    os.mknod(tmp_path / "dev/nvidia-caps/nvidia-cap1", 0o400 | stat.S_IFCHR, os.makedev(237, 1))
    warm.enable()
    yield tmp_path
    warm.enable(False)


def scan_checked(root: Path, patterns: dict[str, tuple[str, ...]] = PATTERNS) -> tuple[Any, ...]:
    kept = hostscan.scan_accelerators(root, patterns)
    slots = dict(warm._slots)
    warm.enable(False)
    try:
        assert hostscan.scan_accelerators(root, patterns) == kept
    finally:
        warm.enable()
        warm._slots.update(slots)
    return kept


def _remade(root: Path) -> None:
    (root / "dev/nvidia2").unlink()
    os.mknod(root / "dev/nvidia2", 0o666 | stat.S_IFCHR, os.makedev(195, 9))


CHANGES: dict[str, Callable[[Path], None]] = {
    "a node's mode": lambda root: (root / "dev/nvidia1").chmod(0o600),
    "a node made again with other numbers": _remade,
    "a node added": lambda root: os.mknod(root / "dev/nvidia7", 0o666 | stat.S_IFCHR, os.makedev(195, 7)),
    "a node removed": lambda root: (root / "dev/nvidia-caps/nvidia-cap1").unlink(),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_the_kept_scan_follows_every_change(dev: Path, change: str) -> None:
    before = scan_checked(dev)
    assert scan_checked(dev) == before
    CHANGES[change](dev)
    assert scan_checked(dev) != before


def test_other_patterns_are_another_scan(dev: Path) -> None:
    assert scan_checked(dev)
    assert scan_checked(dev, {"other": ("other*",)}) == ()


def test_a_kept_scan_weighs_no_node_again(dev: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted: the second and third scans of an unchanged /dev match no node against the patterns
    (seen failing before: 5 matches per scan)."""
    hostscan.scan_accelerators(dev, PATTERNS)
    calls = [0]
    real = hostscan.is_accelerator

    def counting(*a: Any) -> bool:
        calls[0] += 1
        return real(*a)

    monkeypatch.setattr(hostscan, "is_accelerator", counting)
    for _ in range(2):
        hostscan.scan_accelerators(dev, PATTERNS)
    assert calls[0] == 0
