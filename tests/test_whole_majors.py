"""Issue 36 item 5: no whole NVIDIA major stays open for a class the container was not given.

The ``4x-k8s`` node's ``/proc/devices`` names ``drm`` (226), ``nvidia-caps-imex-channels`` (234)
and ``nvidia-nvlink`` (236), and its ``/dev`` has no node of those majors. A narrowed privileged
pod used to keep ``c 226:*``, ``c 234:*`` and ``c 236:*`` through its allow-all: privileged
containers hold CAP_MKNOD, so it could make such a node and open it. Every NVIDIA-named major is
now narrowed to exact minors, and ``keeps`` lists every allow rule that still opens a device.
Expectations come from the tree's spec (tests/hosttree.py), never from the decision.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hook.core.rules import Access, DeviceType, Rule, evaluate
from tests.bundles import ALLOW_ALL, PRIVATE_RUN, _hook_exe, alloc_resp, checkpoint, settings_file
from tests.hosttree import DRM_MAJOR, IMEX_MAJOR, NVLINK_MAJOR, TOPOLOGIES, make_host_tree
from tests.k8s_shapes import GPUS, control_devs, gpu_dev, write_cdi
from tests.test_k8s import gpu_entry, pod_config, run

SPEC = TOPOLOGIES["4x-k8s"]
UUID2 = GPUS[2].uuid
NO_NODE = 77  # a minor the tree has no node of, on any major
# every NVIDIA-named major of the tree's /proc/devices, and drm (NVIDIA GPUs are present)
CLASS_MAJORS = {SPEC.nvidia_major, SPEC.uvm_major, SPEC.caps_major, IMEX_MAJOR, NVLINK_MAJOR, DRM_MAJOR}
GIVEN = {SPEC.nvidia_major, SPEC.uvm_major}  # every container keeps nvidiactl and nvidia-uvm(-tools)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("k8s-node")
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    return {"root": base / "root", "cdi": write_cdi(base / "cdi")}


def _rule(r: dict[str, Any]) -> Rule:
    return Rule(
        allow=r["allow"],
        type=DeviceType(r.get("type", "a")),
        major=r.get("major"),
        minor=r.get("minor"),
        access=Access.parse(r["access"]),
    )


def opens(cfg: dict[str, Any], rep: dict[str, Any], major: int, minor: int) -> bool:
    """Whether the container's rules once the plan is applied let it read or write ``c major:minor``."""
    rules = [_rule(r) for r in [*cfg["linux"]["resources"]["devices"], *rep["cgroup"]]]
    return any(evaluate(rules, DeviceType.CHAR, major, minor, a) for a in (Access.R, Access.W))


def privileged_pod() -> dict[str, Any]:
    """A privileged pod the kubelet allocated GPU 2 (NVML index 2), every GPU in linux.devices."""
    cfg = pod_config(rules=ALLOW_ALL, devices=[*(gpu_dev(i) for i in GPUS), *control_devs()])
    cfg["process"]["env"].append(f"NVIDIA_VISIBLE_DEVICES={UUID2}")
    return cfg


def allocation() -> bytes:
    return checkpoint([gpu_entry(alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2}))])


def test_no_class_major_the_pod_was_not_given_stays_open(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = privileged_pod()
    rep = run(tmp_path, node, cfg, capsys, ckpt=allocation())
    assert rep["verdict"] == "apply", rep["reason"]
    still_open = {m for m in CLASS_MAJORS if opens(cfg, rep, m, NO_NODE)}
    assert still_open <= GIVEN, rep["cgroup"]  # no DRM, IMEX channel, NVLink or cap node it could make
    assert opens(cfg, rep, SPEC.nvidia_major, GPUS[2].minor) and opens(cfg, rep, SPEC.nvidia_major, 255)
    assert not any(opens(cfg, rep, SPEC.nvidia_major, g.minor) for i, g in GPUS.items() if i != 2)
    assert opens(cfg, rep, SPEC.uvm_major, 0) and opens(cfg, rep, SPEC.uvm_major, 1)


def test_keeps_lists_every_allow_rule_that_still_opens_a_device(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """A major whose rules still open minors no node names is in ``keeps`` (minor null, path "*")."""
    cfg = privileged_pod()
    rep = run(tmp_path, node, cfg, capsys, ckpt=allocation())
    wildcards = {e["major"] for e in rep["keeps"] if e["minor"] is None and e["major"] is not None}
    assert wildcards == {m for m in CLASS_MAJORS if opens(cfg, rep, m, NO_NODE)}, rep["keeps"]
    assert all(e["path"] == "*" and e["access"] == "rwm" for e in rep["keeps"] if e["minor"] is None)
    # the allow-all still opens every device of no class, char and block: one entry each
    assert {e["type"] for e in rep["keeps"] if e["major"] is None} == {"c", "b"}
    nodes = {(e["major"], e["minor"]) for e in rep["keeps"] if e["minor"] is not None}  # its /dev's
    assert nodes == {(SPEC.nvidia_major, GPUS[2].minor), (SPEC.nvidia_major, 255), (SPEC.uvm_major, 0)}


def test_the_text_report_shows_an_open_major(tmp_path: Path, node: dict[str, Path], capsys: Any) -> None:
    from tests.bundles import simulate, write_bundle

    ck = tmp_path / "ck"
    ck.write_bytes(allocation())
    args = ["--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"])]
    args += ["--config", str(settings_file(tmp_path, kubelet_checkpoint=str(ck)))]
    rc, text, err = simulate(write_bundle(tmp_path / "b", privileged_pod()), *args, capsys=capsys, fmt="text")
    assert rc == 0, err
    lines = text.splitlines()
    keeps = lines[lines.index("keeps:") + 1 :]
    assert f"  {'(every minor no node names)':<44} {f'c {SPEC.nvidia_major}:*':<12} rwm" in keeps, text
    assert not any(f"c {m}:" in line for line in keeps for m in (IMEX_MAJOR, NVLINK_MAJOR, DRM_MAJOR)), text


