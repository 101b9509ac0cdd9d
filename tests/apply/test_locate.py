"""locate: version from the /sys/fs/cgroup mount, path from the matching /proc/<pid>/cgroup line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hook.adapters.apply.locate import (
    CgroupTarget,
    cgroup_problem,
    expected_cgroup,
    find,
    find_container,
    parse_mountinfo,
    parse_proc_cgroup,
    resolve,
)
from hook.core.errors import ApplyError, InputError

HYBRID_MOUNTS = """\
48 47 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
49 48 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
53 48 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
58 48 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED_MOUNTS = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
HYBRID_CGROUP = "5:devices:/ctr/abc\n4:memory:/ctr/abc\n0::/ctr/abc-v2\n"


def target(cgroup: str, mounts: str) -> CgroupTarget:
    return resolve(
        parse_proc_cgroup(cgroup, "cg"), parse_mountinfo(mounts, "mi"), cgroup_source="cg", mount_source="mi"
    )


def test_hybrid_host_is_v1_even_with_a_0_line() -> None:
    assert target(HYBRID_CGROUP, HYBRID_MOUNTS) == CgroupTarget(
        version=1, path="/sys/fs/cgroup/devices/ctr/abc"
    )


def test_unified_host_is_v2_from_the_0_line() -> None:
    assert target("0::/kubepods/pod1/c1\n", UNIFIED_MOUNTS) == CgroupTarget(
        version=2, path="/sys/fs/cgroup/kubepods/pod1/c1"
    )


def test_mount_root_is_stripped_from_the_cgroup_path() -> None:
    mounts = "53 48 0:33 /kubepods /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
    got = target("5:devices:/kubepods/pod1/c1\n", mounts)
    assert got.path == "/sys/fs/cgroup/devices/pod1/c1"


def test_combined_controllers_line_matches_devices() -> None:
    mounts = "53 48 0:33 / /sys/fs/cgroup/devices,memory rw - cgroup cgroup rw,memory,devices\n"
    got = target("3:memory,devices:/c\n", mounts)
    assert got == CgroupTarget(version=1, path="/sys/fs/cgroup/devices,memory/c")


def test_escaped_mount_point_is_unescaped() -> None:
    mounts = r"53 48 0:33 / /sys/fs/cgroup/my\040devs rw - cgroup cgroup rw,devices" + "\n"
    assert target("5:devices:/c\n", mounts).path == "/sys/fs/cgroup/my devs/c"


@pytest.mark.parametrize(
    ("cgroup", "mounts", "field"),
    [
        pytest.param("5:devices:/../../etc\n", HYBRID_MOUNTS, "devices line", id="dotdot in cgroup path"),
        pytest.param("5:devices:/a/../b\n", HYBRID_MOUNTS, "devices line", id="dotdot inside path"),
        pytest.param(
            "5:devices:/c\n",
            "53 48 0:33 /.. /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n",
            "/sys/fs/cgroup/devices root",
            id="mount root starting with /..",
        ),
        pytest.param("4:memory:/c\n0::/c\n", HYBRID_MOUNTS, "devices line", id="no devices line on v1"),
        pytest.param("5:devices:/c\n", UNIFIED_MOUNTS, "0:: line", id="no 0:: line on v2"),
        pytest.param(
            "5:devices:/c\n", "1 0 0:1 / /sys/fs/cgroup rw - tmpfs t rw\n", "mounts", id="no devices mount"
        ),
        pytest.param("garbage\n", HYBRID_MOUNTS, "line 1", id="malformed cgroup line"),
        pytest.param(  # issue 24, fresh mutant s530669-144: `sep + 3` took it and raised IndexError
            "5:devices:/c\n",
            "53 48 0:33 / /sys/fs/cgroup/devices rw - cgroup cgroup\n",
            "line 1",
            id="mountinfo line without super options",
        ),
    ],
)
def test_refusals_name_the_field(cgroup: str, mounts: str, field: str) -> None:
    with pytest.raises(InputError) as info:
        target(cgroup, mounts)
    assert info.value.field == field
    assert info.value.file in ("cg", "mi")


def test_cgroup_outside_mount_root_is_apply_error() -> None:
    mounts = "53 48 0:33 /kubepods /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
    with pytest.raises(ApplyError, match=r"cgroup /system\.slice/x is outside the mounted root /kubepods"):
        target("5:devices:/system.slice/x\n", mounts)


def test_mountinfo_without_separator_names_line() -> None:
    with pytest.raises(InputError) as info:
        parse_mountinfo("1 0 0:1 / / rw shared:1\n", "mi")
    assert (info.value.file, info.value.field) == ("mi", "line 1")


