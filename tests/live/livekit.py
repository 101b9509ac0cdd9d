"""Real-container test kit: a busybox-static rootfs, an OCI bundle, and a runc runner.

Rule: every live test runs a real ``runc run`` with its own state root, a unique container id
and cgroupsPath, and always ``runc delete -f`` afterwards. What the container sees is read back
from its stdout with the ``probe_*`` pair, which tells EPERM (cgroup said no), ENXIO (allowed, no
driver behind the fake node) and ENOENT (no node) apart by busybox ``cat``'s error text.
Host safety: runc (and so every hook it runs) always starts inside ``unshare -m`` with a private
tmpfs over ``/dev`` (only the basic nodes), ``/run`` (the hook's default cache dir) and
``/var/log`` (its default log), so a hook that regressed into writing outside the container
writes into that throwaway namespace, never into the host's ``/dev``, cache or log. The v2
runner also mounts cgroup2 at /sys/fs/cgroup there, so runc (and any hook it runs) sees a
unified host and uses eBPF even on a hybrid machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUSYBOX = Path("/usr/bin/busybox")
RUNC = shutil.which("runc") or "/usr/sbin/runc"
REPO = Path(__file__).resolve().parents[2]
APPLETS = ("sh", "cat", "ls", "echo", "head", "stat", "test", "mknod", "id", "sleep", "true", "false")
HOOK_ENV = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]

# busybox cat: "cat: can't open '/dev/x': <strerror>"
_ERRNO_TEXT = {
    "Operation not permitted": "EPERM",
    "No such device or address": "ENXIO",
    "No such file or directory": "ENOENT",
    "Permission denied": "EACCES",
}


def build_rootfs(dest: Path) -> Path:
    """A minimal rootfs: static busybox plus applet symlinks and the usual empty dirs."""
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    for d in ("dev", "proc", "sys", "tmp", "etc"):
        (dest / d).mkdir(exist_ok=True)
    shutil.copy2(BUSYBOX, dest / "bin" / "busybox")
    for applet in APPLETS:
        link = dest / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    return dest


def hook(
    path: str | Path, args: list[str] | None = None, env: list[str] | None = None, timeout: int = 30
) -> dict[str, Any]:
    """One OCI hook entry (explicit env: a hook must never inherit the runtime's)."""
    return {"path": str(path), "args": args or [str(path)], "env": env or HOOK_ENV, "timeout": timeout}


def python_hook(dest: Path, body: str) -> Path:
    """An executable ``python3 -I`` script with the repo importable; ``state`` holds stdin's JSON.

    ``body`` runs inside ``main()``; an exception prints to stderr and exits 1, which makes
    runc abort the container like a failing real hook.
    """
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    dest.write_text(
        f"#!{sys.executable} -I\nimport json, sys\nsys.path.insert(0, {str(REPO)!r})\n\n"
        f"def main():\n    state = json.load(sys.stdin)\n{indented}\n\n"
        "try:\n    main()\nexcept Exception as exc:\n"
        "    print(f'hook failed: {exc}', file=sys.stderr)\n    sys.exit(1)\n"
    )
    dest.chmod(0o755)
    return dest


def char_device(path: str, major: int, minor: int, mode: int = 0o666) -> dict[str, Any]:
    """A ``linux.devices`` entry: runc mknods it in the container's /dev."""
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": mode, "uid": 0, "gid": 0}


def _default_mounts() -> list[dict[str, Any]]:
    nosuid = ["nosuid", "noexec", "nodev"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": [*nosuid, "mode=1777"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": [*nosuid, "ro"]},
    ]


@dataclass
class Bundle:
    path: Path
    id: str
    cgroups_path: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    def write(self) -> Bundle:
        (self.path / "config.json").write_text(json.dumps(self.config, indent=2))
        return self


