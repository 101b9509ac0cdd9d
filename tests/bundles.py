"""Test helper: OCI bundles on disk, the seed 000 node, kubelet checkpoints, and ways to run the hook.

The config shapes are the examples' own (``examples/generate.py``, loaded by file path so that
``examples`` need not be a package). ``simulate`` runs ``hook.cli.run`` in-process; ``hook_cli``
and ``hook_live`` run the real console script as a subprocess.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
NODE_INVENTORY = EXAMPLES / "node" / "inventory.json"
NODE_CDI = EXAMPLES / "node" / "cdi"


def _load_generate() -> Any:
    spec = importlib.util.spec_from_file_location("examples_generate", EXAMPLES / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generate()
node = gen.node
gpu_nodes = gen.gpu_nodes
control = gen.control
cap_nodes = gen.cap_nodes
host_devices = gen.host_devices
POD_CAPS: list[str] = gen.POD_CAPS
ALL_CAPS: list[str] = gen.ALL_CAPS
DEFAULT_RULES: list[dict[str, object]] = gen.DEFAULT_RULES
SLICE_UUID: str = gen.SLICE_UUID
MIG_UUID: str = gen.MIG_UUID
ALLOW_ALL: list[dict[str, object]] = [{"allow": True, "access": "rwm"}]
CARD0_UUID = "GPU-3f2b9c41-7d0e-4a6b-8c15-2e9f0a7b6d34"
POD_UID = "6f1c3a2e-0d4b-4c5e-9a7f-2b8e1d3c4a50"
CONTAINER = "worker"
POD_ANNOTATIONS = {
    "io.kubernetes.cri.sandbox-id": "5f0c" * 16,
    "io.kubernetes.cri.sandbox-uid": POD_UID,
    "io.kubernetes.cri.container-name": CONTAINER,
}
# containerd's linux.cgroupsPath (cgroupfs driver): with sandbox-id, what names containerd
# (hook/sources/kubelet/podid.py)
CONTAINERD_CGROUPS_PATH = f"/kubepods/besteffort/pod{POD_UID}/" + "4b2d" * 16


def config(
    env: Sequence[str] = (),
    *,
    privileged: bool = False,
    caps: Sequence[str] | None = None,
    devices: Sequence[dict[str, object]] = (),
    rules: Sequence[dict[str, object]] | None = None,
    annotations: dict[str, str] | None = None,
    mounts: Sequence[dict[str, object]] | None = None,
) -> dict[str, Any]:
    """``examples/generate.config`` with pod defaults: privileged picks all caps and allow-all."""
    if caps is None:
        caps = ALL_CAPS if privileged else POD_CAPS
    if rules is None:
        rules = ALLOW_ALL if privileged else DEFAULT_RULES
    containerd = "io.kubernetes.cri.sandbox-id" in (annotations or {})
    return gen.config(
        list(env),
        privileged=privileged,
        caps=list(caps),
        devices=list(devices),
        rules=list(rules),
        annotations=annotations,
        mounts=list(mounts or []),
        cgroups_path=CONTAINERD_CGROUPS_PATH if containerd else "",
    )


def write_bundle(root: Path, cfg: dict[str, Any] | bytes | None = None, **kw: Any) -> Path:
    """A bundle dir with ``rootfs/`` and ``config.json`` (raw bytes are written as they are)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "rootfs").mkdir(exist_ok=True)
    if cfg is None:
        cfg = config(**kw)
    data = cfg if isinstance(cfg, bytes) else json.dumps(cfg).encode()
    (root / "config.json").write_bytes(data)
    return root


def state(bundle: Path, **extra: Any) -> bytes:
    obj = {"ociVersion": "1.1.0", "id": "ctr-1", "status": "creating", "pid": 0, "bundle": str(bundle)}
    obj.update(extra)
    obj["pid"] = obj["pid"] or None
    return json.dumps({k: v for k, v in obj.items() if v is not None}).encode()


def null_mount(dest: str) -> dict[str, object]:
    return {"destination": dest, "type": "bind", "source": "/dev/null", "options": ["bind", "ro"]}


