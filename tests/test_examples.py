"""The committed examples give their documented verdicts through the real ``hook --bundle``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.bundles import EXAMPLES, MIG_UUID, REPO, SLICE_UUID, hook_cli, node_args

EXPECTED = {
    "slice-privileged": ("apply", f"narrowed a privileged container to its plugin allocation {SLICE_UUID}"),
    "mig-privileged": (
        "apply",
        f"narrowed a privileged container to its plugin allocation nvidia.com/gpu={MIG_UUID}",
    ),
    "device-plugin-seed001": ("apply", "allowed 1 and created 1 node(s) it requested"),
    "cpu": ("none", "no device requested"),
    "k8s-image-env": (
        "none",
        "no device requested: NVIDIA_VISIBLE_DEVICES=all is no request here (see warnings)",
    ),
    "k8s-allocated": ("apply", "allowed 4 and created 4 node(s) it requested"),
    "privileged-no-allocation": (
        "none",
        "privileged container without a plugin allocation: all devices on purpose, left alone",
    ),
    "dra-claim-privileged": (
        "apply",
        "narrowed a privileged container to its DRA claim ml/gpu-claim "
        "(dra-claim:9d2f4c1a-6b3e-4e8f-a0c7-5d1b2e3f4a6b): "
        "k8s.gpu.nvidia.com/claim=9d2f4c1a-6b3e-4e8f-a0c7-5d1b2e3f4a6b-gpu-2:",
    ),
}
CHECKPOINT = "kubelet_internal_checkpoint"
# The DRA bundle carries its node's claim spec and the kubelet's DRA state, the k8s bundles their
# node's device-plugin checkpoint (README).
EXTRA = {
    **{
        name: ["--kubelet-checkpoint", str(EXAMPLES / name / "kubelet/device-plugins" / CHECKPOINT)]
        for name in ("k8s-image-env", "k8s-allocated")
    },
    "dra-claim-privileged": [
        "--cdi-spec-dir",
        str(EXAMPLES / "dra-claim-privileged" / "cdi"),
        "--kubelet-dra-state",
        str(EXAMPLES / "dra-claim-privileged" / "kubelet" / "dra_manager_state"),
    ]
}


def run_example(name: str, tmp: Path, fmt: str, *extra: str) -> tuple[int, str, str]:
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    more = EXTRA.get(name, [])
    res = hook_cli("--bundle", str(EXAMPLES / name), *node_args(root), *more, "--format", fmt, *extra)
    return res.returncode, res.stdout, res.stderr


def test_every_example_is_covered() -> None:
    assert {p.parent.name for p in EXAMPLES.glob("*/config.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_example_verdict_json(name: str, tmp_path: Path) -> None:
    rc, out, err = run_example(name, tmp_path, "json")
    assert (rc, err) == (0, "")
    report = json.loads(out)
    verdict, reason = EXPECTED[name]
    assert report["verdict"] == verdict
    assert report["reason"].startswith(reason)
    assert report["container"]["id"] == name
    assert set(report) >= {
        "verdict",
        "reason",
        "container",
        "requests",
        "plugin_allocation",
        "cgroup",
        "nodes",
        "warnings",
    }


def test_seed001_example_exactly_the_monitor_cap(tmp_path: Path) -> None:
    report = json.loads(run_example("device-plugin-seed001", tmp_path, "json")[1])
    assert report["cgroup"] == [{"access": "r", "allow": True, "major": 237, "minor": 2, "type": "c"}]
    assert report["nodes"] == {
        "create": [
            {
                "fileMode": 292,
                "gid": 0,
                "major": 237,
                "minor": 2,
                "path": "/dev/nvidia-caps/nvidia-cap2",
                "type": "c",
                "uid": 0,
            }
        ],
        "remove": [],
    }


def test_slice_example_keeps_only_nvidia1(tmp_path: Path) -> None:
    report = json.loads(run_example("slice-privileged", tmp_path, "json")[1])
    gpus = {f"/dev/nvidia{i}" for i in range(8)}
    assert gpus - set(report["nodes"]["remove"]) == {"/dev/nvidia1"}
    denied = {(r["major"], r["minor"]) for r in report["cgroup"] if not r["allow"]}
    assert {(195, i) for i in range(8)} - denied == {(195, 1)}
    assert all(not r["allow"] for r in report["cgroup"])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_example_text_renders(name: str, tmp_path: Path) -> None:
    rc, out, err = run_example(name, tmp_path, "text")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert re.match(rf"^container {re.escape(name)}( \[.*\])?$", lines[0])
    assert lines[1] == f"verdict:  {EXPECTED[name][0]}"
    assert lines[2].startswith(f"why:      {EXPECTED[name][1]}")


def test_output_config_folds_the_slice_decision(tmp_path: Path) -> None:
    out = tmp_path / "config.out.json"
    rc, _, err = run_example("slice-privileged", tmp_path, "json", "--output-config", str(out))
    assert (rc, err) == (0, "")
    folded = json.loads(out.read_text())
    paths = [d["path"] for d in folded["linux"]["devices"]]
    assert [p for p in paths if re.match(r"^/dev/nvidia[0-9]+$", p)] == ["/dev/nvidia1"]
    rules = folded["linux"]["resources"]["devices"]  # what precreate hands the runtime: an allow-list
    assert rules[0] == {"allow": False, "type": "a", "major": None, "minor": None, "access": "rwm"}
    assert all(r["allow"] for r in rules[1:])
    gpus = {(r["major"], r["minor"]) for r in rules if r["type"] == "c" and r["major"] == 195}
    assert gpus == {(195, 1), (195, 255)}  # its card and nvidiactl


def test_k8s_pair_image_env_alone_is_no_request_but_the_allocation_is(tmp_path: Path) -> None:
    """The same CUDA image (env ``all``): no GPU for the pod that asked for none, GPU 2 alone (and
    the control nodes) for the pod the plugin allocated it to."""
    _, out, _ = run_example("k8s-image-env", tmp_path, "json")
    image = json.loads(out)
    assert (image["requests"], image["cgroup"]) == ([], [])
    assert image["kubernetes"]["namespace"] == "ml" and image["kubernetes"]["allocation"] == []
    _, out, _ = run_example("k8s-allocated", tmp_path, "json")
    allocated = json.loads(out)
    gpus = [r for r in allocated["cgroup"] if r["major"] == 195 and r["minor"] < 255]
    assert gpus == [{"allow": True, "type": "c", "major": 195, "minor": 2, "access": "rw"}]
    assert allocated["evidence"] == ["kubelet-checkpoint", "mount"]
    assert allocated["kubernetes"]["checkpoint_state"] == "read"


def _readme_command(name: str) -> list[str]:
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if f"| `{name}` |" in line)
    command = next(c for c in re.findall(r"`([^`]+)`", row) if c.startswith("hook --bundle"))
    return shlex.split(command)[1:]


@pytest.mark.parametrize("name", ["k8s-image-env", "k8s-allocated"])
def test_the_k8s_examples_say_one_thing_with_and_without_their_checkpoint(name: str, tmp_path: Path) -> None:
    """Issue 37 item 7: the examples depended on the simulating machine's /var/lib/kubelet, and
    their text said "allocated nothing" beside "counted without the kubelet's word". With the
    checkpoint they ship (the README's command) the allocation is read; without one it is unknown,
    and nothing says "allocated nothing"."""
    res = hook_cli(*_readme_command(name), "--driver-root", str(tmp_path), cwd=REPO)
    assert (res.returncode, res.stderr) == (0, "")
    assert "checkpoint examples/" in res.stdout and " read, allocated " in res.stdout
    assert "without the kubelet's word" not in res.stdout and "checkpoint is absent" not in res.stdout
    absent = tmp_path / "no-checkpoint"
    rc, out, err = run_example(name, tmp_path, "text", "--kubelet-checkpoint", str(absent))
    assert (rc, err) == (0, "")
    assert f"checkpoint {absent} absent, allocation unknown (checkpoint absent)" in out
    assert "allocated nothing" not in out and "allocated no GPU" not in out
    assert "--kubelet-checkpoint FILE reads one" in out
    if name == "k8s-allocated":
        assert "counted without the kubelet's word" in out


def test_dra_example_keeps_only_its_claims_gpu(tmp_path: Path) -> None:
    """Issue 20: the claim's GPU 2 and the control nodes stay; every other card and MIG cap goes."""
    report = json.loads(run_example("dra-claim-privileged", tmp_path, "json")[1])
    gpus = {f"/dev/nvidia{i}" for i in range(8)}
    assert gpus - set(report["nodes"]["remove"]) == {"/dev/nvidia2"}
    denied = {(r["major"], r["minor"]) for r in report["cgroup"] if not r["allow"]}
    assert {(195, i) for i in range(8)} - denied == {(195, 2)}
    assert {(237, m) for m in (1, 2, 12, 13, 21, 22)} <= denied
    dra = report["kubernetes"]["dra"]
    assert (dra["state"], dra["decided"]) == ("read", ["ml/gpu-claim (9d2f4c1a-6b3e-4e8f-a0c7-5d1b2e3f4a6b)"])
    absent = str(tmp_path / "none")  # the last --kubelet-dra-state wins
    without = run_example("dra-claim-privileged", tmp_path, "json", "--kubelet-dra-state", absent)
    assert json.loads(without[1])["verdict"] == "none"  # the measurement: no DRA evidence


def _readme_dra_command() -> list[str]:
    """The DRA example's command as the README gives it (backticks), run from the repo root."""
    return _readme_command("dra-claim-privileged")


def test_the_readmes_dra_command_is_complete(tmp_path: Path) -> None:
    """Issue 29: the README's command alone narrows the DRA pod to its claim (no flag to add)."""
    args = _readme_dra_command()
    res = hook_cli(*args, "--driver-root", str(tmp_path), "--format", "json", cwd=REPO)
    assert (res.returncode, res.stderr) == (0, "")
    report = json.loads(res.stdout)
    assert report["verdict"] == "apply" and report["reason"].startswith(EXPECTED["dra-claim-privileged"][1])


def test_without_the_dra_state_the_text_says_it_was_absent_and_what_that_meant(tmp_path: Path) -> None:
    """Issue 29: "left alone" never stands without the reason: the kubelet's DRA state was absent."""
    absent = tmp_path / "no-dra-state"
    rc, out, err = run_example("dra-claim-privileged", tmp_path, "text", "--kubelet-dra-state", str(absent))
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[1] == "verdict:  none" and "left alone" in lines[2]
    assert f"kubernetes DRA: {absent} absent; claims unknown" in lines
    assert any(
        line.startswith(
            "evidence absent: the kubelet's DRA state is absent: no DRA claim of this pod is known"
        )
        and "--kubelet-dra-state" in line
        for line in lines
    )
    meant = "evidence absent: so nothing the kubelet wrote bounds this privileged container: "
    assert meant + "it keeps every device" in lines


def test_dra_decisions_speak_of_claims(tmp_path: Path) -> None:
    rc, out, _ = run_example("dra-claim-privileged", tmp_path, "text")
    assert rc == 0
    assert "why:      narrowed a privileged container to its DRA claim ml/gpu-claim (dra-claim:" in out
    asked = out.splitlines()[out.splitlines().index("asked for:") + 1]
    assert asked.endswith("(DRA claim ml/gpu-claim)")  # not "(plugin)"


def test_seed001_asked_for_does_not_read_as_eight_gpus(tmp_path: Path) -> None:
    """Issue 29: the plugin pod's 8 cards are nodes the engine already put in linux.devices, not an
    allocation of 8 GPUs: "asked for" lists only its env asks; the nodes are listed as given."""
    rc, out, _ = run_example("device-plugin-seed001", tmp_path, "text")
    assert rc == 0
    lines = out.splitlines()
    asked = lines[
        lines.index("asked for:") + 1 : next(i for i, x in enumerate(lines) if x.startswith("given"))
    ]
    assert [line.split()[0] for line in asked] == ["all", "all"]
    assert not any("/dev/nvidia" in line for line in asked)
    given = next(x for x in lines if x.startswith("given already:"))
    assert given.startswith("given already: 12 node(s) in linux.devices with their own allow rules")
    assert "not GPUs the kubelet allocated" in given


def test_the_text_lists_what_the_slice_pod_keeps(tmp_path: Path) -> None:
    rc, out, _ = run_example("slice-privileged", tmp_path, "text")
    assert rc == 0
    lines = out.splitlines()
    keeps = [line.split() for line in lines[lines.index("keeps:") + 1 :] if line.startswith("  ")]
    nodes = [k[0] for k in keeps if k[0].startswith("/dev/")]
    assert nodes == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    # its allow-all still opens every device of no class: keeps says so (issue 36 item 5)
    assert [k for k in keeps if not k[0].startswith("/dev/")] == [
        ["(every", "other", "device)", "b", "*:*", "rwm"],
        ["(every", "other", "device)", "c", "*:*", "rwm"],
    ]
