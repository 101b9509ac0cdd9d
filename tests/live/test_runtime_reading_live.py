"""Issue 21, items 1-4, with real runc: the hook reads each field the way runc and the engine do.

Every container runs through ``livekit`` (``unshare -m``, private ``/dev``, ``/run`` and
``/var/log``, a scratch cgroup). Spec-level cases run ``hook precreate`` in a private ``/run``
first and hand runc only the decided config (no hook in it), as the runtime wrapper does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import alloc_resp, checkpoint
from tests.hosttree import make_host_tree
from tests.k8s_shapes import CONTAINER, POD_UID, write_cdi
from tests.live.isolation import listing, run_isolated
from tests.live.livekit import (
    RUNC,
    Bundle,
    RunResult,
    _text,
    parse_probe,
    private_host,
    run_container,
    runc_command,
)
from tests.live.test_blast_radius import fake_host_dev, host_dev_bundle
from tests.live.test_hook_scenarios import slice_pod
from tests.live.test_k8s_live import GPU_NODES, PLANTED, UUID2, gpu2_entry, pod

V1V2 = pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
# the fast-path cache and a line the settings' log cannot take land in throwaway tmpfs, never the host's
PRIVATE_RUN = (
    "mount -t tmpfs -o mode=0755 tmpfs /run && mkdir /run/oci-device-hook && mount -t tmpfs tmpfs /var/log"
    ' && exec "$@"'
)


def precreate(host: dict[str, Path], config: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    """``hook precreate`` on ``config`` in a private /run; returns the completed process."""
    args = [sys.executable, "-I", "-m", "hook", "precreate", "--driver-root", str(host["root"])]
    args += ["--config", str(host["settings"]), "--cdi-spec-dir", str(host["no_cdi"])]
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE_RUN, "sh", *args]
    return subprocess.run(
        cmd, input=json.dumps(config).encode(), capture_output=True, timeout=60, env=env
    )


def decided(b: Bundle, host: dict[str, Path], env: dict[str, str] | None = None) -> Bundle:
    """The bundle with its config replaced by what ``hook precreate`` decided (and no hook left)."""
    b.config["hooks"] = {}
    res = precreate(host, b.config, env)
    assert res.returncode == 0, res.stderr
    b.config = json.loads(res.stdout)
    return b.write()


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    """tests/live/test_k8s_live.py's 4x-k8s node (NVML index 2 is /dev/nvidia3)."""
    root = tmp_path / "driver-root"
    make_host_tree(root, "4x-k8s", mknod=True)
    return {"root": root, "cdi": write_cdi(tmp_path / "cdi"), "tmp": tmp_path}


# --- item 1: the pod identity is the engine's own --------------------------------------------------


@V1V2
def test_a_crio_pod_cannot_borrow_a_victims_allocation(
    bundle_dir: Path, node: dict[str, Path], cgroup2: bool
) -> None:
    """The issue's reproduction with runc: a CRI-O pod (its own UID, in namespace ``evil``) sets
    containerd's identity keys to the victim's pod and container, and asks for the victim's GPU by
    env. Before: ``/dev/nvidia3`` and ``nvidiactl`` created and allowed, the line filed under the
    victim's namespace. Now: the pod is its own (containerd's keys are never read in a CRI-O
    config, issue 36), the kubelet allocated it nothing, the env is no request, no GPU."""
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2})
    victim = {
        "io.kubernetes.cri.sandbox-uid": POD_UID,
        "io.kubernetes.cri.container-name": CONTAINER,
        "io.kubernetes.cri.sandbox-namespace": "ml",
    }
    own = {"io.kubernetes.pod.uid": "11111111-2222-3333-4444-555555555555"}
    b = pod(
        bundle_dir,
        node,
        engine="crio",
        namespace="evil",
        cri_env=[f"NVIDIA_VISIBLE_DEVICES={UUID2}"],
        extra_annotations={**victim, **own},
        ckpt=gpu2_entry(resp),
    )
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert {seen[p] for p in GPU_NODES} | {seen["/dev/nvidiactl"]} == {"ENOENT"}, seen
    assert {seen[p] for p in PLANTED} == {"EPERM"}, seen
    record = json.loads((node["tmp"] / "hook.log").read_text().splitlines()[-1])
    assert record["verdict"] == "none" and record["pod"]["namespace"] == "evil", record
    assert record["kubernetes"]["pod_uid"] == own["io.kubernetes.pod.uid"], record
    assert any("ignored: the kubelet allocated no GPU to pod evil/" in w for w in record["warnings"]), record


# --- item 2: -1 is a wildcard ---------------------------------------------------------------------


