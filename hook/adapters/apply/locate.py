"""Which device cgroup a container is in, and which cgroup version governs it.

Rule: the version is what is mounted at ``/sys/fs/cgroup`` in the hook's own mount namespace
(as runc decides it), never a guess from ``/proc/<pid>/cgroup``: on a hybrid host that file has
both a ``devices`` line and a ``0::`` line. The path is the mount point joined with the
container's cgroup path made relative to the mount's root; any ``..`` is refused.
Parsers take text; only ``find`` and ``_read`` touch the filesystem. Paths are strings read the
way ``pathlib.PurePosixPath`` reads them (``_parts``; a test holds the two equal): this runs on every
applied start, and ``pathlib`` would cost it ``re``, ``fnmatch``, ``urllib.parse`` and ``ipaddress``.
"""

from __future__ import annotations

import os
import sys

from hook.core.errors import ApplyError, InputError
from hook.core.record import record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from os import PathLike

__all__ = [
    "CgroupLine",
    "CgroupTarget",
    "Mount",
    "cgroup_problem",
    "expected_cgroup",
    "find",
    "find_container",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "path_text",
    "read_text",
]

CGROUP_ROOT = "/sys/fs/cgroup"


@record
class CgroupTarget:
    version: int  # 1 or 2
    path: str  # the cgroup's directory, as pathlib would print it


def _parts(path: str) -> tuple[str, ...]:
    """``PurePosixPath(path).parts``: the anchor (``/``, or ``//`` exactly, as POSIX allows), then
    every component but empty ones and ``.`` (``..`` is kept)."""
    if path.startswith("/"):
        anchor: tuple[str, ...] = ("//",) if path.startswith("//") and not path.startswith("///") else ("/",)
    else:
        anchor = ()
    return anchor + tuple(p for p in path.split("/") if p and p != ".")


def _text(parts: tuple[str, ...]) -> str:
    """``str(PurePosixPath(*parts))`` for parts from ``_parts`` (``.`` when there are none)."""
    if parts and parts[0] in ("/", "//"):
        return parts[0] + "/".join(parts[1:])
    return "/".join(parts) or "."


