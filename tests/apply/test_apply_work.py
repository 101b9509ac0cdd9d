"""The work of applying a big plan grows by what each rule or node needs, not by re-doing the rest.

Counted, not timed (issue 35: the 254-GPU and 64 GPUs + 224 MIG rows against the 8-GPU one): the
calls that become syscalls are counted around the v1 writer and the node helper, on the small
plan and on the big one. Per rule the v1 writer makes one ``write(2)`` (the kernel parses one rule
per write) and nothing else; per node the helper makes one ``lstat`` and one ``unlink``, and each
directory of ``/dev`` is walked once, however many nodes it holds. The eBPF builder emits the rule
blocks once per apply, however many programs it wraps.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.apply import bpf, devnodes, devpath
from hook.adapters.apply.cgroup_v1 import CgroupV1
from hook.adapters.apply.devpath import Change, DevDir
from hook.core.plainplan import PlainRule
from hook.core.record import fields

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of char nodes needs root")

OS_CALLS = ("open", "close", "dup", "write", "stat", "unlink", "mkdir", "fstat")


@pytest.fixture
def count(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Every ``os`` call of ``OS_CALLS`` (and each openat2) made while the test runs, by name."""
    seen: Counter[str] = Counter()

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen[name] += 1
            return real(*args, **kwargs)

        return call

    for name in OS_CALLS:
        monkeypatch.setattr(os, name, counted(name, getattr(os, name)))
    monkeypatch.setattr(devpath, "open_child_dir", counted("open_child_dir", devpath.open_child_dir))
    yield seen


def deny(minor: int) -> PlainRule:
    return PlainRule(allow=False, type="c", major=195, minor=minor, access="rwm")


def v1_work(tmp_path: Path, count: Counter[str], rules: int) -> Counter[str]:
    cg = tmp_path / f"cg{rules}"
    cg.mkdir()
    for name in ("devices.allow", "devices.deny"):
        (cg / name).write_text("")
    (cg / "devices.list").write_text("a *:* rwm\n")
    count.clear()
    applied = CgroupV1(cg).apply([PlainRule(allow=True, type="a"), *(deny(m) for m in range(rules))])
    assert len(applied.written) == rules + 1
    assert (cg / "devices.deny").read_text().count("\n") == rules  # every rule written, in order
    return Counter(count)


def test_v1_a_big_plan_costs_one_write_per_rule_and_no_more_opens(
    tmp_path: Path, count: Counter[str]
) -> None:
    small, big = v1_work(tmp_path, count, 8), v1_work(tmp_path, count, 256)
    assert big["write"] - small["write"] == 256 - 8  # one rule per write(2), as the kernel parses them
    grown = {name: big[name] - small[name] for name in OS_CALLS if name != "write"}
    assert grown == dict.fromkeys(grown, 0), grown  # each file opened (and closed) once, whatever the size


def dev_tree(root: Path, gpus: int, caps: int) -> list[str]:
    """A container /dev with ``gpus`` GPU nodes and ``caps`` MIG capability nodes; their paths."""
    (root / "nvidia-caps").mkdir(parents=True)
    paths = []
    for n in range(gpus):
        os.mknod(root / f"nvidia{n}", stat.S_IFCHR | 0o666, os.makedev(195, n))
        os.chmod(root / f"nvidia{n}", 0o666)  # past the umask, as runc makes them
        paths.append(f"/dev/nvidia{n}")
    for n in range(caps):
        os.mknod(root / "nvidia-caps" / f"nvidia-cap{n}", stat.S_IFCHR | 0o444, os.makedev(511, n))
        os.chmod(root / "nvidia-caps" / f"nvidia-cap{n}", 0o444)
        paths.append(f"/dev/nvidia-caps/nvidia-cap{n}")
    return paths