def build_bundle(
    dest: Path,
    args: list[str],
    *,
    hooks: dict[str, list[dict[str, Any]]] | None = None,
    devices: list[dict[str, Any]] | None = None,
    cgroup_devices: list[dict[str, Any]] | None = None,
    env: list[str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Bundle:
    """A bundle in ``runc spec`` style: busybox rootfs, no terminal, unique id and cgroupsPath.

    ``cgroup_devices`` is ``linux.resources.devices`` (default: deny all, so only runc's
    built-in allow list applies; pass ``[{"allow": True, "access": "rwm"}]`` for privileged-like).
    ``hooks`` maps stage → hook entries (see ``hook``). Edit ``bundle.config`` then ``write()``
    for anything else.
    """
    build_rootfs(dest / "rootfs")
    cid = f"odh-{uuid.uuid4().hex[:10]}"
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "cwd": "/",
            "env": env or ["PATH=/bin", "HOME=/"],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": cid,
        "mounts": _default_mounts(),
        "hooks": hooks or {},
        "annotations": annotations or {},
        "linux": {
            "cgroupsPath": f"/odh-live/{cid}",
            "devices": devices or [],
            "resources": {"devices": cgroup_devices or [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
        },
    }
    return Bundle(path=dest, id=cid, cgroups_path=config["linux"]["cgroupsPath"], config=config).write()


@dataclass(frozen=True)
class RunResult:
    rc: int
    stdout: str
    stderr: str


def runc_command(bundle: Bundle, state_root: Path) -> list[str]:
    return [RUNC, "--root", str(state_root), "run", "--bundle", str(bundle.path), bundle.id]


# The basic nodes, ptys and fd links an engine expects in /dev, on a fresh tmpfs /dev of a private
# mount namespace (the host's /dev is never touched); the shell lines that follow the tmpfs mount.
BASIC_DEV = """mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/full c 1 7
mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9; mknod -m 666 /dev/tty c 5 0
mkdir /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts; ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr
"""

# The decider's key dir (hook.routes.wire.KEY_DIR): a private tmpfs, so a decider started in the view
# makes its key there, never on the host (the empty mount point is all the host ever gets).
KEY_DIR_VIEW = (
    "mkdir -p /var/lib/oci-device-hook && mount -t tmpfs -o mode=0700 tmpfs /var/lib/oci-device-hook\n"
)

# A private host view: fresh /dev with only the basic nodes, throwaway /run, /var/log and key dir.
PRIVATE_HOST_VIEW = (
    "set -eu\nmount -t tmpfs -o mode=0755,nosuid tmpfs /dev\n"
    + BASIC_DEV
    + "mount -t tmpfs -o mode=0755 tmpfs /run\n"
    + "if [ -d /var/log ]; then mount -t tmpfs -o mode=0755 tmpfs /var/log; fi\n"
    + KEY_DIR_VIEW
)


# The device cgroup root runc and the hook see is a scratch cgroup (GUARD): a hook that regressed
# into writing the hierarchy's root (v1 devices.deny, a v2 program on the root) hits the scratch
# cgroup, not the machine's. The container's cgroupsPath stays inside it too.
GUARD = "odh-guard"
_V1_GUARD = f"""if [ -e /sys/fs/cgroup/devices/devices.list ]; then
mkdir -p /sys/fs/cgroup/devices/{GUARD}
mount --bind /sys/fs/cgroup/devices/{GUARD} /sys/fs/cgroup/devices
fi
"""
_V2_GUARD = f"""mount -t cgroup2 none /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/{GUARD}
mount --bind /sys/fs/cgroup/{GUARD} /sys/fs/cgroup
"""


def private_host(cmd: list[str], *, cgroup2: bool = False) -> list[str]:
    """``cmd`` inside ``unshare -m`` with the private host view and the guarded cgroup root
    (a unified cgroup2 one when ``cgroup2``)."""
    script = PRIVATE_HOST_VIEW + (_V2_GUARD if cgroup2 else _V1_GUARD) + 'exec "$@"\n'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "private-host", *cmd]


def run_container(bundle: Bundle, *, cgroup2: bool = False, timeout: float = 60) -> RunResult:
    """``runc run`` the bundle to completion (v1 host view, or cgroup2 when ``cgroup2``), always
    in a private mount namespace (see the module rule)."""
    state_root = bundle.path / "runc-state"
    cmd = private_host(runc_command(bundle, state_root), cgroup2=cgroup2)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return RunResult(proc.returncode, proc.stdout, proc.stderr)
    except subprocess.TimeoutExpired as exc:
        return RunResult(124, _text(exc.stdout), _text(exc.stderr) + "\n[timed out]")
    finally:  # in the same view: runc's state names cgroup paths as seen inside it
        delete = [RUNC, "--root", str(state_root), "delete", "-f", bundle.id]
        subprocess.run(private_host(delete, cgroup2=cgroup2), capture_output=True, timeout=30)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def probe_args(paths: list[str]) -> list[str]:
    """Container ``args`` that try to open each path once and print ``PROBE <path> <result>``."""
    lines = [
        f'if out=$(cat {p} 2>&1 </dev/null | head -c 200); then :; fi; echo "PROBE {p} ${{out:-OK}}"'
        for p in paths
    ]
    return ["/bin/sh", "-c", "; ".join(lines)]


def parse_probe(stdout: str) -> dict[str, str]:
    """``{path: "EPERM" | "ENXIO" | "ENOENT" | "EACCES" | "OK" | raw text}`` from ``probe_args`` output."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.startswith("PROBE "):
            continue
        _, path, rest = line.split(" ", 2)
        found[path] = next((name for text, name in _ERRNO_TEXT.items() if text in rest), rest)
    return found


def is_root() -> bool:
    return os.geteuid() == 0
