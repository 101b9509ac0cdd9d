"""CgroupV1: a tmp-dir fake cgroupfs for the write sequence (runc's v1_test style) and a real
scratch v1 devices cgroup for what the kernel actually does (EPERM vs ENXIO on fake nodes)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hook.adapters.apply.cgroup_v1 import CgroupV1, ListEntry, check_effect, parse_list
from hook.core.errors import ApplyError
from hook.core.rules import Access, DeviceType, Rule

V1_DEVICES = Path("/sys/fs/cgroup/devices")


def deny(major: int, minor: int | None, acc: str = "rwm") -> Rule:
    return Rule(allow=False, type=DeviceType.CHAR, major=major, minor=minor, access=Access.parse(acc))


def allow(major: int, minor: int | None, acc: str = "rwm") -> Rule:
    return Rule(allow=True, type=DeviceType.CHAR, major=major, minor=minor, access=Access.parse(acc))


def fake_cgroup(tmp_path: Path, listing: str) -> Path:
    for name in ("devices.allow", "devices.deny"):
        (tmp_path / name).write_text("")
    (tmp_path / "devices.list").write_text(listing)
    return tmp_path


# ---- pure parts -------------------------------------------------------------------------------


def test_parse_list_reads_wildcards_and_access() -> None:
    """Plain values (type letter, access bits): the live apply step loads no enum (issue 35)."""
    entries = parse_list("c 195:* rw\nb 8:0 m\na *:* rwm\n", "devices.list")
    assert entries == (
        ListEntry("c", 195, None, (Access.R | Access.W).value),
        ListEntry("b", 8, 0, Access.M.value),
        ListEntry("a", None, None, Access.RWM.value),
    )
    assert [str(e.type) for e in entries] == [DeviceType.CHAR, DeviceType.BLOCK, DeviceType.ALL]


def test_parse_list_bad_line_names_file_and_line() -> None:
    with pytest.raises(ApplyError) as info:
        parse_list("c 195:0 rw\nc 195 rw\n", "x/devices.list")
    assert info.value.file == "x/devices.list"
    assert info.value.field == "line 2"


@pytest.mark.parametrize(
    ("listing", "rules", "failed"),
    [
        pytest.param("c 195:* rwm", [deny(195, 1)], ["deny c 195:1 rwm"], id="deny inside allowed wildcard"),
        pytest.param("c 195:0 rwm", [deny(195, 1)], [], id="deny of absent device holds"),
        pytest.param("c 195:1 m", [deny(195, 1, "rw")], [], id="deny rw leaves m"),
        pytest.param("c 195:1 rw", [allow(195, 1, "rwm")], ["allow c 195:1 rwm"], id="allow missing m"),
        pytest.param("c 195:* rwm", [allow(195, 3, "rw")], [], id="allow covered by wildcard"),
        pytest.param("", [allow(195, 3), deny(195, 3)], [], id="later deny decides"),
        pytest.param("a *:* rwm", [deny(195, 1)], [], id="default allow hides denies"),
        pytest.param("a *:* rwm", [Rule(allow=False)], ["deny a"], id="wildcard deny must flip behaviour"),
    ],
)
def test_check_effect(listing: str, rules: list[Rule], failed: list[str]) -> None:
    assert check_effect(parse_list(listing, "l"), rules) == failed


# ---- fake cgroupfs ----------------------------------------------------------------------------


def test_apply_writes_one_line_per_rule_in_order(tmp_path: Path) -> None:
    cg = CgroupV1(fake_cgroup(tmp_path, "a *:* rwm\n"))
    applied = cg.apply([deny(195, 1), deny(195, 2, "rw")])
    assert (tmp_path / "devices.deny").read_text() == "c 195:1 rwm\nc 195:2 rw\n"
    assert (tmp_path / "devices.allow").read_text() == ""
    assert applied.before == ("a *:* rwm",)
    assert applied.written == ("deny c 195:1 rwm", "deny c 195:2 rw")


def test_apply_fails_when_list_shows_no_effect(tmp_path: Path) -> None:
    cg = CgroupV1(fake_cgroup(tmp_path, "c 195:* rwm\n"))
    with pytest.raises(ApplyError) as info:
        cg.apply([deny(195, 1)])
    assert info.value.file.endswith("devices.list")
    assert "deny c 195:1 rwm" in info.value.reason


def test_rollback_default_deny_restores_saved_lines(tmp_path: Path) -> None:
    cg = CgroupV1(fake_cgroup(tmp_path, "c 1:3 rwm\nc 195:0 rw\n"))
    cg.apply([deny(195, 1)])
    (tmp_path / "devices.allow").write_text("")
    (tmp_path / "devices.deny").write_text("")
    cg.rollback()
    assert (tmp_path / "devices.deny").read_text() == "a\n"
    assert (tmp_path / "devices.allow").read_text() == "c 1:3 rwm\nc 195:0 rw\n"


def test_rollback_default_allow_undoes_only_our_denies(tmp_path: Path) -> None:
    cg = CgroupV1(fake_cgroup(tmp_path, "a *:* rwm\n"))
    cg.apply([deny(195, 1), deny(195, 2)])
    cg.rollback()
    assert (tmp_path / "devices.allow").read_text() == "c 195:2 rwm\nc 195:1 rwm\n"


def test_rollback_default_allow_after_wildcard_deny_writes_a(tmp_path: Path) -> None:
    cg = CgroupV1(fake_cgroup(tmp_path, "a *:* rwm\n"))
    # the fake list does not change, so the flip is not seen
    with pytest.raises(ApplyError, match="rules without effect after writing: deny a"):
        cg.apply([Rule(allow=False), allow(195, 0)])
    (tmp_path / "devices.allow").write_text("")
    cg.rollback()
    assert (tmp_path / "devices.allow").read_text() == "a\n"


def test_rollback_before_apply_is_noop(tmp_path: Path) -> None:
    cg = CgroupV1(fake_cgroup(tmp_path, "a *:* rwm\n"))
    cg.rollback()
    assert (tmp_path / "devices.allow").read_text() == ""


def test_missing_cgroup_dir_is_apply_error(tmp_path: Path) -> None:
    with pytest.raises(ApplyError) as info:
        CgroupV1(tmp_path / "gone").apply([deny(195, 1)])
    assert info.value.file == str(tmp_path / "gone" / "devices.list")


# ---- real v1 devices cgroup -------------------------------------------------------------------

needs_v1 = pytest.mark.skipif(
    not (V1_DEVICES / "devices.list").exists() or os.geteuid() != 0,
    reason="needs root and a cgroup v1 devices hierarchy at /sys/fs/cgroup/devices",
)

PROBE = """
import os, sys
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
for node in sys.argv[2:]:
    try:
        os.close(os.open(node, os.O_RDONLY))
        print("OK")
    except OSError as exc:
        print(exc.errno)
