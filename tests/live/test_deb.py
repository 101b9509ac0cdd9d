"""Live: the .deb installed into a scratch node root (``dpkg --root``, as an image build does),
narrowing a privileged container there, then removed and purged.

Rule: the host's dpkg database, /usr, /etc, /run and /var/log are never touched: the package goes
into the node root (``tests/live/noderoot.py``: busybox, runc and its libraries, an empty dpkg
database, no Python), its maintainer scripts run chrooted there (so their /run/oci-device-hook is
the node's), and containers start with runc inside the node (its root as the mount namespace's
root, private /dev, /run and /var/log, the scratch device cgroup). The node's hooks.d entry is
what the containers run, as podman or CRI-O would run it from the installed file.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live.livekit import parse_probe
from tests.live.noderoot import BUSYBOX, MISSING, build_node_root, in_node, run_in_node, slice_pod_in

PKG = "oci-device-hook"
HOOK = "/usr/libexec/oci-device-hook/hook"
HOOKS_JSON = "/usr/share/containers/oci/hooks.d/oci-device-hook.json"
CONFFILES = ("/etc/oci-device-hook/config.yaml", "/etc/logrotate.d/oci-device-hook")
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not BUSYBOX or bool(MISSING), reason=f"root, busybox-static, {MISSING or 'dpkg'}"
)


def _dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["dpkg", f"--root={root}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def node(built_deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The node root with the package installed (postinst ran, chrooted, doctor included)."""
    root = build_node_root(tmp_path_factory.mktemp("debnode"))
    proc = _dpkg(root, "-i", str(built_deb))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (root / "test-config.yaml").write_text("log_file: /hooklog/hook.log\ncache_dir: /hookcache\n")
    yield root


def _node(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _entry(root: Path, *extra: str) -> dict[str, object]:
    """The installed hooks.d entry, its args extended for the fake host (as a test hooks dir would)."""
    hook = json.loads(_node(root, HOOKS_JSON).read_text())["hook"]
    hook["args"] = [*hook["args"], *extra]
    return hook


def test_install_places_every_file_and_needs_no_python(node: Path) -> None:
    listed = _dpkg(node, "-L", PKG).stdout.split()
    for path in (HOOK, HOOKS_JSON, *CONFFILES, "/usr/libexec/oci-device-hook/lib/hook/entry.py"):
        assert path in listed and _node(node, path).exists(), path
    assert os.access(_node(node, HOOK), os.X_OK)
    assert _node(node, HOOKS_JSON).read_text() == (REPO / "nvidia-hook.json").read_text()
    assert not _node(node, "/usr/bin/python3").exists()
    assert _node(node, "/run/oci-device-hook").is_dir()  # postinst's, in the node's /run


def test_installed_launcher_runs_doctor(node: Path) -> None:
    proc = in_node(node, [HOOK, "doctor", "--format", "json"], inside=True)
    assert proc.rc in (0, 1), proc.stderr
    names = {c["name"] for c in json.loads(proc.stdout)}
    assert {"driver", "hooks.d", "settings"} <= names


def test_without_the_hook_a_privileged_container_sees_every_gpu(node: Path) -> None:
    """The control run: proves the probe can tell allowed (ENXIO) from narrowed."""
    res = run_in_node(node, slice_pod_in(node))
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENXIO", "/tmp/n0": "ENXIO"}


def test_privileged_slice_is_narrowed_to_its_card(node: Path) -> None:
    b = slice_pod_in(node)
    b.config["hooks"] = {
        "prestart": [_entry(node, "--driver-root", "/driver", "--cdi-spec-dir", "/no-cdi", "--config",
                            "/test-config.yaml")]
    }  # fmt: skip
    res = run_in_node(node, b.write())
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
    record = json.loads(_node(node, "/hooklog/hook.log").read_text().splitlines()[-1])
    assert record["verdict"] == "apply" and record["container"]["privileged"] is True


def test_unprivileged_plain_container_starts_with_the_installed_registration(node: Path) -> None:
    b = slice_pod_in(node)
    b.config["process"]["args"] = ["/bin/sh", "-c", "echo started"]
    b.config["linux"]["devices"] = []
    b.config["linux"]["resources"]["devices"] = [{"allow": False, "access": "rwm"}]
    b.config["process"]["env"] = ["PATH=/bin"]
    b.config["hooks"] = {"prestart": [_entry(node)]}  # exactly the installed entry: default settings
    res = run_in_node(node, b.write())
    assert res.rc == 0 and res.stdout == "started\n", res.stderr


def test_remove_then_purge_deletes_every_file(node: Path) -> None:
    listed = [p for p in _dpkg(node, "-L", PKG).stdout.split() if p.startswith("/usr/libexec/")]
    proc = _dpkg(node, "-r", PKG)
    assert proc.returncode == 0, proc.stderr
    assert [p for p in listed if _node(node, p).exists() and not _node(node, p).is_dir()] == []
    assert not _node(node, "/usr/libexec/oci-device-hook").exists()
    assert all(_node(node, p).exists() for p in CONFFILES)  # dpkg -r keeps conffiles
    assert not _node(node, "/run/oci-device-hook").exists()
    proc = _dpkg(node, "-P", PKG)
    assert proc.returncode == 0, proc.stderr
    assert not any(_node(node, p).exists() for p in CONFFILES)
    assert not _node(node, "/etc/oci-device-hook").exists()
    assert _dpkg(node, "-s", PKG).returncode != 0
