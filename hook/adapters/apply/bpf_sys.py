"""Raw bpf(2) through ctypes: load, attach, replace, detach, query and dump cgroup device programs.

Rule: this is the only module that loads the ctypes package (the node helper's two calls go
through ``_ctypes`` alone: ``hook.adapters.apply.libcalls``), and it decides nothing; every failure becomes an
``ApplyError`` naming the bpf command and the errno (plus the verifier log for a failed load).
Every fd it returns is O_CLOEXEC (the kernel sets it for bpf fds) and owned by the caller.
"""

from __future__ import annotations

import ctypes
import errno
import os

from hook.core.errors import ApplyError
from hook.core.record import record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "BPF_F_ALLOW_MULTI",
    "BPF_F_ALLOW_OVERRIDE",
    "BPF_F_REPLACE",
    "Attached",
    "attach",
    "close_all",
    "detach",
    "dump_xlated",
    "get_fd_by_id",
    "load_device_program",
    "prog_id",
    "query_device_programs",
]

_SYSCALL_NR = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_DETACH = 5, 8, 9
BPF_PROG_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD, BPF_PROG_QUERY = 13, 15, 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_OVERRIDE, BPF_F_ALLOW_MULTI, BPF_F_REPLACE = 1, 2, 4
LICENSE = b"Apache-2.0"  # device programs call no GPL-only helper
PROG_NAME = b"oci_device_hook"  # 15 chars + NUL: what bpftool shows
LOG_SIZE = 1 << 20


class _LoadAttr(ctypes.Structure):
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


class _AttachAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("replace_bpf_fd", ctypes.c_uint32),
    ]


class _QueryAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
    ]


