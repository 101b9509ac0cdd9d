"""Issue 15 item 7: a container on a node shaped like an NVIDIA GPU operator node.

The GPU operator's toolkit makes NVIDIA's runtime containerd's default handler; in its legacy
mode that runtime adds ``nvidia-container-runtime-hook`` to hooks.prestart and the device plugin
(envvar strategy) sets ``NVIDIA_VISIBLE_DEVICES`` to the allocated card's UUID, which the kubelet
checkpoint confirms. Here a privileged pod of that shape gets the spec-level decision that the
wrapper (our handler shim in front of NVIDIA's runtime) folds in: narrowed to its one card, and
NVIDIA's hook left in place, in its place (docs/operators.md, "Coexistence with NVIDIA").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundles import POD_ANNOTATIONS, SLICE_UUID, checkpoint, checkpoint_entry
from tests.test_decide import GPU, _priv, decide_for, narrowed_to

NVIDIA_HOOK = {
    "path": "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook",
    "args": ["nvidia-container-runtime-hook", "prestart"],
}


def test_privileged_pod_on_a_gpu_operator_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _priv([f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}"], annotations=POD_ANNOTATIONS)
    cfg["hooks"] = {"prestart": [NVIDIA_HOOK]}  # what NVIDIA's runtime (legacy mode) adds
    out = tmp_path / "decided.json"
    ck = checkpoint([checkpoint_entry("nvidia.com/gpu", [SLICE_UUID])])
    rc, rep, _ = decide_for(tmp_path, cfg, capsys, ckpt=ck)
    assert rc == 0
    narrowed_to(rep, {GPU[1]})
    assert "/dev/nvidia1" not in rep["denied"] and "/dev/nvidia0" in rep["denied"]
    from tests.bundles import node_args, settings_file, simulate

    bundle = tmp_path / "bundle"
    args = [
        *node_args(tmp_path / "root"),
        "--config",
        str(settings_file(tmp_path, kubelet_checkpoint=str(tmp_path / "ckpt"))),
    ]
    rc, _, _ = simulate(bundle, *args, "--output-config", str(out), capsys=capsys)
    assert rc == 0
    decided = json.loads(out.read_text())
    assert decided["hooks"]["prestart"] == [NVIDIA_HOOK]  # NVIDIA's hook stays, first and unchanged
    paths = {d["path"] for d in decided["linux"]["devices"]}
    assert "/dev/nvidia1" in paths and not {"/dev/nvidia0", "/dev/nvidia2"} & paths
    rules = decided["linux"]["resources"]["devices"]
    assert rules[0]["allow"] is False and rules[0]["type"] == "a"  # an allow-list: deny all, then allow
    assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"} in rules
    assert not any(r["allow"] and r.get("type") in (None, "a") for r in rules)