def test_find_reads_fake_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "self").mkdir()
    (tmp_path / "42" / "cgroup").write_text(HYBRID_CGROUP)
    (tmp_path / "self" / "mountinfo").write_text(HYBRID_MOUNTS)
    assert find(42, proc=tmp_path).path == "/sys/fs/cgroup/devices/ctr/abc"


def test_find_missing_proc_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        find(42, proc=tmp_path)
    assert info.value.file == str(tmp_path / "42" / "cgroup")


def test_find_on_this_host_matches_own_cgroup_file() -> None:
    got = find(os.getpid())
    text = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    line = next(ln for ln in text.splitlines() if (":devices:" in ln) == (got.version == 1) and ln)
    assert str(got.path).endswith(line.split(":", 2)[2].rstrip("/")) or line.endswith(":/")
    assert os.path.isdir(got.path)


def test_a_mount_stacked_on_the_devices_hierarchy_is_the_one_used() -> None:
    """A bind mount of a sub-cgroup over /sys/fs/cgroup/devices hides the original mount there:
    paths are relative to the visible mount's root (the live tests rely on it)."""
    mounts = (
        "53 48 0:33 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
        "90 53 0:33 /guard /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
    )
    got = target("5:devices:/guard/odh-live/c1\n", mounts)
    assert got == CgroupTarget(version=1, path="/sys/fs/cgroup/devices/odh-live/c1")
    v2 = (
        "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
        "91 30 0:26 /guard /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    )
    assert target("0::/guard/c2\n", v2) == CgroupTarget(version=2, path="/sys/fs/cgroup/c2")


# ---- issue 11 item 2: the state's pid must be a container's ------------------------------------


@pytest.mark.parametrize(
    ("cgroups_path", "want"),
    [
        ("", ()),
        ("/odh-live/abc", ("odh-live", "abc")),
        ("kubepods/burstable/pod1/abc", ("kubepods", "burstable", "pod1", "abc")),
        ("kubepods-burstable-pod1.slice:cri-containerd:abc", ("cri-containerd-abc.scope",)),
        ("system.slice:docker:abc", ("docker-abc.scope",)),
        ("machine.slice::abc", ("abc.scope",)),
        ("user.slice:prefix:my.slice", ("my.slice",)),
    ],
)
def test_expected_cgroup_reads_runtime_syntax(cgroups_path: str, want: tuple[str, ...]) -> None:
    assert expected_cgroup(cgroups_path) == want


SYSTEMD_V2 = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope\n"
)


@pytest.mark.parametrize(
    ("cgroup", "version", "cgroups_path", "problem"),
    [
        (HYBRID_CGROUP, 1, "/ctr/abc", ""),
        (HYBRID_CGROUP, 1, "", ""),
        (HYBRID_CGROUP, 1, "/ctr/other", "is not linux.cgroupsPath"),
        (HYBRID_CGROUP, 1, "/abc", ""),  # the runtime's own cgroup namespace may hide a prefix
        (HYBRID_CGROUP, 1, "/bc", "is not linux.cgroupsPath"),  # whole components only
        ("5:devices:/\n0::/ctr/abc\n", 1, "", "root cgroup"),  # v1: the devices line decides
        ("5:devices:/ctr/abc\n0::/\n", 2, "", "root cgroup"),  # v2: the 0:: line decides
        ("5:devices:/ctr/abc\n0::/\n", 1, "/ctr/abc", ""),  # hybrid: a root 0:: line is not ours to write
        ("0::/\n", 2, "/ctr/abc", "root cgroup"),
        ("4:memory:/x\n", 1, "", "no devices line"),
        (SYSTEMD_V2, 2, "kubepods-burstable-pod1.slice:cri-containerd:abc", ""),
        (SYSTEMD_V2, 2, "kubepods-burstable-pod1.slice:cri-containerd:def", "is not linux.cgroupsPath"),
        (
            "0::/machine.slice/libpod-abc.scope/container\n",
            2,
            "machine.slice:libpod:abc",
            "",
        ),  # crun subgroup
    ],
)
def test_cgroup_problem(cgroup: str, version: int, cgroups_path: str, problem: str) -> None:
    got = cgroup_problem(parse_proc_cgroup(cgroup, "cg"), version, cgroups_path)
    assert (problem in got) if problem else got == ""


