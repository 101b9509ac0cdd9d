"""The harness proven end to end: a prestart hook calling apply_plan changes what a real runc
container sees (EPERM / ENXIO / ENOENT on fake NVIDIA nodes), on the v1 host and under cgroup2."""

from __future__ import annotations

import json
from pathlib import Path

from livekit import build_bundle, char_device, hook, parse_probe, probe_args, python_hook, run_container

NODES = [char_device("/dev/nvidia0", 195, 0), char_device("/dev/nvidia1", 195, 1)]
PROBED = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-caps/nvidia-cap3"]
ALLOW_ALL = [{"allow": True, "access": "rwm"}]

APPLY = """
import os
from hook.adapters.apply.transaction import apply_plan
from hook.core.plan import Node, Plan, Verdict
from hook.core.rules import Access, DeviceType, Rule
deny1 = Rule(allow=False, type=DeviceType.CHAR, major=195, minor=1, access=Access.RWM)
rules = (deny1,) * {n_rules}
cap2 = Node(path="/dev/nvidia-caps/nvidia-cap2", type="c", major=237, minor=2, file_mode=0o444)
plan = Plan(verdict=Verdict.APPLY, reason="live", rules=rules, create=(cap2,))
rootfs = os.path.join(state["bundle"], "rootfs")
info = apply_plan(plan, state["pid"], rootfs=rootfs)
record = {{"version": info.cgroup_version, "path": info.cgroup_path, "created": list(info.created)}}
with open(os.path.join(state["bundle"], "applied.json"), "w") as out:
    json.dump(record, out)
"""


def test_hook_denies_and_creates_on_cgroup_v1(bundle_dir: Path) -> None:
    script = python_hook(bundle_dir.parent / "apply-hook", APPLY.format(n_rules=1))
    bundle = build_bundle(
        bundle_dir,
        probe_args(PROBED),
        hooks={"prestart": [hook(script)]},
        devices=NODES,
        cgroup_devices=ALLOW_ALL,
    )
    result = run_container(bundle)
    assert result.rc == 0, result.stderr
    assert parse_probe(result.stdout) == {
        "/dev/nvidia0": "ENXIO",
        "/dev/nvidia1": "EPERM",
        "/dev/nvidia-caps/nvidia-cap2": "ENXIO",
        "/dev/nvidia-caps/nvidia-cap3": "ENOENT",
    }
    assert list((bundle.rootfs / "dev").iterdir()) == []  # nodes went to runc's tmpfs, not the image
    applied = json.loads((bundle.path / "applied.json").read_text())
    assert applied["version"] == 1 and applied["path"].endswith(bundle.cgroups_path)


def test_without_hook_everything_is_reachable(bundle_dir: Path) -> None:
    bundle = build_bundle(bundle_dir, probe_args(PROBED), devices=NODES, cgroup_devices=ALLOW_ALL)
    result = run_container(bundle)
    assert result.rc == 0, result.stderr
    assert parse_probe(result.stdout)["/dev/nvidia1"] == "ENXIO"
    assert parse_probe(result.stdout)["/dev/nvidia-caps/nvidia-cap2"] == "ENOENT"


def test_failing_hook_stops_the_container(bundle_dir: Path) -> None:
    script = python_hook(bundle_dir.parent / "fail-hook", "raise RuntimeError('no')")
    bundle = build_bundle(bundle_dir, ["/bin/echo", "STARTED"], hooks={"prestart": [hook(script)]})
    result = run_container(bundle)
    assert result.rc != 0 and "STARTED" not in result.stdout
    assert "hook failed: no" in result.stderr


def test_nodes_under_cgroup2_runner(bundle_dir: Path) -> None:
    script = python_hook(bundle_dir.parent / "apply-hook", APPLY.format(n_rules=0))
    bundle = build_bundle(
        bundle_dir,
        probe_args(PROBED),
        hooks={"prestart": [hook(script)]},
        devices=NODES,
        cgroup_devices=ALLOW_ALL,
    )
    result = run_container(bundle, cgroup2=True)
    assert result.rc == 0, result.stderr
    assert parse_probe(result.stdout) == {
        "/dev/nvidia0": "ENXIO",
        "/dev/nvidia1": "ENXIO",
        "/dev/nvidia-caps/nvidia-cap2": "ENXIO",
        "/dev/nvidia-caps/nvidia-cap3": "ENOENT",
    }
    applied = json.loads((bundle.path / "applied.json").read_text())
    assert applied["version"] == 2 and applied["path"] == "/sys/fs/cgroup" + bundle.cgroups_path