# --- kubelet checkpoint: JSON with a base64 protobuf ContainerAllocateResponse -------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def alloc_resp(
    envs: dict[str, str] | None = None,
    devices: Sequence[tuple[str, str, str]] = (),
    cdi: Sequence[str] = (),
    *,
    mounts: Sequence[tuple[str, str]] = (),
    annotations: dict[str, str] | None = None,
) -> bytes:
    """Encode ``ContainerAllocateResponse{envs=1 (map), mounts=2 (Mount), devices=3 (DeviceSpec),
    annotations=4 (map), cdi_devices=5}`` as the kubelet stores it (deviceplugin/v1beta1 api.proto)."""
    out = b""
    for k, v in (envs or {}).items():
        out += _field(1, _field(1, k.encode()) + _field(2, v.encode()))
    for cpath, hpath in mounts:  # Mount{container_path=1, host_path=2, read_only=3 (varint)}
        out += _field(2, _field(1, cpath.encode()) + _field(2, hpath.encode()) + b"\x18\x01")
    for k, v in (annotations or {}).items():
        out += _field(4, _field(1, k.encode()) + _field(2, v.encode()))
    for cpath, hpath, perms in devices:
        out += _field(3, _field(1, cpath.encode()) + _field(2, hpath.encode()) + _field(3, perms.encode()))
    for name in cdi:
        out += _field(5, _field(1, name.encode()))
    return out


def checkpoint_entry(
    resource: str,
    ids: Sequence[str],
    resp: bytes | None = None,
    *,
    pod_uid: str = POD_UID,
    container: str = CONTAINER,
) -> dict[str, object]:
    entry: dict[str, object] = {
        "PodUID": pod_uid,
        "ContainerName": container,
        "ResourceName": resource,
        "DeviceIDs": {"0": list(ids)},
    }
    if resp is not None:
        entry["AllocResp"] = base64.b64encode(resp).decode()
    return entry


def checkpoint(entries: Sequence[dict[str, object]]) -> bytes:
    return json.dumps(
        {"Data": {"PodDeviceEntries": list(entries), "RegisteredDevices": {}}, "Checksum": 1}
    ).encode()


# --- settings and running the hook ----------------------------------------------------------------


def settings_file(tmp: Path, **values: Any) -> Path:
    """A settings YAML (JSON is YAML) whose log and cache stay under ``tmp``."""
    obj = {"log_file": str(tmp / "hook.log"), "cache_dir": str(tmp / "cache"), **values}
    path = tmp / "settings.yaml"
    path.write_text(json.dumps(obj) + "\n")
    return path


def node_args(driver_root: Path | None = None) -> list[str]:
    args = ["--inventory", str(NODE_INVENTORY), "--cdi-spec-dir", str(NODE_CDI)]
    if driver_root is not None:
        args += ["--driver-root", str(driver_root)]
    return args


def simulate(bundle: Path, *extra: str, capsys: Any, fmt: str = "json") -> tuple[int, Any, str]:
    """Run ``hook --bundle`` in-process; returns (exit code, decoded report or text, stderr)."""
    from hook.cli import run

    capsys.readouterr()
    rc = run(["--bundle", str(bundle), "--format", fmt, *extra])
    out, err = capsys.readouterr()
    if fmt == "json" and out:
        return rc, json.loads(out), err
    return rc, out, err


def _hook_exe() -> list[str]:
    exe = shutil.which("hook")
    return [exe] if exe else [sys.executable, "-m", "hook"]


def hook_cli(*args: str, stdin: bytes = b"", cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_hook_exe(), *args],
        input=stdin.decode("latin-1"),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


# Live mode writes its fast-path cache under /run/oci-device-hook and may log to /var/log: give it a
# private /run and /var/log (root only).
PRIVATE_RUN = (
    []
    if os.geteuid() != 0 or shutil.which("unshare") is None
    else [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs tmpfs /run && { [ ! -d /var/log ] || mount -t tmpfs tmpfs /var/log; }'
        " && mkdir -p /var/lib/oci-device-hook && mount -t tmpfs -o mode=0700 tmpfs /var/lib/oci-device-hook"
        ' && exec "$@"',
        "sh",
    ]
)


def hook_live(stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Live mode: the real console script with the state on stdin (as root, in a private /run)."""
    return subprocess.run(
        [*PRIVATE_RUN, *_hook_exe(), *args], input=stdin, capture_output=True, timeout=60, check=False
    )


def deny_keys(report: dict[str, Any]) -> set[tuple[str, int, int | None]]:
    return {(r["type"], r["major"], r["minor"]) for r in report["cgroup"] if not r["allow"]}


def denied_among(report: dict[str, Any], keys: Iterable[tuple[str, int, int]]) -> set[tuple[str, int, int]]:
    """The keys among ``keys`` the report's deny rules close: by an exact rule, or by a whole
    major's (``c M:*``: a class the container was not given, issue 36 item 5)."""
    whole = {(r["type"], r["major"]) for r in report["cgroup"] if not r["allow"] and r["minor"] is None}
    exact = deny_keys(report)
    return {k for k in keys if k in exact or (k[0], k[1]) in whole}


def allow_keys(report: dict[str, Any]) -> set[tuple[str, int, int | None]]:
    return {(r["type"], r["major"], r["minor"]) for r in report["cgroup"] if r["allow"]}
