"""apply_plan: all or nothing, on a real scratch v1 devices cgroup and a real mount namespace.

A fake /proc directory names the scratch cgroup and links ``ns`` to a live ``unshare -m``
process, so locate → cgroup → nodes run for real; failures are injected at each step."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hook.adapters.apply import devnodes, transaction
from hook.adapters.apply.cgroup_v1 import CgroupV1
from hook.adapters.apply.transaction import AppliedInfo, apply_plan
from hook.core.errors import ApplyError
from hook.core.plan import Node, Plan, Verdict
from hook.core.rules import Access, DeviceType, Rule

V1_DEVICES = Path("/sys/fs/cgroup/devices")
DENY_1 = Rule(allow=False, type=DeviceType.CHAR, major=195, minor=1, access=Access.RWM)
CAP2 = Node(path="/dev/nvidia-caps/nvidia-cap2", type="c", major=237, minor=2, file_mode=0o444)
PLAN = Plan(verdict=Verdict.APPLY, reason="test", rules=(DENY_1,), create=(CAP2,))

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (V1_DEVICES / "devices.list").exists(),
    reason="needs root and a cgroup v1 devices hierarchy",
)

PROBE = """
import os, sys
open(sys.argv[1] + "/cgroup.procs", "w").write(str(os.getpid()))
for node in sys.argv[2:]:
    try:
        os.close(os.open(node, os.O_RDONLY)); print("OK")
    except OSError as exc:
        print(exc.errno)
