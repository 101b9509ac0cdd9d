"""hook.core.report: the contract's decision object and its text rendering."""

from __future__ import annotations

import json
from pathlib import Path

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
