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
from pathlib import Path

import pytest
import yaml

from tests.live.livekit import RunResult, parse_probe
from tests.live.noderoot import BUSYBOX, MISSING, build_node_root, in_node, run_in_node, slice_pod_in
from tests.test_install import make_tree

PREFIX = "/opt/oci-device-hook"
pytestmark = pytest.mark.skipif(not BUSYBOX or bool(MISSING), reason=f"busybox-static, {MISSING}")
NARROWED = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}  # its card only


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_node_root(tmp_path_factory.mktemp("node"))


def installer(root: Path, tree: Path, *args: str) -> RunResult:
    exe = str(tree / "usr/libexec/oci-device-hook/installer")
    return in_node(root, [exe, *args, "--root", str(root), "--src", str(tree)], inside=False)


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
        # doctor judges the registration that points at this prefix
        doctor = in_node(node, [f"{PREFIX}/hook", "doctor", "--format", "json"], inside=True)
        checks = {c["name"]: c for c in json.loads(doctor.stdout)}
        assert checks["hooks.d"]["ok"] and checks["hooks.d"]["detail"].endswith(f"{PREFIX}/hook"), checks
        assert checks["hooks.d order"]["detail"] == "oci-device-hook.json: prestart (live)", checks
        # hooks.d (podman, CRI-O): the engine runs the entry as it reads it; a privileged slice pod
        b = slice_pod_in(node)
        b.config["hooks"] = {"prestart": [entry]}
        b.write()
        res = run_in_node(node, b, "/usr/sbin/runc")
        assert res.rc == 0, res.stderr
        assert parse_probe(res.stdout) == NARROWED
        rec = _log(node)[-1]
        assert (rec["verdict"], rec.get("stage"), rec["version"]) == ("apply", None, "0.1.0"), rec

        # containerd's handlers: the runtime wrapper decides at spec level, then runc starts it
        b = slice_pod_in(node)
        res = run_in_node(node, b, f"{PREFIX}/runtime")
        assert res.rc == 0, res.stderr
        assert parse_probe(res.stdout) == NARROWED
        rec = _log(node)[-1]
        assert (rec["verdict"], rec["stage"]) == ("apply", "precreate"), rec
    finally:
        gone = installer(node, tree, "uninstall")  # the record names the prefix
    assert gone.rc == 0, gone.stderr
    assert not (node / PREFIX.lstrip("/")).exists() and not hooks_file.exists()
    assert not os.path.lexists(node / "usr/bin/python3")