def node_work(tmp_path: Path, count: Counter[str], gpus: int, caps: int) -> tuple[Counter[str], int]:
    root = tmp_path / f"dev-{gpus}-{caps}"
    paths = dev_tree(root, gpus, caps)
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        dev = DevDir(fd, os.fstat(fd).st_dev)
        count.clear()
        devpath.run_actions(dev, [("unlink", Change(op="unlink", path=p)) for p in paths])
        work = Counter(count)
        assert [r[1] for r in dev.journal] == paths and not dev.skipped
        # what an undo re-creates: the removed node as it was (the row read back as its Change)
        assert devpath.change(dev.journal[0]) == Change(
            op="unlink", path="/dev/nvidia0", type="c", major=195, minor=0, mode=0o666, uid=0, gid=0
        )
        assert devpath.change(dev.journal[-1]).mode == 0o444
        assert not os.listdir(root / "nvidia-caps") and os.listdir(root) == ["nvidia-caps"]
        assert not getattr(dev, "dirs", {})  # every directory fd it held is closed
    finally:
        os.close(fd)
    return work, len(paths)


def test_removing_many_nodes_walks_each_directory_once(tmp_path: Path, count: Counter[str]) -> None:
    (small, n_small), (big, n_big) = node_work(tmp_path, count, 8, 2), node_work(tmp_path, count, 254, 448)
    nodes = n_big - n_small
    assert big["stat"] - small["stat"] == nodes  # one lstat per node
    assert big["unlink"] - small["unlink"] == nodes
    grown = {
        name: big[name] - small[name]
        for name in (*OS_CALLS, "open_child_dir")
        if name not in ("stat", "unlink")
    }
    assert grown == dict.fromkeys(grown, 0), grown  # no dup, walk or close per node
    assert big["open_child_dir"] == 1  # /dev/nvidia-caps, once for its 448 nodes


def test_undo_after_a_removed_directory_walks_it_again(tmp_path: Path) -> None:
    """A directory the helper removed is not reused from its held fd: a node made there after
    (an undo that re-creates) gets the directory made again, journalled, not a stale fd's ENOENT."""
    root = tmp_path / "dev"
    root.mkdir()
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        dev = DevDir(fd, os.fstat(fd).st_dev)
        node = Change(op="mknod", path="/dev/a/b/x", type="c", major=1, minor=3, mode=0o600)
        devpath.run_actions(dev, [("mknod", node)])
        dev.journal.clear()
        devpath.run_actions(
            dev, [("unlink-ours", node), ("rmdir", Change(op="rmdir", path="/dev/a/b")), ("mknod", node)]
        )
        assert [r[0] for r in dev.journal] == ["unlink", "mkdir", "mknod"]
        assert stat.S_ISCHR(os.lstat(root / "a" / "b" / "x").st_mode)
    finally:
        os.close(fd)


def test_the_rule_blocks_are_built_once_per_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """``build_program`` emits the rule blocks once (the marker's digest is over those bytes), and
    a caller that wraps several programs passes the same code to each."""
    built = Counter[str]()
    real = bpf._rule_blocks

    def blocks(rules: Any) -> Any:
        built["blocks"] += 1
        return real(rules)

    monkeypatch.setattr(bpf, "_rule_blocks", blocks)
    rules = [PlainRule(allow=True, type="a"), *(deny(m) for m in range(64))]
    prog = bpf.build_program(rules, None, True, normalized=True)
    assert built["blocks"] == 1
    assert bpf.read_marker(prog) == bpf.rules_digest(rules, normalized=True)


def test_a_journal_row_carries_every_field_of_a_change() -> None:
    """The helper keeps and reports its journal as rows (no record per node, no field names on the
    pipe); a field added to ``Change`` and not to the row would be lost on the way to the undo."""
    assert tuple(f.name for f in fields(Change)) == devpath.ROW
    c = Change(op="unlink", path="/dev/nvidia3", type="c", major=195, minor=3, mode=0o666, uid=7, gid=8)
    r = devpath.row(c)
    assert dict(zip(devpath.ROW, r, strict=True)) == {n: getattr(c, n) for n in devpath.ROW}
    assert devpath.change(r) == c
    undo = devnodes.Undo(pid=1, rootfs=None, rows=(tuple(r), ("mknod", "/dev/x", "c", 1, 3, 0o600, 0, 0)))
    assert undo.journal[0] == c and undo.removed == ("/dev/nvidia3",) and undo.created == ("/dev/x",)
