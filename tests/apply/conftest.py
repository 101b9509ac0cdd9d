"""Fixtures for the device-filter tests: a scratch cgroup2, a prober child, a tiny eBPF interpreter.

The prober is the only way to run a cgroup device program (BPF_PROG_TEST_RUN does not support
the type): a child joins the scratch cgroup, then opens or mknods device nodes; EPERM means
the program said no, anything else (ENXIO: no driver) means it said yes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import stat
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from hook.adapters.apply import bpf, bpf_sys
from hook.core.rules import Access, DeviceType


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False, help="rewrite tests/golden files")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """``--update-golden`` (only registered when this conftest is an initial one) or ODH_UPDATE_GOLDEN=1."""
    try:
        flag = bool(request.config.getoption("--update-golden"))
    except ValueError:
        flag = False
    return flag or os.environ.get("ODH_UPDATE_GOLDEN") == "1"


# ---- a reference interpreter for the instructions the builder (and runc) emit ----

_MASK64 = (1 << 64) - 1


def _alu(code: int, a: int, b: int) -> int:
    ops = {
        0x00: a + b,
        0x10: a - b,
        0x40: a | b,
        0x50: a & b,
        0x60: a << (b & 63),
        0x70: a >> (b & 63),
        0xA0: a ^ b,
        0xB0: b,
    }
    return ops[code]


def _jump(code: int, a: int, b: int) -> bool:
    conds = {
        0x10: a == b,
        0x20: a > b,
        0x30: a >= b,
        0x40: bool(a & b),
        0x50: a != b,
        0xA0: a < b,
        0xB0: a <= b,
    }
    return conds[code]


def run_program(prog: bytes, type: DeviceType, major: int, minor: int, access: Access) -> int:
    """Execute a device program on one ctx in Python; stands in for the kernel in property tests."""
    ctx = struct.pack(
        "<III", (access.value << 16) | {DeviceType.BLOCK: 1, DeviceType.CHAR: 2}[type], major, minor
    )
    regs = [0] * 11
    insns = bpf.decode(prog)
    pc = 0
    for _ in range(100_000):
        insn = insns[pc]
        cls, code, use_x = insn.op & 7, insn.op & 0xF0, insn.op & 8
        rhs = regs[insn.src] if use_x else insn.imm & _MASK64
        if insn.op == bpf.EXIT:
            return regs[0]
        if insn.op == bpf.LDX_W:
            assert insn.src == 1, "only ctx loads are interpreted"
            regs[insn.dst] = struct.unpack_from("<I", ctx, insn.off)[0]
        elif cls in (0x04, 0x07):
            width = 0xFFFFFFFF if cls == 0x04 else _MASK64
            regs[insn.dst] = _alu(code, regs[insn.dst] & width, rhs & width) & width
        elif insn.op == bpf.JA:
            pc += insn.off
        elif cls == 0x05:
            pc += insn.off if _jump(code, regs[insn.dst], rhs) else 0
        else:
            raise AssertionError(f"instruction {insn} not interpreted")
        pc += 1
    raise AssertionError("program did not terminate")


# ---- a runc-shaped "runtime" program: R1 reused as temp, exact-cover access check ----


def runc_like_program() -> bytes:
    """deny all; allow c *:* m; allow c 1:3 rwm; allow c 195:0 rw — in runc's layout and order."""
    i = bpf.Insn
    prog = [
        i(bpf.LDX_W, 2, 1, 0),
        i(bpf.AND32_K, 2, imm=0xFFFF),
        i(bpf.LDX_W, 3, 1, 0),
        i(bpf.RSH32_K, 3, imm=16),
        i(bpf.LDX_W, 4, 1, 4),
        i(bpf.LDX_W, 5, 1, 8),
        # block-0: c 195:0 rw
        i(bpf.JNE_K, 2, off=7, imm=2),
        i(bpf.MOV32_X, 1, 3),
        i(bpf.AND32_K, 1, imm=6),
        i(0x5D, 1, 3, off=4),
        i(bpf.JNE_K, 4, off=3, imm=195),
        i(bpf.JNE_K, 5, off=2, imm=0),
        i(bpf.MOV32_K, 0, imm=1),
        i(bpf.EXIT),
        # block-1: c 1:3 rwm
        i(bpf.JNE_K, 2, off=4, imm=2),
        i(bpf.JNE_K, 4, off=3, imm=1),
        i(bpf.JNE_K, 5, off=2, imm=3),
        i(bpf.MOV32_K, 0, imm=1),
        i(bpf.EXIT),
        # block-2: c *:* m
        i(bpf.JNE_K, 2, off=5, imm=2),
        i(bpf.MOV32_X, 1, 3),
        i(bpf.AND32_K, 1, imm=1),
        i(0x5D, 1, 3, off=2),
        i(bpf.MOV32_K, 0, imm=1),
        i(bpf.EXIT),
        # block-3: default deny
        i(bpf.MOV32_K, 0, imm=0),
        i(bpf.EXIT),
    ]
    return b"".join(x.encode() for x in prog)


