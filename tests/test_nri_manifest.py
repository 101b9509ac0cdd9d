"""The NRI route's DaemonSet (packaging/kubernetes/nri/daemonset.yaml) and ``render ROUTE=nri``.

What the daemon needs on a node, each a line of the manifest a test can read: the engine's NRI
socket directory mounted where the chrooted hook looks for it (the settings' default
``nri_socket``), the node's PID namespace (the pids the engine sends), privilege (pidfds, other
containers' ``/dev`` and device cgroups, eBPF), and the toleration annotation the doctor and the
docs name, without which a node that requires the plugin could never start the daemon again.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from hook.tools.doctornri import DEFAULT_SOCKET, TOLERATE

REPO = Path(__file__).resolve().parents[1]
RENDER = REPO / "packaging/kubernetes/render"


def _render(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RENDER)], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def _daemonsets(stream: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(stream) if d and d["kind"] == "DaemonSet"}


def test_render_adds_the_nri_daemonset_only_when_asked() -> None:
    assert set(_daemonsets(_render().stdout)) == {"oci-device-hook"}
    got = _render(ROUTE="nri", IMAGE="registry.example/odh", TAG="9.9")
    assert got.returncode == 0, got.stderr
    sets = _daemonsets(got.stdout)
    assert set(sets) == {"oci-device-hook", "oci-device-hook-nri"}
    (nri,) = sets["oci-device-hook-nri"]["spec"]["template"]["spec"]["containers"]
    assert nri["image"] == "registry.example/odh:9.9"
    bad = _render(ROUTE="wrapper")
    assert bad.returncode == 2 and bad.stdout == "" and "ROUTE" in bad.stderr


def test_the_nri_daemonset_mounts_the_socket_and_tolerates_a_missing_plugin() -> None:
    ds = _daemonsets(_render(ROUTE="nri").stdout)["oci-device-hook-nri"]
    main = _daemonsets(_render().stdout)["oci-device-hook"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["namespace"] == main["metadata"]["namespace"]
    for key in ("nodeSelector", "affinity", "tolerations"):  # the main DaemonSet's nodes
        assert pod.get(key) == main["spec"]["template"]["spec"].get(key), key
    assert ds["spec"]["template"]["metadata"]["annotations"] == {TOLERATE: "true"}
    assert pod["hostPID"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["privileged"] is True
    script = c["args"][0]
    assert '"$hook" nri' in script and "chroot" in script and "nsenter -t 1 -C" in script
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    socket_dir = os.path.dirname(DEFAULT_SOCKET)  # the daemon's default, seen chrooted in /host
    mount = mounts[f"/host{socket_dir}"]
    assert volumes[mount["name"]] == socket_dir and not mount.get("readOnly")
    assert mounts["/host"]["readOnly"] is True


def test_the_nri_unit_runs_hook_nri_and_is_never_enabled_by_the_package() -> None:
    """The route is the operator's choice: the .deb installs the unit; postinst never enables it,
    prerm disables it before its file goes."""
    unit = (REPO / "packaging/debian/oci-device-hook-nri.service").read_text()
    exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    assert exec_start == "ExecStart=/usr/libexec/oci-device-hook/hook nri"
    assert "oci-device-hook-nri" not in (REPO / "packaging/debian/postinst").read_text()
    assert "disable --now oci-device-hook-nri.service" in (REPO / "packaging/debian/prerm").read_text()


def test_the_deb_carries_the_nri_unit_and_manifest(built_deb: Path) -> None:
    listing = subprocess.run(["dpkg-deb", "-c", str(built_deb)], capture_output=True, text=True, check=True)
    assert "./lib/systemd/system/oci-device-hook-nri.service" in listing.stdout
    assert "./usr/share/doc/oci-device-hook/kubernetes/nri/daemonset.yaml" in listing.stdout
