"""A scratch node root: what a node image has (busybox for /bin/sh, runc and only its libraries,
dpkg's admin dir), none of the host's Python, and a way to run things inside it as its own /.

Rule: the node root is a test's temp dir. ``in_node`` runs a command in a fresh ``unshare -m``
(private propagation) where the root's ``/usr`` may be read-only; with ``inside``, the root is
made that namespace's root (``pivot_root``, the host's / unmounted), as a node's own / is: a hook
that enters a container's mount namespace sees the node's paths there, never the host's.
``run_in_node`` starts a runc container in it the live-test way (``livekit.private_host``:
private /dev, /run and /var/log, the scratch device cgroup) and always deletes it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

from tests.hosttree import make_host_tree
from tests.live.livekit import RUNC, Bundle, RunResult, private_host
from tests.live.test_hook_scenarios import slice_pod

BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), "")
MISSING = next((t for t in ("chroot", "ldd", "pivot_root", "unshare") if shutil.which(t) is None), "")
NODE_PATH = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"


def copy_with_libs(binary: str, root: Path, dest: str) -> None:
    """``binary`` at ``root/dest`` and the libraries ldd names for it at their own paths."""
    (root / dest.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, root / dest.lstrip("/"))
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        words = line.split()
        lib = words[2] if "=>" in words and len(words) > 2 else words[0]
        if lib.startswith("/"):
            (root / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, root / lib.lstrip("/"))  # follows the symlink: the file itself


def build_node_root(root: Path) -> Path:
    """busybox (every applet), runc at /usr/sbin/runc with its libraries, /dev/null, an empty dpkg
    database, the seed-000 driver tree at /driver (fake nodes) and an empty /no-cdi."""
    dirs = ["bin", "proc", "sys", "dev", "run", "var/log", "var/lib/dpkg/info", "var/lib/dpkg/updates", "tmp",
            "etc", "opt", "hooklog", ".oldroot", "usr/share/containers/oci/hooks.d", "no-cdi"]  # fmt: skip
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").touch()
    os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if not os.path.lexists(root / "bin" / applet):
            (root / "bin" / applet).symlink_to("busybox")
    copy_with_libs(RUNC, root, "/usr/sbin/runc")
    make_host_tree(root / "driver", "8x-mig", mknod=True)
    return root


def in_node(
    root: Path, argv: list[str], *, inside: bool, ro_usr: bool = True, timeout: int = 300
) -> RunResult:
    """``argv`` in a fresh ``unshare -m``, the node's /usr read-only unless ``ro_usr`` is false;
    with ``inside``, run inside the node (see the module rule)."""
    r = str(root)
    script = f"set -eu\nmount --bind {r} {r}\n"
    if ro_usr:
        script += f"mount --bind {r}/usr {r}/usr\nmount -o remount,bind,ro {r}/usr\n"
    if inside:
        script += (
            f"mount -t proc proc {r}/proc\nmount --rbind /sys {r}/sys\ncd {r}\npivot_root . .oldroot\n"
            "exec chroot . /bin/sh -c 'umount -l /.oldroot && exec \"$@\"' node \"$@\"\n"
        )
    else:
        script += 'exec "$@"\n'
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "node", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return RunResult(proc.returncode, proc.stdout, proc.stderr)


def run_in_node(
    root: Path, bundle: Bundle, runtime: str = "/usr/sbin/runc", *, ro_usr: bool = True
) -> RunResult:
    """``runtime run`` of the bundle (under ``root``) inside the node, with the node's own PATH and
    nothing else in its environment; always deleted afterwards, in the same view."""
    inside = "/" + str(bundle.path.relative_to(root))
    state = f"{inside}/runc-state"
    run = private_host([runtime, "--root", state, "run", "--bundle", inside, bundle.id])
    delete = private_host(["/usr/sbin/runc", "--root", state, "delete", "-f", bundle.id])
    try:
        return in_node(root, ["env", "-i", NODE_PATH, *run], inside=True, ro_usr=ro_usr)
    finally:
        in_node(root, ["env", "-i", NODE_PATH, *delete], inside=True, ro_usr=ro_usr)


def slice_pod_in(root: Path) -> Bundle:
    """Seed 000's privileged slice pod (``slice_pod``: GPU 1 allocated, /tmp/n0 a planted c 195:0)
    in the node, on its /driver nodes; its hooks are the caller's to set."""
    unused = root / "unused"
    fake_host = {"root": root / "driver", "settings": unused, "no_cdi": unused}
    b = slice_pod(root / f"b-{uuid.uuid4().hex[:6]}", fake_host)
    b.config["hooks"] = {}
    return b.write()