def fake_proc(tmp_path: Path, cgroup: str, *, same_ns: bool) -> Path:
    """A fake /proc: pid 42 with ``cgroup``; its ns is this process's own or another namespace file."""
    (tmp_path / "42" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "42" / "cgroup").write_text(cgroup)
    (tmp_path / "self" / "mountinfo").write_text(HYBRID_MOUNTS)
    (tmp_path / "self" / "ns" / "mnt").write_text("ours")
    if same_ns:
        (tmp_path / "42" / "ns" / "mnt").hardlink_to(tmp_path / "self" / "ns" / "mnt")
    else:
        (tmp_path / "42" / "ns" / "mnt").write_text("theirs")
    return tmp_path


def test_find_container_accepts_a_container(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, HYBRID_CGROUP, same_ns=False)
    assert find_container(42, "/ctr/abc", source="state", proc=proc).path == "/sys/fs/cgroup/devices/ctr/abc"


@pytest.mark.parametrize(
    ("cgroup", "same_ns", "cgroups_path", "why"),
    [
        (HYBRID_CGROUP, True, "/ctr/abc", "shares the hook's mount namespace"),
        ("5:devices:/\n0::/\n", False, "", "root cgroup"),
        (HYBRID_CGROUP, False, "/ctr/xyz", "linux.cgroupsPath"),
    ],
)
def test_find_container_refuses_one_line_on_the_pid_field(
    tmp_path: Path, cgroup: str, same_ns: bool, cgroups_path: str, why: str
) -> None:
    proc = fake_proc(tmp_path, cgroup, same_ns=same_ns)
    with pytest.raises(InputError) as info:
        find_container(42, cgroups_path, source="state (stdin)", proc=proc)
    assert (info.value.file, info.value.field) == ("state (stdin)", "pid")
    assert why in info.value.reason and str(info.value).count("\n") == 0


def test_find_container_refuses_this_very_process() -> None:
    with pytest.raises(InputError, match="mount namespace"):
        find_container(os.getpid(), "", source="state")


def test_mountinfo_octal_escapes_are_three_digits() -> None:
    """``\\040`` is a space and ``\\134`` a backslash (proc(5)); both forms in one mount point."""
    (m,) = parse_mountinfo("53 48 0:33 / /sys/fs/a\\040b\\134c rw - cgroup cgroup rw,devices\n", "mi")
    assert m.mount_point == "/sys/fs/a b\\c"


def _pathlib_target(cgroup: str, root: str, mount_point: str) -> str | None:
    """What ``resolve`` computed with pathlib (before issue 35): None where it refused."""
    from pathlib import PurePosixPath

    cg, rt = PurePosixPath(cgroup), PurePosixPath(root)
    if not cg.is_absolute() or ".." in cg.parts or not rt.is_absolute() or ".." in rt.parts:
        return None
    try:
        return str(PurePosixPath(mount_point) / cg.relative_to(rt))
    except ValueError:
        return None


def test_paths_are_read_as_pathlib_reads_them() -> None:
    """Issue 35 item 1: locate reads paths without pathlib (it would cost every applied start re,
    fnmatch, urllib.parse and ipaddress); every spelling reads as ``PurePosixPath`` reads it,
    ``//`` (kept by POSIX) and ``///`` included, and the cgroup found is pathlib's."""
    import random
    from pathlib import PurePosixPath

    from hook.adapters.apply import locate

    rng = random.Random(35)
    pieces = ["", ".", "..", "a", "b", "c d", "/", "//", "///"]
    spellings = {"", "/", "//", "///", ".", "a", "/a/", "//a", "///a//b/.", "a/./b", "/a/../b"}
    spellings |= {"".join(rng.choice(pieces) + rng.choice(["/", "//", ""]) for _ in range(rng.randint(1, 5)))
                  for _ in range(400)}  # fmt: skip
    for p in sorted(spellings):
        assert locate._parts(p) == PurePosixPath(p).parts, p
        assert locate.path_text(p) == str(PurePosixPath(p)), p
    roots = ["/", "//", "/a", "/a/", "//a", "/a/b", "/b", "/a/..", "a"]
    for cgroup in sorted(spellings):
        for root in roots:
            mounts = (locate.Mount(root=root, mount_point="/sys/fs/cgroup/devices", fstype="cgroup",
                                   super_options=("rw", "devices")),)  # fmt: skip
            lines = (locate.CgroupLine(hierarchy=4, controllers=("devices",), path=cgroup),)
            try:
                got: str | None = locate.resolve(lines, mounts, cgroup_source="c", mount_source="m").path
            except (InputError, ApplyError):
                got = None
            assert got == _pathlib_target(cgroup, root, "/sys/fs/cgroup/devices"), (cgroup, root)