@V1V2
def test_a_minus_one_wildcard_is_never_handed_back_to_runc(
    bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    """The slice pod with moby's ``c -1:-1 rwm`` (its spelling of ``c *:* rwm``): the decided
    allow-list used to carry it on, and runc opened card 0 of a config the log called narrowed."""
    b = slice_pod(bundle_dir, host, ["/dev/nvidia1", "/dev/nvidia0", "/tmp/n0"])
    b.config["linux"]["resources"]["devices"].append(
        {"allow": True, "type": "c", "major": -1, "minor": -1, "access": "rwm"}
    )
    b = decided(b, host)
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
    rules = b.config["linux"]["resources"]["devices"]
    assert all((r.get("major") or 0) >= 0 and (r.get("minor") or 0) >= 0 for r in rules), rules


# --- item 4: //dev is the host's /dev -------------------------------------------------------------


@V1V2
def test_a_double_slash_host_dev_bind_is_known_from_the_config(
    tmp_path: Path, bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    """``//<driver-root>/dev`` bound at ``//dev``: the decision drops every node change there
    (before, only the adapter's ``st_dev`` check stopped it), the cgroup still narrows."""
    dev = host["root"] / "dev"
    b = host_dev_bundle(bundle_dir, host, Path("/" + str(dev)))
    for m in b.config["mounts"]:
        if m["destination"] == "/dev":
            m["source"], m["destination"] = "/" + str(dev), "//dev"
    b.write()
    before, after = tmp_path / "before", tmp_path / "after"
    setup = fake_host_dev(host, tmp_path)
    res = run_isolated(b, setup=[*setup, listing(dev, before)], after=[listing(dev, after)], cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert after.read_text() == before.read_text()
    seen = parse_probe(res.stdout)
    assert (seen["/dev/nvidia1"], seen["/dev/nvidia0"], seen["/tmp/n0"]) == ("ENXIO", "EPERM", "EPERM")
    record = json.loads(host["log"].read_text().splitlines()[-1])
    assert record["verdict"] == "apply" and record["nodes"]["remove"] == [], record
    assert any("is the host's /dev" in w and "cgroup-only" in w for w in record["warnings"])


# --- item 3: the fast path is a superset of the full decision ---------------------------------------


def _warm(settings_file: Path, tmp: Path) -> str:
    """A shell line that runs the hook once on a plain config under ``settings_file``, so the fast
    path's record for these settings exists in the private /run (as on a node after its first
    container): the next container is answered by the fast path whenever it says "nothing to do"."""
    plain = tmp / "plain.json"
    plain.write_text(json.dumps({"process": {"env": ["PATH=/bin"]}, "linux": {}}))
    hook = f"{sys.executable} -I -m hook precreate --config {settings_file}"
    return f"{hook} <{plain} >/dev/null 2>&1"


def run_warm(b: Bundle, warm: str, *, cgroup2: bool) -> RunResult:
    """``livekit.run_container`` with ``warm`` run first in the same private host view."""
    state = b.path / "runc-state"
    cmd = ["sh", "-c", f'{warm}; exec "$@"', "warm", *runc_command(b, state)]
    try:
        run = private_host(cmd, cgroup2=cgroup2)
        proc = subprocess.run(run, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        return RunResult(proc.returncode, proc.stdout, proc.stderr)
    except subprocess.TimeoutExpired as exc:
        return RunResult(124, _text(exc.stdout), _text(exc.stderr) + "\n[timed out]")
    finally:
        delete = [RUNC, "--root", str(state), "delete", "-f", b.id]
        subprocess.run(private_host(delete, cgroup2=cgroup2), capture_output=True, timeout=30)


WILDCARD = {"allow": True, "type": "c", "major": 195, "access": "rw"}


def _wildcard_pod(bundle_dir: Path, node: dict[str, Path]) -> Bundle:
    """A containerd pod the kubelet allocated nothing, no NVIDIA env, and ``c 195:* rw``."""
    b = pod(bundle_dir, node, ckpt=checkpoint([]))
    b.config["process"]["env"] = ["PATH=/bin"]
    b.config["linux"]["resources"]["devices"].append(WILDCARD)
    return b.write()


@V1V2
def test_a_typed_wildcard_allow_is_decided_not_waved_through(
    bundle_dir: Path, node: dict[str, Path], cgroup2: bool
) -> None:
    """Before: the fast path said "nothing to do", the container opened every GPU, no log line.
    Now the full decision narrows it: eBPF denies every GPU; v1 cannot carve an exact deny out of
    the wildcard, so the hook refuses the container with one line instead of starting it widened."""
    b = _wildcard_pod(bundle_dir, node)
    res = run_warm(b, _warm(node["tmp"] / "settings.yaml", node["tmp"]), cgroup2=cgroup2)
    log = (node["tmp"] / "hook.log").read_text().splitlines()
    assert log, "no log line: the fast path answered"
    if cgroup2:
        assert res.rc == 0, res.stderr
        seen = parse_probe(res.stdout)
        assert {seen[p] for p in PLANTED} == {"EPERM"}, seen
        assert json.loads(log[-1])["verdict"] == "apply"
    else:
        assert res.rc != 0 and "PROBE" not in res.stdout, res.stdout
        assert "rules without effect after writing: deny c 195:" in res.stderr


@V1V2
def test_precreate_decides_a_typed_wildcard_allow(
    bundle_dir: Path, node: dict[str, Path], cgroup2: bool
) -> None:
    """Spec level: ``hook precreate`` used to pass the config through; now runc gets an allow-list
    in which no GPU opens (v1 too: the allow-list needs no deny)."""
    b = _wildcard_pod(bundle_dir, node)
    b.config["hooks"] = {}
    settings_file = node["tmp"] / "settings.yaml"
    pod_json = node["tmp"] / "pod.json"
    pod_json.write_text(json.dumps(b.config))
    hook = f"{sys.executable} -I -m hook precreate --config {settings_file} --driver-root {node['root']}"
    script = f"{_warm(settings_file, node['tmp'])}; {hook} <{pod_json}"
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE_RUN, "sh", "sh", "-c", script],
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) != b.config, "passed through unchanged"
    b.config = json.loads(res.stdout)
    ran = run_container(b.write(), cgroup2=cgroup2)
    assert ran.rc == 0, ran.stderr
    seen = parse_probe(ran.stdout)
    assert {seen[p] for p in PLANTED} == {"EPERM"}, seen
    assert {seen[p] for p in GPU_NODES} == {"ENOENT"}, seen