def test_a_privileged_pod_with_no_allocation_is_still_left_alone(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """DinD and tooling: nothing narrows a privileged pod the kubelet allocated nothing."""
    rep = run(tmp_path, node, privileged_pod(), capsys)
    assert rep["verdict"] == "none" and rep["cgroup"] == []


def test_spec_level_hands_the_runtime_no_class_major_the_pod_was_not_given(
    tmp_path: Path, node: dict[str, Path]
) -> None:
    """``hook precreate``'s allow-list: no rule opens an IMEX, NVLink, DRM or cap minor."""
    ck = tmp_path / "ck"
    ck.write_bytes(allocation())
    args = ["precreate", "--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"])]
    args += ["--config", str(settings_file(tmp_path, kubelet_checkpoint=str(ck)))]
    cfg = privileged_pod()
    res = subprocess.run(
        [*PRIVATE_RUN, *_hook_exe(), *args], input=json.dumps(cfg).encode(), capture_output=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    rules = [_rule(r) for r in json.loads(res.stdout)["linux"]["resources"]["devices"]]
    for major in CLASS_MAJORS - GIVEN:
        assert not any(evaluate(rules, DeviceType.CHAR, major, NO_NODE, a) for a in (Access.R, Access.W)), (
            major
        )
    assert evaluate(rules, DeviceType.CHAR, SPEC.nvidia_major, GPUS[2].minor, Access.R)


def test_an_unprivileged_wildcard_allow_of_a_class_it_was_not_given_is_closed(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """An engine's ``c 234:* rwm`` (a device-cgroup rule) in an over-granted unprivileged pod: the
    IMEX major is denied whole (``rw``), and every exact deny stays (v1 keeps an exact allow past a
    wildcard deny in a default-deny cgroup)."""
    from tests.bundles import DEFAULT_RULES
    from tests.k8s_shapes import allow

    devs = [gpu_dev(0), gpu_dev(2), *control_devs()]
    rules = [*DEFAULT_RULES, *(allow(d, "rw") for d in devs)]
    rules.append({"allow": True, "type": "c", "major": IMEX_MAJOR, "access": "rwm"})
    cfg = pod_config(rules=rules, devices=devs)
    rep = run(tmp_path, node, cfg, capsys, ckpt=allocation())
    assert rep["verdict"] == "apply", rep["reason"]
    assert {"allow": False, "type": "c", "major": IMEX_MAJOR, "minor": None, "access": "rw"} in rep["cgroup"]
    assert not opens(cfg, rep, IMEX_MAJOR, NO_NODE)
    assert ("c", SPEC.nvidia_major, GPUS[0].minor) in {
        (r["type"], r["major"], r["minor"]) for r in rep["cgroup"] if not r["allow"]
    }


def test_a_gpu_whose_node_the_host_has_not_made_is_denied_too(tmp_path: Path, capsys: Any) -> None:
    """nvidia-modprobe makes ``/dev/nvidia<N>`` on demand: a GPU the driver lists without a host
    node was left open on the kept ``nvidia`` major, and a privileged pod could make its node."""
    base = tmp_path / "node"
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    absent = GPUS[0].minor  # NVML index 0 is /dev/nvidia2 on this node
    (base / "root" / f"dev/nvidia{absent}").unlink()
    node = {"root": base / "root", "cdi": write_cdi(base / "cdi")}
    cfg = pod_config(rules=ALLOW_ALL, devices=[*(gpu_dev(i) for i in GPUS if i != 0), *control_devs()])
    rep = run(tmp_path, node, cfg, capsys, ckpt=allocation())
    assert rep["verdict"] == "apply", rep["reason"]
    assert not opens(cfg, rep, SPEC.nvidia_major, absent), rep["cgroup"]
    assert f"/dev/nvidia{absent}" in rep["denied"]
    assert opens(cfg, rep, SPEC.nvidia_major, GPUS[2].minor)