"""


def probe(cgroup: Path, *nodes: Path) -> list[int | str]:
    """Open each node from a child that first joins ``cgroup``: errno per node (0 never)."""
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, str(cgroup), *map(str, nodes)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    return [int(x) if x.isdigit() else x for x in out]


@pytest.fixture
def scratch_cgroup() -> Path:
    path = V1_DEVICES / f"odh-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    path.rmdir()


@pytest.fixture
def fake_nodes(tmp_path: Path) -> list[Path]:
    nodes = []
    for minor in (1, 2):
        node = tmp_path / f"nvidia{minor}"
        os.mknod(node, 0o666 | 0o020000, os.makedev(195, minor))
        nodes.append(node)
    return nodes


@needs_v1
def test_real_deny_gives_eperm_allowed_gives_enxio(scratch_cgroup: Path, fake_nodes: list[Path]) -> None:
    assert probe(scratch_cgroup, *fake_nodes) == [errno.ENXIO, errno.ENXIO]
    cg = CgroupV1(scratch_cgroup)
    applied = cg.apply([deny(195, 1)])
    assert applied.after == ("a *:* rwm",)
    assert probe(scratch_cgroup, *fake_nodes) == [errno.EPERM, errno.ENXIO]
    cg.rollback()
    assert probe(scratch_cgroup, *fake_nodes) == [errno.ENXIO, errno.ENXIO]


@needs_v1
def test_real_default_deny_apply_twice_is_idempotent_and_rollback_exact(
    scratch_cgroup: Path, fake_nodes: list[Path]
) -> None:
    (scratch_cgroup / "devices.deny").write_text("a")
    (scratch_cgroup / "devices.allow").write_text("c 1:3 rwm")
    cg = CgroupV1(scratch_cgroup)
    first = cg.apply([allow(195, 2, "rw")])
    assert first.after == ("c 1:3 rwm", "c 195:2 rw")
    second = CgroupV1(scratch_cgroup).apply([allow(195, 2, "rw")])
    assert second.before == second.after == first.after
    assert probe(scratch_cgroup, *fake_nodes) == [errno.EPERM, errno.ENXIO]
    cg.rollback()
    assert cg.read_list() == ("c 1:3 rwm",)
    assert probe(scratch_cgroup, *fake_nodes) == [errno.EPERM, errno.EPERM]


@needs_v1
def test_real_hole_in_wildcard_is_refused_and_rolled_back(scratch_cgroup: Path) -> None:
    (scratch_cgroup / "devices.deny").write_text("a")
    (scratch_cgroup / "devices.allow").write_text("c 195:* rwm")
    cg = CgroupV1(scratch_cgroup)
    with pytest.raises(ApplyError, match="deny c 195:1"):
        cg.apply([deny(195, 1)])
    cg.rollback()
    assert cg.read_list() == ("c 195:* rwm",)