@record
class CgroupLine:
    """One ``hierarchy:controllers:path`` line of ``/proc/<pid>/cgroup``."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str


@record
class Mount:
    """The fields of one ``mountinfo`` line that locating a cgroup needs."""

    root: str
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo`` octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and len(field[i + 1 : i + 4]) == 3:
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_proc_cgroup(text: str, source: str) -> tuple[CgroupLine, ...]:
    """Parse ``/proc/<pid>/cgroup``; a malformed line is an InputError naming its number."""
    lines = []
    for no, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        parts = raw.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            raise InputError(source, f"line {no}", f"expected hierarchy:controllers:path, got {raw!r}")
        ctrls = tuple(c for c in parts[1].split(",") if c)
        lines.append(CgroupLine(hierarchy=int(parts[0]), controllers=ctrls, path=parts[2]))
    return tuple(lines)


def parse_mountinfo(text: str, source: str) -> tuple[Mount, ...]:
    """Parse ``mountinfo`` (proc(5)): fields 4/5 are root and mount point; fstype follows the ``-``."""
    mounts = []
    for no, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        fields = raw.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            raise InputError(source, f"line {no}", "no ' - ' separator") from None
        if len(fields) < sep + 4:
            raise InputError(source, f"line {no}", "too few fields after ' - '")
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[sep + 1],
                super_options=tuple(fields[sep + 3].split(",")),
            )
        )
    return tuple(mounts)


def cgroup_version(mounts: tuple[Mount, ...], cgroup_root: str = CGROUP_ROOT) -> int:
    """2 when the last mount at ``cgroup_root`` is cgroup2 (unified host), else 1 (v1 or hybrid)."""
    at_root = [m for m in mounts if m.mount_point == cgroup_root]
    return 2 if at_root and at_root[-1].fstype == "cgroup2" else 1


def _checked(path: str, source: str, field: str) -> tuple[str, ...]:
    """An absolute path with no ``..`` component (its ``_parts``); ``..`` would leave the hierarchy."""
    p = _parts(path)
    if not p or p[0] not in ("/", "//") or ".." in p:
        raise InputError(source, field, f"unsafe cgroup path {path!r}")
    return p


def _visible(mounts: tuple[Mount, ...]) -> list[Mount]:
    """Mounts not hidden by a later mount on the same point (mountinfo lists the stack in order)."""
    last = {m.mount_point: i for i, m in enumerate(mounts)}
    return [m for i, m in enumerate(mounts) if last[m.mount_point] == i]


def _pick_mount(mounts: tuple[Mount, ...], version: int, source: str) -> Mount:
    mounts = tuple(_visible(mounts))
    if version == 2:
        found = [m for m in mounts if m.fstype == "cgroup2"]
        # prefer the mount at /sys/fs/cgroup itself when several exist
        found.sort(key=lambda m: m.mount_point != CGROUP_ROOT)
    else:
        found = [m for m in mounts if m.fstype == "cgroup" and "devices" in m.super_options]
    if not found:
        kind = "cgroup2" if version == 2 else "cgroup v1 devices"
        raise InputError(source, "mounts", f"no {kind} mount")
    return found[0]


def _device_lines(lines: tuple[CgroupLine, ...], version: int) -> tuple[list[CgroupLine], str]:
    """The lines that name the cgroup the hook writes to: v1 ``devices``, v2 ``0::``."""
    if version == 2:
        return [ln for ln in lines if ln.hierarchy == 0 and not ln.controllers], "0:: line"
    return [ln for ln in lines if "devices" in ln.controllers], "devices line"


def expected_cgroup(cgroups_path: str) -> tuple[str, ...]:
    """The path components ``linux.cgroupsPath`` puts a container in, as far as runc and crun agree.

    ``/a/b`` and ``a/b`` (cgroupfs driver) name ``a/b`` below some root; ``slice:prefix:name``
    (systemd driver) names the unit ``prefix-name.scope`` (or the slice ``name`` itself when it
    ends in ``.slice``) somewhere below the slice tree. Empty means "no expectation".
    """
    path = cgroups_path.strip()
    if not path:
        return ()
    parts = path.split(":")
    if len(parts) == 3 and not path.startswith("/"):
        _, prefix, name = parts
        if name.endswith(".slice"):
            return (name,)
        return (f"{prefix}-{name}.scope" if prefix else f"{name}.scope",)
    return tuple(p for p in _parts(path) if p != "/" and p != ".")


def _runs_in(have: tuple[str, ...], want: tuple[str, ...]) -> bool:
    """``want`` is a contiguous run of ``have`` ending at its last component or the one before it
    (crun and systemd's delegation may put the process in one sub-cgroup of the named one)."""
    n = len(want)
    return any(have[end - n : end] == want for end in (len(have), len(have) - 1) if end >= n)


def cgroup_problem(lines: tuple[CgroupLine, ...], version: int, cgroups_path: str) -> str:
    """Why these ``/proc/<pid>/cgroup`` lines are not a container's ("" when they may be).

    A root cgroup is never a container's (its rules would reach every container on the node);
    where config.json names ``linux.cgroupsPath`` the process must be in that cgroup.
    """
    match, what = _device_lines(lines, version)
    if not match:
        return f"no {what} (cgroup v{version} host)"
    have = tuple(p for p in _parts(match[0].path) if p != "/")
    if not have:
        return f"it is in the root cgroup ({what} {match[0].path!r})"
    want = expected_cgroup(cgroups_path)
    if want and not _runs_in(have, want):
        return f"its cgroup {match[0].path!r} is not linux.cgroupsPath {cgroups_path!r}"
    return ""


def resolve(
    lines: tuple[CgroupLine, ...], mounts: tuple[Mount, ...], *, cgroup_source: str, mount_source: str
) -> CgroupTarget:
    """Pure core of ``find``: version from the mounts, path from the matching cgroup line."""
    version = cgroup_version(mounts)
    match, what = _device_lines(lines, version)
    if not match:
        raise InputError(cgroup_source, what, f"missing (cgroup v{version} host)")
    cg_path = _checked(match[0].path, cgroup_source, what)
    mount = _pick_mount(mounts, version, mount_source)
    root = _checked(mount.root, mount_source, f"{mount.mount_point} root")
    if cg_path[: len(root)] != root:  # PurePosixPath.relative_to: the root's parts, anchor included
        raise ApplyError(
            cgroup_source, what, f"cgroup {_text(cg_path)} is outside the mounted root {_text(root)}"
        )
    return CgroupTarget(version=version, path=_text(_parts(mount.mount_point) + cg_path[len(root) :]))


def read_text(path: str) -> str:
    """``Path(path).read_text(errors="surrogateescape")`` (UTF-8) with ``os`` alone; ``OSError`` as it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def _read(path: str) -> str:
    try:
        return read_text(path)
    except OSError as exc:
        raise InputError(path, "", exc.strerror or str(exc)) from exc


def path_text(path: str) -> str:
    """``str(PurePosixPath(path))`` without pathlib."""
    return _text(_parts(path))


def _in(proc: str | PathLike[str], *names: str) -> str:
    """``str(Path(proc, *names))``."""
    return path_text(os.path.join(os.fspath(proc), *names))


def _own_mounts(mi_file: str) -> tuple[Mount, ...]:
    """This process's mount table; a resident one keeps it until the kernel marks it changed
    (``hook.adapters.apply.ownmounts``)."""
    warm = sys.modules.get("hook.sources.warm")  # never loaded by a served start: then it is off

    if warm is not None and warm.enabled() and mi_file == "/proc/self/mountinfo":
        from hook.adapters.apply.ownmounts import kept

        try:
            return kept(mi_file, parse_mountinfo)
        except OSError as exc:
            raise InputError(mi_file, "", exc.strerror or str(exc)) from exc
    return parse_mountinfo(_read(mi_file), mi_file)


def find(pid: int, proc: str | PathLike[str] = "/proc") -> CgroupTarget:
    """The device cgroup of process ``pid``, seen through the hook's own mounts."""
    cg_file = _in(proc, str(pid), "cgroup")
    mi_file = _in(proc, "self", "mountinfo")
    lines = parse_proc_cgroup(_read(cg_file), cg_file)
    mounts = _own_mounts(mi_file)
    return resolve(lines, mounts, cgroup_source=cg_file, mount_source=mi_file)


def _namespace_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def find_container(
    pid: int, cgroups_path: str, *, source: str, proc: str | PathLike[str] = "/proc"
) -> CgroupTarget:
    """``find`` for the pid of a runtime's state, after checking that it is a container's.

    A pid in the hook's own mount namespace (a host process), in a root cgroup, or outside
    ``linux.cgroupsPath`` is refused with an ``InputError`` on ``source``'s ``pid`` field before
    anything is written: rules written there would reach the host, and ``<bundle>/rootfs/dev``
    would be edited on the host's disk.
    """
    try:
        theirs = _namespace_id(_in(proc, str(pid), "ns", "mnt"))
        ours = _namespace_id(_in(proc, "self", "ns", "mnt"))
    except OSError as exc:
        raise InputError(source, "pid", f"{pid}: {exc.filename}: {exc.strerror or exc}") from exc
    if theirs == ours:
        raise InputError(source, "pid", f"{pid} is not a container's: it shares the hook's mount namespace")
    cg_file = _in(proc, str(pid), "cgroup")
    mi_file = _in(proc, "self", "mountinfo")
    lines = parse_proc_cgroup(_read(cg_file), cg_file)
    mounts = _own_mounts(mi_file)
    problem = cgroup_problem(lines, cgroup_version(mounts), cgroups_path)
    if problem:
        raise InputError(source, "pid", f"{pid} is not a container's: {problem}")
    return resolve(lines, mounts, cgroup_source=cg_file, mount_source=mi_file)