"""


def probe(cgroup: Path, *nodes: Path) -> list[str]:
    cmd = [sys.executable, "-I", "-c", PROBE, str(cgroup), *map(str, nodes)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout.split()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, object]]:
    """A scratch cgroup, a namespace process with a tmpfs /dev over ``rootfs/dev``, a fake /proc.

    The fake mountinfo says the devices hierarchy is mounted at a scratch parent cgroup and the
    process lives in its child ``ctr``: whatever path a regressed locate step computes from
    them stays inside cgroups this fixture made, never the machine's root device cgroup.
    """
    parent = V1_DEVICES / f"odh-tx-{uuid.uuid4().hex[:8]}"
    parent.mkdir()
    cgroup = parent / "ctr"
    cgroup.mkdir()
    rootfs = tmp_path / "rootfs"
    (rootfs / "dev").mkdir(parents=True)
    script = f"mount -t tmpfs tmpfs {rootfs}/dev && mkdir {rootfs}/dev/adir && echo ready && exec sleep 600"
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    fake = tmp_path / "proc"
    (fake / str(proc.pid)).mkdir(parents=True)
    (fake / "self").mkdir()
    (fake / str(proc.pid) / "cgroup").write_text(f"5:devices:/{cgroup.name}\n0::/\n")
    (fake / str(proc.pid) / "ns").symlink_to(f"/proc/{proc.pid}/ns")
    (fake / "self" / "mountinfo").write_text(f"53 48 0:33 / {parent} rw - cgroup cgroup rw,devices\n")
    nodes = []
    for minor in (1, 2):
        nodes.append(tmp_path / f"nvidia{minor}")
        os.mknod(nodes[-1], stat.S_IFCHR | 0o666, os.makedev(195, minor))
    yield {"pid": proc.pid, "proc": fake, "rootfs": rootfs, "cgroup": cgroup, "nodes": nodes}
    proc.kill()
    proc.wait()
    cgroup.rmdir()
    parent.rmdir()


def cap2_in(world: dict[str, object]) -> Path:
    return (
        Path(f"/proc/{world['pid']}/root") / str(world["rootfs"]).lstrip("/") / "dev/nvidia-caps/nvidia-cap2"
    )


def run(world: dict[str, object], plan: Plan = PLAN) -> AppliedInfo:
    return apply_plan(plan, int(world["pid"]), proc=Path(world["proc"]), rootfs=str(world["rootfs"]))


ENXIO, EPERM = str(errno.ENXIO), str(errno.EPERM)


def test_whole_plan_applies(world: dict[str, object]) -> None:
    info = run(world)
    assert info.cgroup_version == 1 and info.cgroup_path == str(world["cgroup"])
    assert info.created == (CAP2.path,) and info.program_ids == {}
    assert probe(world["cgroup"], *world["nodes"]) == [EPERM, ENXIO]
    assert stat.S_ISCHR(os.lstat(cap2_in(world)).st_mode)


def test_failure_at_nodes_step_undoes_the_cgroup(
    world: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise ApplyError("/dev/nvidia-caps", "", "injected")

    monkeypatch.setattr(devnodes, "apply", boom)
    with pytest.raises(ApplyError) as info:
        run(world)
    assert info.value.field == "device nodes" and "injected" in info.value.reason
    assert probe(world["cgroup"], *world["nodes"]) == [ENXIO, ENXIO]
    assert not cap2_in(world).exists()


def test_real_node_failure_undoes_cgroup_and_earlier_nodes(world: dict[str, object]) -> None:
    cgroup = Path(world["cgroup"])
    (cgroup / "devices.deny").write_text("a")
    (cgroup / "devices.allow").write_text("c 195:* rwm")
    (cgroup / "devices.allow").write_text("c 1:3 rwm")
    before = CgroupV1(cgroup).read_list()
    bad = Plan(
        verdict=Verdict.APPLY,
        reason="t",
        rules=(Rule(allow=True, type=DeviceType.CHAR, major=10, minor=200),),
        create=(CAP2, Node(path="/dev/adir", type="c", major=1, minor=1)),
    )
    with pytest.raises(ApplyError, match="not the planned device"):
        run(world, bad)
    assert CgroupV1(cgroup).read_list() == before
    assert not cap2_in(world).exists()


def test_failure_at_cgroup_step_touches_no_nodes(world: dict[str, object]) -> None:
    cgroup = Path(world["cgroup"])
    (cgroup / "devices.deny").write_text("a")
    (cgroup / "devices.allow").write_text("c 195:* rwm")
    with pytest.raises(ApplyError) as info:
        run(world)  # deny c 195:1 cannot punch a hole in c 195:*
    assert info.value.field.startswith("cgroup v1")
    assert CgroupV1(cgroup).read_list() == ("c 195:* rwm",)
    assert not cap2_in(world).exists()


def test_failed_undo_is_reported_too(world: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise ApplyError("x", "", "injected")

    def bad_rollback(self: CgroupV1) -> None:
        raise ApplyError("devices.allow", "", "rollback broke")

    monkeypatch.setattr(devnodes, "apply", boom)
    monkeypatch.setattr(CgroupV1, "rollback", bad_rollback)
    with pytest.raises(ApplyError, match=r"undo cgroup failed: devices\.allow: rollback broke"):
        run(world)


def test_locate_failure_is_apply_error(tmp_path: Path) -> None:
    with pytest.raises(ApplyError) as info:
        apply_plan(PLAN, 4242, proc=tmp_path)
    assert info.value.field == "locate cgroup" and info.value.file == str(tmp_path / "4242" / "cgroup")


def test_v1_target_does_not_import_cgroup_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "hook.adapters.apply.cgroup_v2", raising=False)
    transaction.cgroup_adapter(transaction.locate.CgroupTarget(version=1, path="/x"))
    assert "hook.adapters.apply.cgroup_v2" not in sys.modules


# ---- issue 11 item 9: the line says the step once and names the file ---------------------------


def test_node_failure_line_names_node_and_step_once(
    world: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "mknod", full)  # the forked devnodes child inherits it
    with pytest.raises(ApplyError) as info:
        run(world)
    line = str(info.value)
    assert line == f"{CAP2.path}: device nodes: mknod: No space left on device"
    assert probe(world["cgroup"], *world["nodes"]) == [ENXIO, ENXIO]  # the cgroup step was undone


class _FullOs:
    """``os`` for cgroup_v1 whose writes fail as on a full cgroup (ENOSPC)."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    @staticmethod
    def write(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_cgroup_write_failure_line_names_the_file_and_rule(
    world: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hook.adapters.apply import cgroup_v1

    monkeypatch.setattr(cgroup_v1, "os", _FullOs())
    with pytest.raises(ApplyError) as info:
        run(world)
    deny = Path(world["cgroup"]) / "devices.deny"
    assert str(info.value).startswith(f"{deny}: cgroup v1: write c 195:1 rwm: No space left on device")
    assert str(info.value).count("cgroup v1") == 1
    assert not cap2_in(world).exists()


def test_locate_failure_line_names_the_file_once(tmp_path: Path) -> None:
    with pytest.raises(ApplyError) as info:
        apply_plan(PLAN, 4242, proc=tmp_path)
    assert str(info.value).count(str(tmp_path / "4242" / "cgroup")) == 1


def test_an_os_error_is_reported_by_its_file_and_strerror(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-line error names the file and says what went wrong, without Python's ``[Errno N]``."""

    def boom(*_args: object, **_kw: object) -> None:
        raise OSError(errno.ENOENT, "No such file or directory", "/proc/42/ns/mnt")

    monkeypatch.setattr(devnodes, "apply", boom)
    plan = Plan(verdict=Verdict.APPLY, reason="test", create=(CAP2,))
    target = transaction.locate.CgroupTarget(version=1, path="/nonexistent")
    with pytest.raises(ApplyError) as info:
        apply_plan(plan, 42, target=target)
    assert (info.value.file, info.value.field, info.value.reason) == (
        "/proc/42/ns/mnt",
        "device nodes",
        "No such file or directory",
    )
