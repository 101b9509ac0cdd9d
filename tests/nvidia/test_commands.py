"""``hook inventory`` (hook.tools.inventorycmd)."""

from __future__ import annotations

import json

import pytest

from hook.core.errors import UsageError
from hook.tools.inventorycmd import cmd_inventory


def test_json_is_the_snapshot(fake_host, nvml_for) -> None:
    root, spec = fake_host("8x-mig")
    out, code = cmd_inventory(root, None, None, "json", nvml_module=nvml_for("8x-mig"))
    data = json.loads(out)
    assert code == 0 and data["version"] == 1 and data["majors"]["caps"] == 237
    assert [m["uuid"] for m in data["migs"]] == [m.uuid for m in spec.migs]


def test_text_lists_gpus_and_migs(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    out, code = cmd_inventory(root, None, None, "text", nvml_module=nvml_for("8x-mig"))
    lines = out.splitlines()
    assert code == 0 and lines[0] == "driver 550.54.15 (source: proc+nvml)"
    assert "nvidia-caps 237" in lines[1] and "nvidia-uvm 511" in lines[1]
    assert "config nvidia-cap1 (0400)" in lines[2]
    assert lines[3].startswith("GPU 0: /dev/nvidia0 0000:18:00.0 GPU-3f2b9c41") and lines[3].endswith(
        "MIG enabled"
    )
    assert lines[4].startswith("  MIG 0:0: gi 1 ci 0 3g.40gb MIG-07ad8e7c")
    assert lines[4].endswith("caps nvidia-cap12 (0444), nvidia-cap13 (0444)")
    assert sum(line.startswith("GPU ") for line in lines) == 8


def test_text_without_nvml_marks_unknown_uuid(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    out, _ = cmd_inventory(root, None, None, "text", nvml_module=nvml_for("8x-mig", fail_init=12))
    assert "(uuid unknown)" in out and "warning: NVML: nvmlInit:" in out


def test_bad_format() -> None:
    with pytest.raises(UsageError) as info:
        cmd_inventory(None, None, None, "yaml")  # type: ignore[arg-type]
    assert (info.value.file, info.value.field) == ("--format", "yaml")


def test_text_of_a_host_without_gpus_says_so() -> None:
    from hook.sources.nvidia.model import Inventory
    from hook.tools.inventorycmd import render_text

    assert render_text(Inventory(driver_version="550.54.15")).splitlines()[-1] == "no NVIDIA GPUs"
    one = render_text(Inventory(driver_version="550.54.15", warnings=("w1",)))
    assert one.splitlines()[-2:] == ["no NVIDIA GPUs", "warning: w1"]
