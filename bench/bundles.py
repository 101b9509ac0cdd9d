"""Bench fixtures: the packaged-style launcher, a busybox rootfs, and the OCI bundles bench/run starts.

Rule: everything lives under one scratch directory. The hook is run the way the package installs
it (``packaging/launcher``: ``python3 -ISB`` with the hook and its dependencies in ``lib/`` beside
the launcher), so the measured start-up cost is the shipped one. Bundles are ``runc spec``-style,
self-contained here (the live-test kit in ``tests/live`` is another engineer's moving target).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
BUSYBOX = Path("/usr/bin/busybox")
APPLETS = ("sh", "true", "cat", "ls")
HOOK_ENV = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
# Third-party packages the hook imports on some live path (pynvml is lazy and deliberately absent:
# the bench would fail loudly if a measured path reached NVML).
LIB_PACKAGES = ("yaml", "_yaml", "click")


def build_launcher(dest: Path, interp: str = sys.executable) -> Path:
    """``dest/hook`` + ``dest/lib``: the packaged launcher's shape on ``interp``, using this checkout.

    ``interp`` must be a real interpreter, never a pyenv shim (a bash script that would dominate).
    """
    lib = dest / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    links = {"hook": REPO / "hook"}
    for name in LIB_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            links[name] = Path(next(iter(spec.submodule_search_locations)))
    for name, target in links.items():
        link = lib / name
        if not link.exists():
            link.symlink_to(target)
    text = (REPO / "packaging" / "launcher").read_text()
    first, _, rest = text.partition("\n")
    if not first.startswith("#!") or "-I" not in first:
        raise RuntimeError("packaging/launcher no longer starts with an isolated python shebang")
    flags = first.split()[-1] if first.split()[-1].startswith("-") else "-I"
    launcher = dest / "hook"
    launcher.write_text(f"#!{interp} {flags}\n{rest}")
    launcher.chmod(0o755)
    return launcher


def build_bundled_launcher(dest: Path, lib: Path) -> Path:
    """``dest/hook``: the launcher the package installs with its own interpreter (``packaging/
    bundle-python`` of /usr/bin/python3 in ``dest/python``, started through its own loader from
    ``packaging/launcher.sh.in``), on the same ``lib`` as ``build_launcher``'s."""
    import subprocess

    pkg = REPO / "packaging"
    subprocess.run([str(pkg / "bundle-python"), str(dest / "python")], check=True, stdout=subprocess.DEVNULL)
    (dest / "lib").symlink_to(lib)
    shutil.copy2(pkg / "launcher", dest / "launcher.py")
    loader = next(p.name for p in (dest / "python" / "lib").glob("ld-*.so*"))
    text = (pkg / "launcher.sh.in").read_text()
    for key, value in {"@PYTHON@": f"{dest}/python", "@LOADER@": loader, "@DIR@": str(dest)}.items():
        text = text.replace(key, value)
    launcher = dest / "hook"
    launcher.write_text(text)
    launcher.chmod(0o755)
    return launcher


def launcher_flags(launcher: Path) -> str:
    return launcher.read_text().partition("\n")[0].split()[-1]


def build_rootfs(dest: Path) -> Path:
    """Static busybox plus a few applet links and the usual empty directories."""
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    for d in ("dev", "proc", "sys", "tmp", "etc"):
        (dest / d).mkdir(exist_ok=True)
    if not (dest / "bin" / "busybox").exists():
        shutil.copy2(BUSYBOX, dest / "bin" / "busybox")
    for applet in APPLETS:
        link = dest / "bin" / applet
        if not link.is_symlink():
            link.symlink_to("busybox")
    return dest


def hook_entry(launcher: Path, args: list[str] | None = None) -> dict[str, Any]:
    return {"path": str(launcher), "args": [str(launcher), *(args or [])], "env": HOOK_ENV, "timeout": 30}


def _mounts() -> list[dict[str, Any]]:
    nosuid = ["nosuid", "noexec", "nodev"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": [*nosuid, "mode=1777"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": [*nosuid, "ro"]},
    ]


def nodev_config(rootfs: Path, cgroups_path: str) -> dict[str, Any]:
    """A plain container: default devices only, deny-all device cgroup, runs ``/bin/true``."""
    return {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/true"], "cwd": "/",
                    "env": ["PATH=/bin", "HOME=/"], "noNewPrivileges": True},
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "bench",
        "mounts": _mounts(),
        "hooks": {},
        "linux": {
            "cgroupsPath": cgroups_path,
            "devices": [],
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
        },
    }


def slice_config(rootfs: Path, cgroups_path: str) -> dict[str, Any]:
    """The seed 000 slice pod (examples/slice-privileged) made runnable: busybox, ``/bin/true``.

    Its shape is kept: allow-all device cgroup, every host accelerator in ``linux.devices`` (runc
    mknods them in the container's /dev from major/minor), CAP_SYS_ADMIN, and the plugin's
    NVIDIA_VISIBLE_DEVICES with HAMi-style corroborating env.
    """
    example = json.loads((EXAMPLES / "slice-privileged" / "config.json").read_text())
    config = nodev_config(rootfs, cgroups_path)
    config["annotations"] = example.get("annotations", {})
    process = config["process"]
    env = [e for e in example["process"]["env"] if not e.startswith("PATH=")]
    process["env"] = ["PATH=/bin", "HOME=/", *env]
    process["capabilities"] = example["process"]["capabilities"]
    process["noNewPrivileges"] = False
    linux = config["linux"]
    linux["devices"] = example["linux"]["devices"]
    linux["resources"]["devices"] = example["linux"]["resources"]["devices"]
    return config


def write_bundle(dest: Path, config: dict[str, Any]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


def state_for(bundle: Path, cid: str, pid: int | None = None) -> bytes:
    """The OCI state a runtime hands a prestart hook on stdin."""
    state: dict[str, Any] = {"ociVersion": "1.0.2", "id": cid, "status": "creating", "bundle": str(bundle),
                             "annotations": {}}
    if pid is not None:
        state["pid"] = pid
    return json.dumps(state).encode()
