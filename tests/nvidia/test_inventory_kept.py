"""A resident process keeps the whole inventory load while every file it read keeps its identity
(``hook.sources.nvidia.procid``), and loads again on any change (issue 34 item 8: the big node's
CreateContainer decision).

Each change is checked against a load made from scratch: the kept value never differs from it.
The per-decision work is pinned by counting, not timing: a kept load parses nothing.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.sources import warm
from hook.sources.nvidia import inventory, nvml, procfs
from tests.hosttree import TOPOLOGIES, make_host_tree
from tests.nvidia.fake_pynvml import FakeNvml

TICK = 0.05
GI_DIR = "proc/driver/nvidia/capabilities/gpu0/mig/gi2"
NEW_UUID = "MIG-5c1d0e2f-3a4b-5c6d-8e9f-a0b1c2d3e4f5"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    root = tmp_path / "root"
    spec = make_host_tree(root, "8x-mig", mknod=True)  # real nodes: their modes are read
    fake = {"nvml": FakeNvml(spec)}
    monkeypatch.setattr(nvml, "_import", lambda _module: fake["nvml"])
    warm.enable()
    yield {"root": root, "spec": spec, "fake": fake, "cache": tmp_path / "cache"}
    warm.enable(False)


def _view(inv: inventory.Inventory) -> tuple[Any, ...]:
    return (inv.driver_version, inv.majors, inv.gpus, inv.migs, inv.caps)


def kept_matches_scratch(node: dict[str, Any]) -> inventory.Inventory:
    """The warm load, checked against a load from scratch (warm views off) of the same tree."""
    kept = inventory.load(node["root"], None, node["cache"], need_migs=True)
    slots = dict(warm._slots)
    warm.enable(False)
    try:
        scratch = inventory.load(node["root"], None, node["cache"], need_migs=True)
    finally:
        warm.enable()
        warm._slots.update(slots)
    assert _view(kept) == _view(scratch)
    return kept


def _remake_gi2(node: dict[str, Any]) -> None:
    spec, gi = node["spec"], node["root"] / GI_DIR
    files = {p.relative_to(gi): p.read_bytes() for p in gi.rglob("*") if p.is_file()}
    time.sleep(TICK)
    shutil.rmtree(gi)
    for rel, data in files.items():
        (gi / rel).parent.mkdir(parents=True, exist_ok=True)
        (gi / rel).write_bytes(data)
    new = dataclasses.replace(spec.migs[1], uuid=NEW_UUID)
    node["fake"]["nvml"] = FakeNvml(dataclasses.replace(spec, migs=(spec.migs[0], new)))


def _rewrite(path: Path, old: bytes, new: bytes) -> None:
    """Same length, same inode, mtime put back: only the text (and ctime) changes."""
    st = path.stat()
    time.sleep(TICK)
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _devices(node: dict[str, Any]) -> None:
    spec = node["spec"]
    _rewrite(node["root"] / "proc/devices", f"{spec.caps_major} nvidia-caps".encode(),
             f"{spec.caps_major + 1} nvidia-caps".encode())  # fmt: skip


def _dev_cap_mode(node: dict[str, Any]) -> None:
    from tests.hosttree import cap_minor

    (node["root"] / f"dev/nvidia-caps/nvidia-cap{cap_minor(0, 2)}").chmod(0o600)


def _gone_gi2(node: dict[str, Any]) -> None:
    shutil.rmtree(node["root"] / GI_DIR)


def _destroyed_gi2(node: dict[str, Any]) -> None:
    from tests.hosttree import cap_minor

    _gone_gi2(node)
    for minor in (cap_minor(0, 2), cap_minor(0, 2, 0)):
        (node["root"] / f"dev/nvidia-caps/nvidia-cap{minor}").unlink()


CHANGES = {
    "a MIG instance made again (new UUID)": _remake_gi2,
    "/proc/devices' text (procfs: its identity says nothing)": _devices,
    "a /dev/nvidia-caps node's mode (one /proc does not list)": _dev_cap_mode,
    "a MIG instance destroyed": _destroyed_gi2,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_the_kept_load_follows_every_change(node: dict[str, Any], change: str) -> None:
    if change.startswith("a /dev/nvidia-caps"):
        _gone_gi2(node)  # its nodes are then read from /dev
    for _ in range(3):  # the first writes the cache, the second reads it, the third is kept
        kept_matches_scratch(node)
    before = kept_matches_scratch(node)
    CHANGES[change](node)
    after = kept_matches_scratch(node)
    assert _view(after) != _view(before)
    if change.startswith("a MIG instance made again"):
        assert NEW_UUID in {m.uuid for m in after.migs}


def test_nvml_answers_are_never_kept(node: dict[str, Any]) -> None:
    node["cache"] = None  # no cache: every load of MIG UUIDs asks NVML
    first = inventory.load(node["root"], None, None, need_migs=True)
    assert first.source == "proc+nvml"
    node["fake"]["nvml"] = FakeNvml(dataclasses.replace(node["spec"], migs=()))
    assert inventory.load(node["root"], None, None, need_migs=True) != first  # asked again


def test_a_kept_load_parses_nothing_on_the_big_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted: the 64 GPU + 224 MIG node's inventory, loaded for 20 decisions, is read from /proc
    once per change of its files (at most twice: a cache the first load writes is a change), not
    per decision. Failed before the whole load was kept: 20 reads of every capability file."""
    from bench import hosts

    spec = hosts.spec("64+224-mig")
    monkeypatch.setitem(TOPOLOGIES, spec.name, spec)
    root = tmp_path / "root"
    make_host_tree(root, spec.name, mknod=False)
    calls = {"caps": 0, "infos": 0}
    read_caps, read_infos = procfs.read_cap_table, procfs.read_gpu_infos

    def counting_caps(*a: Any, **kw: Any) -> Any:
        calls["caps"] += 1
        return read_caps(*a, **kw)

    def counting_infos(*a: Any, **kw: Any) -> Any:
        calls["infos"] += 1
        return read_infos(*a, **kw)

    monkeypatch.setattr(procfs, "read_cap_table", counting_caps)
    monkeypatch.setattr(procfs, "read_gpu_infos", counting_infos)
    warm.enable()
    try:
        views = [_view(inventory.load(root, None, tmp_path / "cache", need_migs=False)) for _ in range(20)]
    finally:
        warm.enable(False)
    assert all(v == views[0] for v in views)
    assert 1 <= calls["caps"] <= 2 and 1 <= calls["infos"] <= 2  # was 20 and 20
