"""bpf(2) against the real kernel: load, attach, replace, query, dump; programs judged by real opens.

BPF_PROG_TEST_RUN does not run cgroup device programs, so a child process in a scratch cgroup2
opens and mknods device nodes and EPERM is the program's "no" (see conftest ``Prober``).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bpf import CASES

from hook.adapters.apply import bpf, bpf_sys
from hook.core.errors import ApplyError
from hook.core.rules import Access, DeviceType, Rule, evaluate

C, B = DeviceType.CHAR, DeviceType.BLOCK
MULTI = bpf_sys.BPF_F_ALLOW_MULTI


@pytest.fixture
def cgfd(scratch_cgroup: Path) -> Iterator[int]:
    fd = os.open(scratch_cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def _load(rules: list[Rule], default_allow: bool = False, fallthrough: bytes | None = None) -> int:
    return bpf_sys.load_device_program(bpf.build_program(rules, fallthrough, default_allow))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_golden_program_loads_attaches_and_dumps_back(case, cgfd: int, runc_program: bytes) -> None:
    prog = bpf.build_program(case.rules, runc_program if case.runc_fallthrough else None, case.default_allow)
    fd = bpf_sys.load_device_program(prog)
    try:
        bpf_sys.attach(cgfd, fd, MULTI)
        assert bpf_sys.query_device_programs(cgfd).ids == (bpf_sys.prog_id(fd),)
        assert bpf_sys.dump_xlated(fd) == prog, "no dead code in our programs: the dump is what we loaded"
        bpf_sys.detach(cgfd, fd)
        assert bpf_sys.query_device_programs(cgfd).ids == ()
    finally:
        os.close(fd)


def test_failed_load_carries_the_verifier_log() -> None:
    no_exit = bpf.Insn(bpf.MOV32_K, dst=0, imm=1).encode()
    with pytest.raises(ApplyError) as err:
        bpf_sys.load_device_program(no_exit)
    assert err.value.field == "BPF_PROG_LOAD"
    assert "EINVAL" in err.value.reason and "exit" in err.value.reason


def test_uninitialised_r0_is_refused_by_the_kernel() -> None:
    """Why the builder always sets R0: libnvidia-container's bare ``exit`` is rejected."""
    with pytest.raises(ApplyError, match="R0 !read_ok"):
        bpf_sys.load_device_program(bpf.Insn(bpf.EXIT).encode())


def test_query_grows_its_buffer_on_enospc(cgfd: int) -> None:
    fds = [_load([], default_allow=True) for _ in range(20)]  # more than the first 16-slot buffer
    try:
        for fd in fds:
            bpf_sys.attach(cgfd, fd, MULTI)
        assert bpf_sys.query_device_programs(cgfd).ids == tuple(bpf_sys.prog_id(fd) for fd in fds)
    finally:
        for fd in fds:
            bpf_sys.detach(cgfd, fd)
        bpf_sys.close_all(fds)


def test_replace_swaps_in_place(cgfd: int) -> None:
    old, new = _load([], default_allow=True), _load([], default_allow=False)
    try:
        bpf_sys.attach(cgfd, old, MULTI)
        bpf_sys.attach(cgfd, new, MULTI, replace_fd=old)
        assert bpf_sys.query_device_programs(cgfd) == bpf_sys.Attached(MULTI, (bpf_sys.prog_id(new),))
        with pytest.raises(ApplyError, match="BPF_PROG_ATTACH"):
            bpf_sys.attach(cgfd, new, MULTI, replace_fd=old)  # old is no longer attached
    finally:
        bpf_sys.close_all([old, new])


def test_get_fd_by_id_round_trips() -> None:
    fd = _load([])
    try:
        other = bpf_sys.get_fd_by_id(bpf_sys.prog_id(fd))
        assert bpf_sys.prog_id(other) == bpf_sys.prog_id(fd)
        os.close(other)
    finally:
        os.close(fd)
    with pytest.raises(ApplyError, match="ENOENT"):
        bpf_sys.get_fd_by_id(0x7FFFFFF0)


@pytest.mark.parametrize("how", ["pointer withheld", "zeroed"])
def test_withheld_dump_is_an_error_not_a_wrong_program(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = bpf_sys._info

    def fake(fd: int, info: bpf_sys._ProgInfo) -> None:
        real(fd, info)
        if info.xlated_prog_insns:
            if how == "pointer withheld":
                info.xlated_prog_insns = 0
            else:
                ctypes.memset(info.xlated_prog_insns, 0, info.xlated_prog_len)

    monkeypatch.setattr(bpf_sys, "_info", fake)
    fd = _load([])
    try:
        with pytest.raises(ApplyError, match="withheld or zeroed"):
            bpf_sys.dump_xlated(fd)
    finally:
        os.close(fd)


# ---- the kernel runs our programs the way ``evaluate`` reads the rules ----

KINDS = {"r": Access.R, "w": Access.W, "rw": Access.R | Access.W, "m": Access.M}
PROBES = [(t, ma, mi, k) for t in (C, B) for ma in (195, 240) for mi in (0, 1) for k in KINDS]
rule_st = st.builds(
    Rule,
    allow=st.booleans(),
    type=st.sampled_from(list(DeviceType)),
    major=st.none() | st.sampled_from([195, 240]),
    minor=st.none() | st.sampled_from([0, 1]),
    access=st.sampled_from([Access.R, Access.W, Access.M, Access.R | Access.W, Access.RWM]),
)


def test_prober_sees_enxio_without_a_program(prober, scratch_cgroup: Path) -> None:
    """Guards the oracle: with nothing attached every probe passes the cgroup and hits "no driver"."""
    results = prober.run(scratch_cgroup, PROBES)
    assert all(r in ("ENXIO", "ok") for r in results), results


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rules=st.lists(rule_st, max_size=6), default_allow=st.booleans())
def test_kernel_agrees_with_evaluate(
    rules: list[Rule], default_allow: bool, prober, scratch_cgroup: Path
) -> None:
    fd = _load(rules, default_allow)
    cg = os.open(scratch_cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        bpf_sys.attach(cg, fd, MULTI)
        got = prober.allowed(scratch_cgroup, PROBES)
        bpf_sys.detach(cg, fd)
    finally:
        os.close(cg)
        os.close(fd)
    want = [evaluate(rules, t, ma, mi, KINDS[k], default_allow) for t, ma, mi, k in PROBES]
    assert got == want, [p for p, g, w in zip(PROBES, got, want, strict=True) if g != w]


@settings(max_examples=200, deadline=None)
@given(rules=st.lists(rule_st, max_size=10), default_allow=st.booleans(), wrap=st.booleans())
def test_every_built_program_passes_the_verifier(
    rules: list[Rule], default_allow: bool, wrap: bool, runc_program: bytes
) -> None:
    """The verifier rejects unreachable code and unset R0; no rule list may produce either."""
    os.close(_load(rules, default_allow, runc_program if wrap else None))


def test_bpf_syscall_numbers_are_the_kernels() -> None:
    """``__NR_bpf`` per architecture (the kernel's syscall tables: arch/x86/entry/syscalls/syscall_64.tbl,
    include/uapi/asm-generic/unistd.h for arm64 and riscv, arch/powerpc/.../syscall.tbl,
    arch/s390/kernel/syscalls/syscall.tbl): only this machine's is exercised by the other tests."""
    nr_bpf = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
    assert dict(bpf_sys._SYSCALL_NR) == nr_bpf