@pytest.fixture(scope="session")
def bpf_run() -> Callable[[bytes, DeviceType, int, int, Access], int]:
    """``run_program``, as a fixture so test modules need not import this conftest by name."""
    return run_program


@pytest.fixture(scope="session")
def runc_program() -> bytes:
    return runc_like_program()


# ---- real cgroup2 + prober child ----


@pytest.fixture(scope="session")
def cgroup2_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cgroup2 mount in a temp dir (the same v2 hierarchy as any other mount of it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts cgroup2, loads and attaches BPF programs")
    mnt = tmp_path_factory.mktemp("cgroup2")
    subprocess.run(["mount", "-t", "cgroup2", "none", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def detach_all(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for prog_id in bpf_sys.query_device_programs(fd).ids:
            prog_fd = bpf_sys.get_fd_by_id(prog_id)
            with contextlib.suppress(Exception):
                bpf_sys.detach(fd, prog_fd)
            os.close(prog_fd)
    finally:
        os.close(fd)


@pytest.fixture
def scratch_cgroup(cgroup2_root: Path) -> Iterator[Path]:
    path = cgroup2_root / f"odh-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        detach_all(path)
        path.rmdir()


_CHILD = r"""
import json, os, sys
cg, ops = sys.argv[1], json.loads(sys.argv[2])
with open(os.path.join(cg, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}
out = []
for kind, path, mode, dev in ops:
    try:
        if kind == "m":
            os.mknod(path, mode, dev)
            os.unlink(path)
        else:
            os.close(os.open(path, flags[kind] | os.O_NONBLOCK | os.O_NOCTTY))
        out.append("ok")
    except OSError as e:
        out.append(__import__("errno").errorcode[e.errno])
print(json.dumps(out))
"""

PROBE_ACCESS = {"r": Access.R, "w": Access.W, "rw": Access.R | Access.W, "m": Access.M}


class Prober:
    """Makes device nodes once, then asks a child in a cgroup which accesses the kernel allows."""

    def __init__(self, nodes_dir: Path) -> None:
        self.dir = nodes_dir
        self._count = itertools.count()

    def node(self, type: DeviceType, major: int, minor: int) -> Path:
        path = self.dir / f"{type}-{major}-{minor}"
        if not path.exists():
            kind = stat.S_IFCHR if type is DeviceType.CHAR else stat.S_IFBLK
            os.mknod(path, kind | 0o666, os.makedev(major, minor))
        return path

    def run(self, cgroup: Path, probes: Sequence[tuple[DeviceType, int, int, str]]) -> list[str]:
        """errno names (or "ok") for each (type, major, minor, "r"|"w"|"rw"|"m") probe."""
        ops = []
        for type, major, minor, kind in probes:
            kind_bits = stat.S_IFCHR if type is DeviceType.CHAR else stat.S_IFBLK
            path = self.node(type, major, minor) if kind != "m" else self.dir / f"mk-{next(self._count)}"
            ops.append((kind, str(path), kind_bits | 0o600, os.makedev(major, minor)))
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD, str(cgroup), json.dumps(ops)],
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(done.stdout)

    def allowed(self, cgroup: Path, probes: Sequence[tuple[DeviceType, int, int, str]]) -> list[bool]:
        results = self.run(cgroup, probes)
        unexpected = set(results) - {"ok", "EPERM", "ENXIO"}
        assert not unexpected, f"probe errors other than EPERM/ENXIO: {unexpected} (nodev mount?)"
        return [r != "EPERM" for r in results]


@pytest.fixture
def prober(tmp_path: Path, cgroup2_root: Path) -> Prober:
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    return Prober(nodes)
