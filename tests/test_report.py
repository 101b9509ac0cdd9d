"""hook.core.report: the contract's decision object and its text rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hook.core.decide import decide
from hook.core.plan import Node, Plan, Verdict
from hook.core.report import build_report, render_json, render_text
from hook.core.rules import Access, DeviceType, Rule
from hook.core.settings import Settings
from hook.routes.gather import Options, load_inputs, state_from_bundle
from tests.bundles import NODE_CDI, NODE_INVENTORY, config, gen, write_bundle


def inputs_for(tmp: Path, cfg: dict[str, object]):  # type: ignore[no-untyped-def]
    bundle = write_bundle(tmp / "ctr-7", cfg)
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    opts = Options(
        driver_root=root,
        spec_dirs=(NODE_CDI,),
        inventory_file=NODE_INVENTORY,
        use_cache=False,
        settings=Settings(kubelet_checkpoint=str(tmp / "none")),
    )
    return load_inputs(state_from_bundle(bundle), opts)


def test_contract_keys_and_values(tmp_path: Path) -> None:
    inputs = inputs_for(tmp_path, gen.bundles()["device-plugin-seed001"])
    report = build_report(inputs, decide(inputs))
    assert list(report) == [
        "verdict",
        "reason",
        "container",
        "requests",
        "plugin_allocation",
        "evidence",
        "cgroup",
        "nodes",
        "warnings",
        "denied",
        "kubernetes",
        "keeps",
    ]
    assert report["container"] == {"id": "ctr-7", "privileged": False, "sys_admin": True, "widened": False}
    assert report["requests"][0] == {
        "source": "env:NVIDIA_VISIBLE_DEVICES",
        "value": "all",
        "kind": "nvidia",
        "from_plugin": False,
    }
    assert report["plugin_allocation"] is True
    assert report["cgroup"] == [{"allow": True, "type": "c", "major": 237, "minor": 2, "access": "r"}]


def test_render_json_is_stable_and_sorted(tmp_path: Path) -> None:
    inputs = inputs_for(tmp_path, gen.bundles()["slice-privileged"])
    a = render_json(build_report(inputs, decide(inputs)))
    b = render_json(build_report(inputs, decide(inputs)))
    assert a == b
    assert a.endswith("}\n")
    assert list(json.loads(a)) == sorted(json.loads(a))


def test_render_text_every_section(tmp_path: Path) -> None:
    inputs = inputs_for(tmp_path, config(["NVIDIA_VISIBLE_DEVICES=2"]))
    plan = Plan(
        verdict=Verdict.APPLY,
        reason="because",
        rules=(
            Rule(allow=False, type=DeviceType.CHAR, major=195, minor=None, access=Access.RWM),
            Rule(allow=True, type=DeviceType.CHAR, major=237, minor=2, access=Access.R),
        ),
        create=(Node(path="/dev/nvidia-caps/nvidia-cap2", type="c", major=237, minor=2, file_mode=0o444),),
        remove=("/dev/nvidia3",),
        warnings=("careful",),
    )
    text = render_text(build_report(inputs, plan))
    assert text.splitlines() == [
        "container ctr-7",
        "verdict:  apply",
        "why:      because",
        "asked for:",
        f"  {'2':<44} from env:NVIDIA_VISIBLE_DEVICES (not a plugin)",
        "device cgroup rules to add:",
        "  deny  c 195:* rwm",
        "  allow c 237:2 r",
        "create    /dev/nvidia-caps/nvidia-cap2 (c 237:2 mode 444)",
        "remove    /dev/nvidia3",
        "keeps:",
        f"  {'/dev/nvidia-caps/nvidia-cap2':<44} {'c 237:2':<12} r",
        "warning:  careful",
    ]


@pytest.mark.parametrize("name", ["cpu", "privileged-no-allocation"])
def test_render_text_none_is_short(name: str, tmp_path: Path) -> None:
    inputs = inputs_for(tmp_path, gen.bundles()[name])
    lines = render_text(build_report(inputs, decide(inputs))).splitlines()
    assert len(lines) == (4 if name == "privileged-no-allocation" else 3)
    assert lines[1] == "verdict:  none"
    if name == "privileged-no-allocation":  # what it keeps: one line, not every node
        assert lines[3] == "keeps:    every device (its rules allow all, and nothing was narrowed)"


def _k8s_report(checkpoint_state: str, dra_state: str, *, problem: str = "", privileged: bool = True) -> Any:
    kubernetes = {
        "namespace": "ml", "pod": "p", "pod_uid": "u", "container": "c", "checkpoint": "/ck",
        "checkpoint_state": checkpoint_state, "allocation": [], "trusted_namespace": False,
        "dra": {"state_file": "/dra", "state": dra_state, "claims": [], "decided": []},
        "identity_problem": problem,
    }  # fmt: skip
    return {
        "verdict": "none", "reason": "r", "requests": [], "evidence": [], "cgroup": [], "warnings": [],
        "container": {"id": "x", "privileged": privileged, "sys_admin": True, "widened": privileged},
        "nodes": {"create": [], "remove": []}, "keeps": [], "kubernetes": kubernetes,
    }  # fmt: skip


def test_the_text_says_which_kubelet_evidence_was_absent_and_what_that_meant() -> None:
    lines = render_text(_k8s_report("absent", "absent")).splitlines()
    absent = [line for line in lines if line.startswith("evidence absent:")]
    assert absent == [
        "evidence absent: the device-plugin checkpoint is absent: no device-plugin allocation of this pod "
        "is known, so the checkpoint bounds none of its devices, and its env counts only if a plugin "
        "corroborates it (simulation: --kubelet-checkpoint FILE reads one)",
        "evidence absent: the kubelet's DRA state is absent: no DRA claim of this pod is known, so no claim "
        "narrows it (simulation: --kubelet-dra-state FILE reads a node's state)",
        "evidence absent: so nothing the kubelet wrote bounds this privileged container: "
        "it keeps every device",
    ]
    assert "kubernetes DRA: /dra absent; claims unknown" in lines
    # issue 37 item 7: never "allocated nothing" where the kubelet's word is missing
    unknown = "allocation unknown (checkpoint absent)"
    assert f"kubernetes: pod ml/p container c; checkpoint /ck absent, {unknown}" in lines
    for state in ("unreadable", "corrupt"):
        text = render_text(_k8s_report(state, "absent"))
        assert f"allocation unknown (checkpoint {state})" in text and "allocated nothing" not in text
    assert "checkpoint /ck read, allocated nothing" in render_text(_k8s_report("read", "absent"))


def test_read_evidence_and_a_sandbox_have_no_absent_line() -> None:
    for state in ("read", "sandbox"):
        lines = render_text(_k8s_report(state, "read", privileged=False)).splitlines()
        assert not [line for line in lines if line.startswith("evidence absent:")], state


def test_an_untrusted_identity_says_the_files_were_not_consulted() -> None:
    lines = render_text(
        _k8s_report("untrusted", "absent", problem="two engines", privileged=False)
    ).splitlines()
    assert (
        "evidence absent: the kubelet's files were not consulted: no allocation of this pod counts" in lines
    )
