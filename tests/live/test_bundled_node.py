"""Issue 22 item 2: a node with no Python and a read-only /usr runs real containers through the hook.

The "node" is a scratch root: busybox for /bin/sh, runc with only the libraries runc itself needs
(no libz, no libexpat: the interpreter cannot borrow the node's), no ``/usr/bin/python3``, and a
``/usr`` that every step sees read-only (a read-only bind mount in the step's own ``unshare -m``).
The installer (the DaemonSet's, run from a package tree on this machine) installs into it under
``/opt/oci-device-hook``; then runc, chrooted into the node, starts containers whose prestart hook
is the node's hooks.d entry, and containers through the runtime wrapper containerd's handlers
name (``hook precreate`` before runc). Isolation as everywhere: every runc runs in ``unshare -m``
with private /dev, /run and /var/log (``livekit.private_host``, inside the chroot) and the
container in the scratch cgroup; the node root is the test's temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.hosttree import make_host_tree
from tests.live.livekit import RUNC, Bundle, RunResult, parse_probe, private_host
from tests.live.test_hook_scenarios import slice_pod
from tests.test_install import make_tree

PREFIX = "/opt/oci-device-hook"
BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), "")

pytestmark = pytest.mark.skipif(
    not BUSYBOX or not shutil.which("chroot") or not shutil.which("ldd"), reason="busybox, chroot, ldd"
)
NARROWED = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}  # its card only


def _copy_with_libs(binary: str, root: Path, dest: str) -> None:
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


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("node")
    for d in ("bin", "proc", "sys", "dev", "run", "var/log", "tmp", "etc", "opt", "hooklog", ".oldroot",
              "usr/share/containers/oci/hooks.d", "no-cdi"):  # fmt: skip
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if not (root / "bin" / applet).exists():
            (root / "bin" / applet).symlink_to("busybox")
    _copy_with_libs(RUNC, root, "/usr/sbin/runc")
    make_host_tree(root / "driver", "8x-mig", mknod=True)
    return root


def in_node(root: Path, argv: list[str], *, chroot: bool, timeout: int = 300) -> RunResult:
    """``argv`` in a fresh ``unshare -m`` where the node's /usr is read-only; with ``chroot``, inside
    the node: its root made the namespace's root (``pivot_root``, the host's unmounted), as a
    node's own / is (a hook that enters the container's mount namespace sees this root there)."""
    r = str(root)
    script = f"set -eu\nmount --bind {r} {r}\nmount --bind {r}/usr {r}/usr\n"
    script += f"mount -o remount,bind,ro {r}/usr\n"
    if chroot:
        script += (
            f"mount -t proc proc {r}/proc\nmount --rbind /sys {r}/sys\ncd {r}\npivot_root . .oldroot\n"
            'exec chroot . /bin/sh -c \'umount -l /.oldroot && exec "$@"\' node "$@"\n'
        )
    else:
        script += 'exec "$@"\n'
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "node", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return RunResult(proc.returncode, proc.stdout, proc.stderr)


def installer(root: Path, tree: Path, *args: str) -> RunResult:
    exe = str(tree / "usr/libexec/oci-device-hook/installer")
    return in_node(root, [exe, *args, "--root", str(root), "--src", str(tree)], chroot=False)


def run_in_node(root: Path, bundle: Bundle, runtime: str) -> RunResult:
    """``runtime run`` of the bundle inside the node, always deleted afterwards (same view)."""
    inside = "/" + str(bundle.path.relative_to(root))
    state = f"{inside}/runc-state"
    path = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
    run = in_node(root, ["env", "-i", path, *private_host([runtime, "--root", state, "run", "--bundle",
                                                           inside, bundle.id])], chroot=True)  # fmt: skip
    in_node(root, ["env", "-i", path, *private_host(["/usr/sbin/runc", "--root", state, "delete", "-f",
                                                     bundle.id])], chroot=True)  # fmt: skip
    return run


def _pod(root: Path) -> Bundle:
    """Seed 000's privileged slice pod (``slice_pod``) in the node, its hooks left to the caller."""
    unused = root / "unused"
    fake_host = {"root": root / "driver", "settings": unused, "no_cdi": unused}
    return slice_pod(root / f"b-{uuid.uuid4().hex[:6]}", fake_host)


def _log(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "hooklog/hook.log").read_text().splitlines()]


def test_a_node_without_python_and_with_a_read_only_usr_runs_containers_through_the_hook(
    node: Path, tmp_path: Path
) -> None:
    assert not (node / "usr/bin/python3").exists() and not list(node.rglob("libexpat*"))
    tree = make_tree(tmp_path / "tree")
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"log_file": "/hooklog/hook.log", "cache_dir": "/hookcache",
                                        "driver_root": "/driver", "cdi_spec_dirs": ["/no-cdi"]}))  # fmt: skip
    # the default prefix is under the read-only /usr: refused with what to do, nothing written
    refused = installer(node, tree, "install", "--engine", "hooks.d")
    assert refused.rc == 1 and "not writable on this node" in refused.stderr, refused.stderr
    assert "/opt/oci-device-hook" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert not (node / "var/lib/oci-device-hook").exists() and not list((node / "opt").iterdir())

    args = ["--prefix", PREFIX, "--engine", "hooks.d", "--settings", str(settings)]
    done = installer(node, tree, "install", *args)
    assert done.rc == 0, done.stderr
    assert "installed 0.1.0 for Python 3." in done.stderr and "(bundled)" in done.stderr
    hooks_file = node / "etc/containers/oci/hooks.d/oci-device-hook.json"  # /usr's is read-only
    entry = json.loads(hooks_file.read_text())["hook"]
    assert entry["path"] == f"{PREFIX}/hook"
    assert list((node / "usr/share/containers/oci/hooks.d").iterdir()) == []
    version_dir = f"{PREFIX}/versions/0.1.0"
    assert f"'{version_dir}/python/lib/ld-linux" in (node / version_dir.lstrip("/") / "hook").read_text()
    try:
        # hooks.d (podman, CRI-O): the engine runs the entry as it reads it; a privileged slice pod
        b = _pod(node)
        b.config["hooks"] = {"prestart": [entry]}
        b.write()
        res = run_in_node(node, b, "/usr/sbin/runc")
        assert res.rc == 0, res.stderr
        assert parse_probe(res.stdout) == NARROWED
        rec = _log(node)[-1]
        assert (rec["verdict"], rec.get("stage"), rec["version"]) == ("apply", None, "0.1.0"), rec

        # containerd's handlers: the runtime wrapper decides at spec level, then runc starts it
        b = _pod(node)
        b.config["hooks"] = {}
        b.write()
        res = run_in_node(node, b, f"{PREFIX}/runtime")
        assert res.rc == 0, res.stderr
        assert parse_probe(res.stdout) == NARROWED
        rec = _log(node)[-1]
        assert (rec["verdict"], rec["stage"]) == ("apply", "precreate"), rec
    finally:
        gone = installer(node, tree, "uninstall", "--prefix", PREFIX)
    assert gone.rc == 0, gone.stderr
    assert not (node / PREFIX.lstrip("/")).exists() and not hooks_file.exists()
    assert not os.path.lexists(node / "usr/bin/python3")