class _GetIdAttr(ctypes.Structure):
    _fields_ = [("prog_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class _ProgInfo(ctypes.Structure):
    """The head of ``struct bpf_prog_info``; the kernel copies only ``info_len`` bytes."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    """One bpf(2) call; returns the result or raises OSError with the errno."""
    nr = _SYSCALL_NR.get(os.uname().machine)
    if nr is None:
        raise ApplyError("bpf(2)", "", f"unsupported architecture {os.uname().machine}")
    ret = _libc.syscall(
        ctypes.c_long(nr), ctypes.c_long(cmd), ctypes.byref(attr), ctypes.c_long(ctypes.sizeof(attr))
    )
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def _fail(what: str, exc: OSError, detail: str = "") -> ApplyError:
    reason = f"{errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc.strerror})"
    return ApplyError("bpf(2)", what, f"{reason}{': ' + detail if detail else ''}")


def _load(prog: bytes, log: ctypes.Array[ctypes.c_char] | None) -> int:
    insns = ctypes.create_string_buffer(prog, len(prog))
    license_buf = ctypes.create_string_buffer(LICENSE)
    attr = _LoadAttr(
        prog_type=BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt=len(prog) // 8,
        insns=ctypes.addressof(insns),
        license=ctypes.addressof(license_buf),
        prog_name=PROG_NAME,
        expected_attach_type=BPF_CGROUP_DEVICE,
    )
    if log is not None:
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
    return _bpf(BPF_PROG_LOAD, attr)


def load_device_program(prog: bytes) -> int:
    """BPF_PROG_LOAD as a cgroup device program; on failure re-run with the verifier log and raise it."""
    try:
        return _load(prog, None)
    except OSError as exc:
        first = exc
    log = ctypes.create_string_buffer(LOG_SIZE)
    try:
        fd = _load(prog, log)  # a load that only failed the first time: take it
    except OSError as exc:
        text = log.value.decode(errors="replace").strip().splitlines()
        raise _fail("BPF_PROG_LOAD", exc, " | ".join(text[-6:])) from exc
    os.close(fd)
    raise _fail("BPF_PROG_LOAD", first, "failed once, loaded with the verifier log on; refusing a flaky load")


def _attach_cmd(cmd: int, target_fd: int, prog_fd: int, flags: int, replace_fd: int) -> None:
    attr = _AttachAttr(
        target_fd=target_fd,
        attach_bpf_fd=prog_fd,
        attach_type=BPF_CGROUP_DEVICE,
        attach_flags=flags,
        replace_bpf_fd=replace_fd,
    )
    _bpf(cmd, attr)


def attach(cgroup_fd: int, prog_fd: int, flags: int, replace_fd: int | None = None) -> None:
    """BPF_PROG_ATTACH to the cgroup dir fd; with ``replace_fd`` the swap is atomic (BPF_F_REPLACE)."""
    if replace_fd is not None:
        flags |= BPF_F_REPLACE
    try:
        _attach_cmd(BPF_PROG_ATTACH, cgroup_fd, prog_fd, flags, replace_fd or 0)
    except OSError as exc:
        raise _fail("BPF_PROG_ATTACH", exc, f"flags {flags:#x}") from exc


def detach(cgroup_fd: int, prog_fd: int) -> None:
    """BPF_PROG_DETACH of one program (the fd names it, as BPF_F_ALLOW_MULTI requires)."""
    try:
        _attach_cmd(BPF_PROG_DETACH, cgroup_fd, prog_fd, 0, 0)
    except OSError as exc:
        raise _fail("BPF_PROG_DETACH", exc) from exc


@record(kw_only=False)
class Attached:
    """What BPF_PROG_QUERY says is attached directly to one cgroup, in run order."""

    flags: int
    ids: tuple[int, ...]


def query_device_programs(cgroup_fd: int, tries: int = 8) -> Attached:
    """BPF_PROG_QUERY for BPF_CGROUP_DEVICE; grows the id buffer while the kernel says ENOSPC."""
    count = 16
    for _ in range(tries):
        ids = (ctypes.c_uint32 * count)()
        attr = _QueryAttr(
            target_fd=cgroup_fd, attach_type=BPF_CGROUP_DEVICE, prog_ids=ctypes.addressof(ids), prog_cnt=count
        )
        try:
            _bpf(BPF_PROG_QUERY, attr)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                count = max(count * 2, attr.prog_cnt)
                continue
            raise _fail("BPF_PROG_QUERY", exc) from exc
        return Attached(attr.attach_flags, tuple(ids[: attr.prog_cnt]))
    raise ApplyError("bpf(2)", "BPF_PROG_QUERY", f"still ENOSPC after {tries} tries")


def get_fd_by_id(prog_id_: int) -> int:
    """BPF_PROG_GET_FD_BY_ID: an fd that keeps the program alive while we hold it."""
    try:
        return _bpf(BPF_PROG_GET_FD_BY_ID, _GetIdAttr(prog_id=prog_id_))
    except OSError as exc:
        raise _fail("BPF_PROG_GET_FD_BY_ID", exc, f"id {prog_id_}") from exc


def _info(prog_fd: int, info: _ProgInfo) -> None:
    attr = _InfoAttr(bpf_fd=prog_fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    try:
        _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    except OSError as exc:
        raise _fail("BPF_OBJ_GET_INFO_BY_FD", exc) from exc


def prog_id(prog_fd: int) -> int:
    """The kernel id of a loaded program."""
    info = _ProgInfo()
    _info(prog_fd, info)
    return int(info.id)


def dump_xlated(prog_fd: int) -> bytes:
    """The program's translated instructions, or ApplyError if the kernel hides or zeroes them.

    Hidden: no CAP_BPF/CAP_SYS_ADMIN, or ``bpf_dump_raw_ok`` false (kptr_restrict) sets the
    pointer to 0; JIT constant blinding can yield zeroes. Either would make a wrong filter.
    """
    info = _ProgInfo()
    _info(prog_fd, info)
    size = int(info.xlated_prog_len)
    if size == 0 or size % 8:
        raise ApplyError(
            "bpf(2)", "xlated_prog_insns", f"kernel reports {size} bytes; cannot dump the program"
        )
    buf = ctypes.create_string_buffer(size)
    info = _ProgInfo(xlated_prog_len=size, xlated_prog_insns=ctypes.addressof(buf))
    _info(prog_fd, info)
    data = buf.raw
    if info.xlated_prog_insns == 0 or int(info.xlated_prog_len) != size or not any(data):
        raise ApplyError(
            "bpf(2)",
            "xlated_prog_insns",
            "the kernel withheld or zeroed the program dump (bpf_jit_harden, kptr_restrict or no CAP_BPF)",
        )
    return data


def close_all(fds: Sequence[int]) -> None:
    """Close fds we own, ignoring ones already closed."""
    for fd in fds:
        try:  # noqa: SIM105 - contextlib would be one more import at start
            os.close(fd)
        except OSError:
            pass
