"""CgroupV2 on a real scratch cgroup2: a runc-shaped program attached, our rules applied, rolled back.

Nodes are fake (no driver): ENXIO means the device filter let the open through, EPERM that it did not.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hook.adapters.apply import bpf, bpf_sys
from hook.adapters.apply.cgroup_v2 import CgroupV2
from hook.core.errors import ApplyError
from hook.core.rules import Access, DeviceType, Rule

C = DeviceType.CHAR
RW = Access.R | Access.W
MULTI = bpf_sys.BPF_F_ALLOW_MULTI
OURS = [
    Rule(allow=True, type=C, major=195, minor=1, access=RW),
    Rule(allow=False, type=C, major=195, minor=0),
]
PROBES = [
    (C, 195, 0, "rw"),
    (C, 195, 0, "r"),
    (C, 195, 1, "rw"),
    (C, 195, 2, "r"),
    (C, 1, 3, "rw"),
    (C, 7, 7, "m"),
]
RUNTIME_ONLY = [True, True, False, False, True, True]  # runc_program: c 195:0 rw, c 1:3 rwm, c *:* m
WITH_OURS = [False, False, True, False, True, True]


def _ids(path: Path) -> tuple[int, ...]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bpf_sys.query_device_programs(fd).ids
    finally:
        os.close(fd)


def _attach(path: Path, prog: bytes, flags: int = MULTI) -> int:
    """Attach like a runtime would; returns the program id (the cgroup keeps the program alive)."""
    fd, cg = bpf_sys.load_device_program(prog), os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        bpf_sys.attach(cg, fd, flags)
        return bpf_sys.prog_id(fd)
    finally:
        os.close(cg)
        os.close(fd)


@pytest.fixture
def runtime_cgroup(scratch_cgroup: Path, runc_program: bytes) -> Iterator[tuple[Path, int]]:
    yield scratch_cgroup, _attach(scratch_cgroup, runc_program)


def test_apply_changes_access_and_rollback_restores_it(runtime_cgroup, prober) -> None:
    path, runtime_id = runtime_cgroup
    assert prober.allowed(path, PROBES) == RUNTIME_ONLY
    cg = CgroupV2(path)
    applied = cg.apply(OURS)
    assert applied.changed and applied.old_ids == (runtime_id,)
    assert _ids(path) == applied.new_ids and len(applied.new_ids) == 1 and applied.new_ids != (runtime_id,)
    assert prober.allowed(path, PROBES) == WITH_OURS
    cg.rollback()
    assert _ids(path) == (runtime_id,)
    assert prober.allowed(path, PROBES) == RUNTIME_ONLY


def test_apply_twice_is_a_no_op(runtime_cgroup, prober) -> None:
    path, _ = runtime_cgroup
    first = CgroupV2(path).apply(OURS)
    second_cg = CgroupV2(path)
    second = second_cg.apply([OURS[0], *OURS])  # normalizes to the same rules
    second_cg.close()
    assert not second.changed and second.new_ids == first.new_ids == _ids(path)
    assert prober.allowed(path, PROBES) == WITH_OURS


def test_different_rules_layer_on_top(runtime_cgroup, prober) -> None:
    """A second apply with other rules means "append these rules": they win, earlier ones still hold."""
    path, _ = runtime_cgroup
    CgroupV2(path).apply(OURS)
    second = CgroupV2(path).apply([Rule(allow=False, type=C, major=1, minor=3)])
    assert second.changed and len(_ids(path)) == 1
    assert prober.allowed(path, PROBES) == [False, False, True, False, False, True]


def test_no_program_attached_means_allow_all_narrowed_by_our_denies(scratch_cgroup: Path, prober) -> None:
    cg = CgroupV2(scratch_cgroup)
    applied = cg.apply([Rule(allow=False, type=C, major=195, minor=0)])
    assert applied.old_ids == () and len(_ids(scratch_cgroup)) == 1
    assert prober.allowed(scratch_cgroup, PROBES) == [False, False, True, True, True, True]
    cg.rollback()
    assert _ids(scratch_cgroup) == ()


def test_every_attached_program_is_wrapped(runtime_cgroup, prober, runc_program: bytes) -> None:
    """With ALLOW_MULTI all programs must agree, so an allow of ours has to reach each of them."""
    path, runtime_id = runtime_cgroup
    second_id = _attach(path, runc_program)
    cg = CgroupV2(path)
    applied = cg.apply(OURS)
    assert applied.old_ids == (runtime_id, second_id) and len(applied.new_ids) == 2
    assert not set(applied.new_ids) & {runtime_id, second_id}
    assert prober.allowed(path, PROBES) == WITH_OURS
    cg.rollback()
    assert _ids(path) == (runtime_id, second_id)


def test_exclusive_attachment_is_replaced(scratch_cgroup: Path, runc_program: bytes, prober) -> None:
    runtime_id = _attach(scratch_cgroup, runc_program, flags=0)
    cg = CgroupV2(scratch_cgroup)
    cg.apply(OURS)
    assert prober.allowed(scratch_cgroup, PROBES) == WITH_OURS
    cg.rollback()
    assert _ids(scratch_cgroup) == (runtime_id,)


def test_without_bpf_f_replace_attach_then_detach(
    runtime_cgroup, prober, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, runtime_id = runtime_cgroup
    real, calls = bpf_sys.attach, []

    def old_kernel(cg: int, prog: int, flags: int, replace_fd: int | None = None) -> None:
        calls.append(replace_fd)
        if replace_fd is not None:
            raise ApplyError("bpf(2)", "BPF_PROG_ATTACH", "EINVAL") from OSError(
                errno.EINVAL, "Invalid argument"
            )
        real(cg, prog, flags)

    monkeypatch.setattr(bpf_sys, "attach", old_kernel)
    cg = CgroupV2(path)
    cg.apply(OURS)
    assert calls[0] is not None and None in calls
    assert prober.allowed(path, PROBES) == WITH_OURS
    cg.rollback()
    assert _ids(path) == (runtime_id,)


def test_failed_verification_rolls_back(runtime_cgroup, monkeypatch: pytest.MonkeyPatch) -> None:
    path, runtime_id = runtime_cgroup
    real, seen = bpf_sys.query_device_programs, []

    def lying(fd: int, tries: int = 8) -> bpf_sys.Attached:
        seen.append(1)
        got = real(fd, tries)
        return got if len(seen) == 1 else bpf_sys.Attached(got.flags, (*got.ids, 999_999))

    monkeypatch.setattr(bpf_sys, "query_device_programs", lying)
    with pytest.raises(ApplyError, match="attached ids"):
        CgroupV2(path).apply(OURS)
    monkeypatch.undo()
    assert _ids(path) == (runtime_id,)


def test_unreloadable_original_is_refused_before_anything_changes(scratch_cgroup: Path) -> None:
    """A runtime program with a helper call cannot be re-loaded from its dump: refuse, attach nothing new."""
    call = bpf.Insn(bpf.CALL, imm=14).encode()  # bpf_get_current_pid_tgid
    prog = call + bpf.Insn(bpf.MOV32_K, dst=0, imm=1).encode() + bpf.Insn(bpf.EXIT).encode()
    runtime_id = _attach(scratch_cgroup, prog)
    with pytest.raises(ApplyError, match="calls or maps"):
        CgroupV2(scratch_cgroup).apply(OURS)
    assert _ids(scratch_cgroup) == (runtime_id,)


def test_missing_cgroup_is_an_apply_error(tmp_path: Path) -> None:
    with pytest.raises(ApplyError) as err:
        CgroupV2(tmp_path / "gone").apply(OURS)
    assert err.value.file == str(tmp_path / "gone")


def test_a_file_where_the_cgroup_should_be_is_refused(tmp_path: Path) -> None:
    """The cgroup is opened as a directory: a plain file (a wrong or raced path) fails right there."""
    path = tmp_path / "not-a-cgroup"
    path.write_text("")
    with pytest.raises(ApplyError, match="Not a directory") as err:
        CgroupV2(path).apply(OURS)
    assert err.value.file == str(path)


def test_close_releases_every_descriptor_and_may_repeat(scratch_cgroup: Path) -> None:
    """The hook holds the cgroup and program fds only while it works; close() gives back all."""
    before = sorted(os.listdir("/proc/self/fd"))
    cg = CgroupV2(scratch_cgroup)
    cg.apply(OURS)
    assert len(os.listdir("/proc/self/fd")) > len(before)
    cg.close()
    cg.close()
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_second_close_leaves_reused_descriptor_numbers_alone(scratch_cgroup: Path) -> None:
    """After close() the numbers are free and the process reuses them: close() again must not
    close what now lives there."""
    cg = CgroupV2(scratch_cgroup)
    cg.apply(OURS)
    cg.close()
    fds = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(16)]
    try:
        cg.close()
        for fd in fds:
            os.fstat(fd)
    finally:
        for fd in fds:
            os.close(fd)


def test_no_rules_change_nothing(runtime_cgroup) -> None:
    """Issue 24 (fresh mutant s530669-124): with no rules nothing is attached and ``changed`` is
    False (the transaction then has nothing of ours to undo or report)."""
    path, runtime_id = runtime_cgroup
    cg = CgroupV2(path)
    applied = cg.apply([])
    cg.close()
    assert not applied.changed and applied.old_ids == applied.new_ids == (runtime_id,)
    assert _ids(path) == (runtime_id,)


def test_a_failed_rollback_is_raised_and_noted_on_the_apply_error(
    runtime_cgroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 (fresh mutants s530669-127, -129): when putting the original program back fails,
    ``rollback`` raises it, and a failed apply carries it as a note (the log line says both)."""
    path, _ = runtime_cgroup
    real_query, real_attach, seen = bpf_sys.query_device_programs, bpf_sys.attach, []

    def lying(fd: int, tries: int = 8) -> bpf_sys.Attached:
        seen.append(1)
        got = real_query(fd, tries)
        return got if len(seen) == 1 else bpf_sys.Attached(got.flags, (*got.ids, 999_999))

    calls: list[int] = []

    def attach_once(*args: object, **kw: object) -> None:
        calls.append(1)
        if len(calls) > 1:  # the swap back during rollback
            raise ApplyError(str(path), "BPF_PROG_ATTACH", "refused by the test")
        real_attach(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(bpf_sys, "query_device_programs", lying)
    monkeypatch.setattr(bpf_sys, "attach", attach_once)
    with pytest.raises(ApplyError, match="attached ids") as info:
        CgroupV2(path).apply(OURS)
    monkeypatch.undo()
    notes = getattr(info.value, "__notes__", [])
    assert any(n.startswith("rollback failed too:") and "refused by the test" in n for n in notes), notes
