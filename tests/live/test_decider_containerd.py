"""Issue 27 through a real containerd: its registered runtime (the wrapper) asks the warm decider.

The same ``containerd`` as tests/live/test_spec_level.py (its own root, state and socket, a private
``/run``), with ``hook serve --config S`` started in that private view first (S: the settings the
engine's environment names, as the wrapper passes them; its key dir a private tmpfs). The slice
pod and the MIG pod are narrowed exactly as without a decider, and the hook's own log records say
the decider answered (``decider``, ``route``), so a silent in-process fallback cannot pass.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live.test_spec_level import (
    MIG_ANNOTATION,
    MIG_EXPECTED,
    MIG_PROBES,
    SLICE_ENV,
    SLICE_EXPECTED,
    SLICE_PROBES,
    _ctr,
    _ctr_run,
    _privileged_bundle,
    containerd,
    world,
)

__all__ = ["containerd", "world"]  # the module-scoped fixtures, shared

SOCKET = "/run/oci-device-hook/decider.sock"


@pytest.fixture(scope="module")
def served_containerd(world: dict[str, Path]) -> Iterator[dict[str, Any]]:
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("containerd not installed (apt-get install containerd)")
    base = world["base"] / "containerd-decider"
    base.mkdir()
    sock = base / "c.sock"
    config = base / "config.toml"
    disabled = [
        "io.containerd.grpc.v1.cri", "io.containerd.internal.v1.tracing",
        "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
        "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
    ]  # fmt: skip
    config.write_text(
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
        f"disabled_plugins = {json.dumps(disabled)}\n"
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{base}/opt"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
    )
    env = {
        **os.environ,
        "OCI_DEVICE_HOOK_CONFIG": str(world["settings"]),
        "OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS": "5000",  # a loaded machine's first decision: still served
    }
    serve = f"{sys.executable} -I -m hook serve --config {world['settings']}"
    script = (
        "mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -m 0700 /run/oci-device-hook"
        " && mkdir -p /var/lib/oci-device-hook && mount -t tmpfs -o mode=0700 tmpfs /var/lib/oci-device-hook"
        f" && {{ {serve} 2>{base}/serve.err & }}"
        f" && i=0; while [ ! -S {SOCKET} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done;"
        ' exec "$@"'
    )
    log = open(base / "containerd.log", "wb")  # noqa: SIM115 - closed after the daemon
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]
    cmd += ["containerd", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.1)
        else:
            pytest.fail("containerd did not start: " + (base / "containerd.log").read_text()[-2000:])
        yield {"sock": sock, "ns": f"odh-{uuid.uuid4().hex[:8]}", "base": base}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.killpg(proc.pid, signal.SIGTERM)  # the decider (its own child of the same session)
        log.close()


def _last_record(world: dict[str, Path]) -> dict[str, Any]:
    rec: dict[str, Any] = json.loads((world["base"] / "hook.log").read_text().splitlines()[-1])
    return rec


def test_containerd_through_the_wrapper_is_served_and_narrows_the_slice_pod(
    world: dict[str, Path], served_containerd: dict[str, Any], tmp_path: Path
) -> None:
    seen = _ctr_run(world, served_containerd, _privileged_bundle(tmp_path / "b", SLICE_ENV, SLICE_PROBES))
    assert seen == SLICE_EXPECTED
    rec = _last_record(world)
    assert (rec["verdict"], rec["route"], rec.get("decider")) == ("apply", "wrapper", "answered"), rec


def test_containerd_through_the_wrapper_is_served_and_narrows_the_mig_pod(
    world: dict[str, Path], served_containerd: dict[str, Any], tmp_path: Path
) -> None:
    b = _privileged_bundle(tmp_path / "b", [], MIG_PROBES, MIG_ANNOTATION)
    assert _ctr_run(world, served_containerd, b) == MIG_EXPECTED
    rec = _last_record(world)
    assert (rec["verdict"], rec["route"], rec.get("decider")) == ("apply", "wrapper", "answered"), rec


# What may differ between a served and an in-process start: when, how long, who decided, which id.
_VARYING = {"time", "duration_ms", "decider"}


def _comparable(rec: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in rec.items() if k not in _VARYING}
    if isinstance(out.get("container"), dict):
        out["container"] = {k: v for k, v in out["container"].items() if k != "id"}
    return out


@pytest.mark.parametrize("pod", ["slice", "mig", "plain"])
def test_containerd_served_and_in_process_starts_are_the_same(
    world: dict[str, Path],
    containerd: dict[str, Any],
    served_containerd: dict[str, Any],
    tmp_path: Path,
    pod: str,
) -> None:
    """The same bundle through the registered wrapper of two containerds, one with the decider and
    one without: the same exit, output, probes and log record (less time, duration, decider, id)."""
    shapes = {
        "slice": (SLICE_ENV, SLICE_PROBES, None),
        "mig": ([], MIG_PROBES, MIG_ANNOTATION),
        "plain": ([], SLICE_PROBES, None),
    }
    env, probes, annotations = shapes[pod]
    results, records = [], []
    for name, ctd in (("in-process", containerd), ("served", served_containerd)):
        log = world["base"] / "hook.log"
        before = len(log.read_text().splitlines()) if log.exists() else 0
        proc = _ctr(world, ctd, _privileged_bundle(tmp_path / name, env, probes, annotations))
        results.append((proc.returncode, proc.stdout, proc.stderr))
        lines = log.read_text().splitlines()[before:] if log.exists() else []
        records.append([json.loads(line) for line in lines])
    assert results[0] == results[1]
    assert [_comparable(r) for r in records[0]] == [_comparable(r) for r in records[1]]
    if pod != "plain":  # a container that asks for nothing is answered on the fast path: no record
        assert [r.get("decider") for r in records[1]] == ["answered"]
        assert all(r.get("decider") != "answered" for r in records[0])
