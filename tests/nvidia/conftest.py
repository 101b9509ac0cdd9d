"""Fixtures for the NVIDIA tests: host trees (pyfakefs or real nodes) and the fake NVML."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # `pytest` (not `python -m pytest`) does not put the repo root on sys.path
    sys.path.insert(0, _ROOT)

from tests.hosttree import TOPOLOGIES, HostSpec, make_host_tree  # noqa: E402
from tests.nvidia.fake_pynvml import FakeNvml  # noqa: E402

HOST = Path("/host")


@pytest.fixture
def fake_host(fs, monkeypatch):
    """``fake_host(topology) -> (root, spec)`` in a pyfakefs tree (plain files for /dev nodes); the
    node has a key (held as read: pyfakefs has no ``dir_fd`` opens to make one), so caches work."""
    from pyfakefs.fake_os import FakeOsModule

    from hook.sources import nodekey, privatefile

    monkeypatch.setitem(nodekey._known, nodekey.KEY_DIR, b"k" * nodekey.KEY_BYTES)
    # the cache dir's reader calls posix (the fast path does without os), which pyfakefs does not
    # patch: it is given the fake tree's os module, as every other reader in this tree gets
    monkeypatch.setattr(privatefile, "posix", FakeOsModule(fs))

    def make(topology: str) -> tuple[Path, HostSpec]:
        return HOST, make_host_tree(HOST, topology, mknod=False)

    return make


@pytest.fixture
def real_host(tmp_path: Path):
    """``real_host(topology) -> (root, spec)`` on disk with real character nodes (needs root)."""

    def make(topology: str) -> tuple[Path, HostSpec]:
        try:
            return tmp_path, make_host_tree(tmp_path, topology, mknod=True)
        except PermissionError:
            pytest.skip("mknod needs root")

    return make


@pytest.fixture
def nvml_for():
    """``nvml_for(topology, **knobs) -> FakeNvml``."""

    def make(topology: str, **knobs: object) -> FakeNvml:
        return FakeNvml(TOPOLOGIES[topology], **knobs)  # type: ignore[arg-type]

    return make
