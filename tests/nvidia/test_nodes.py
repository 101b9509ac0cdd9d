"""Device → node mapping (hook.sources.nvidia.nodes)."""

from __future__ import annotations

import pytest

from hook.core.errors import InputError
from hook.core.plan import Node
from hook.sources.nvidia import inventory
from hook.sources.nvidia.model import CapTable, Inventory, Majors
from hook.sources.nvidia.nodes import (
    DEFAULT_CAPABILITIES,
    SUPPORTED_CAPABILITIES,
    control_nodes,
    device_nodes,
    mig_mgmt_nodes,
    parse_driver_capabilities,
)


@pytest.fixture
def inv(fake_host, nvml_for) -> Inventory:
    root, _ = fake_host("8x-mig")
    return inventory.load(root, None, None, need_migs=True, nvml_module=nvml_for("8x-mig"))


def _short(nodes: tuple[Node, ...]) -> list[tuple[str, int, int, int]]:
    return [(n.path, n.major, n.minor, n.file_mode) for n in nodes]


def test_gpu_node(inv: Inventory) -> None:
    assert _short(device_nodes(inv, [inv.gpus[1]])) == [("/dev/nvidia1", 195, 1, 0o666)]


def test_mig_device_is_parent_plus_gi_and_ci_caps(inv: Inventory) -> None:
    assert _short(device_nodes(inv, [inv.migs[1]])) == [
        ("/dev/nvidia0", 195, 0, 0o666),
        ("/dev/nvidia-caps/nvidia-cap21", 237, 21, 0o444),
        ("/dev/nvidia-caps/nvidia-cap22", 237, 22, 0o444),
    ]


def test_nodes_deduplicated_and_sorted(inv: Inventory) -> None:
    nodes = device_nodes(inv, [inv.gpus[2], inv.migs[0], inv.gpus[0], inv.migs[1]])
    assert [n.path for n in nodes] == [
        "/dev/nvidia0",
        "/dev/nvidia2",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]


def test_mig_without_caps_major_is_an_error(inv: Inventory) -> None:
    no_caps = inventory.Inventory(
        driver_version="1", majors=Majors(uvm=511), gpus=inv.gpus, migs=inv.migs, caps=inv.caps
    )
    with pytest.raises(InputError) as info:
        device_nodes(no_caps, [inv.migs[0]])
    assert (info.value.file, info.value.field) == ("/proc/devices", "nvidia-caps")


def test_mig_without_its_cap_is_an_error(inv: Inventory) -> None:
    caps = CapTable(config=inv.caps.config, gi=inv.caps.gi, ci={})
    missing = inventory.Inventory(
        driver_version="1", majors=inv.majors, gpus=inv.gpus, migs=inv.migs, caps=caps
    )
    with pytest.raises(InputError) as info:
        device_nodes(missing, [inv.migs[0]])
    assert info.value.field == "gpu0/gi1/ci0/access" and inv.migs[0].uuid in info.value.reason


@pytest.mark.parametrize(
    ("caps", "paths"),
    [
        ({"utility"}, ["/dev/nvidiactl"]),
        ({"utility", "compute"}, ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]),
        ({"display"}, ["/dev/nvidia-modeset", "/dev/nvidiactl"]),
    ],
    ids=["utility only", "compute", "display"],
)
def test_control_nodes(inv: Inventory, caps: set[str], paths: list[str]) -> None:
    assert [n.path for n in control_nodes(inv, caps)] == paths


def test_control_node_numbers(inv: Inventory) -> None:
    assert _short(control_nodes(inv, SUPPORTED_CAPABILITIES)) == [
        ("/dev/nvidia-modeset", 195, 254, 0o666),
        ("/dev/nvidiactl", 195, 255, 0o666),
        ("/dev/nvidia-uvm", 511, 0, 0o666),
        ("/dev/nvidia-uvm-tools", 511, 1, 0o666),
    ]


def test_uvm_skipped_when_module_absent(inv: Inventory) -> None:
    bare = inventory.Inventory(driver_version="1", majors=Majors(), gpus=inv.gpus)
    assert [n.path for n in control_nodes(bare, {"compute"})] == ["/dev/nvidiactl"]


def test_mig_management_nodes(inv: Inventory) -> None:
    assert _short(mig_mgmt_nodes(inv, config=True, monitor=True)) == [
        ("/dev/nvidia-caps/nvidia-cap1", 237, 1, 0o400),
        ("/dev/nvidia-caps/nvidia-cap2", 237, 2, 0o444),
    ]
    assert _short(mig_mgmt_nodes(inv, config=False, monitor=True)) == [
        ("/dev/nvidia-caps/nvidia-cap2", 237, 2, 0o444)
    ]
    assert mig_mgmt_nodes(inv, config=False, monitor=False) == ()


def test_mig_management_absent_cap(inv: Inventory) -> None:
    bare = inventory.Inventory(driver_version="1", majors=inv.majors, gpus=inv.gpus)
    with pytest.raises(InputError) as info:
        mig_mgmt_nodes(bare, config=False, monitor=True)
    assert info.value.field == "monitor" and "NVIDIA_MIG_MONITOR_DEVICES" in info.value.reason


@pytest.mark.parametrize(
    ("value", "legacy", "expected"),
    [
        (None, False, DEFAULT_CAPABILITIES),
        ("", False, DEFAULT_CAPABILITIES),
        (None, True, SUPPORTED_CAPABILITIES),
        ("", True, DEFAULT_CAPABILITIES),
        ("all", False, SUPPORTED_CAPABILITIES),
        ("compute,ALL", False, SUPPORTED_CAPABILITIES),
        (" video , utility,", False, frozenset({"video", "utility"})),
    ],
    ids=["unset", "empty", "unset legacy image", "empty legacy image", "all", "all among others", "list"],
)
def test_parse_driver_capabilities(value: str | None, legacy: bool, expected: frozenset[str]) -> None:
    assert parse_driver_capabilities(value, legacy_image=legacy) == expected


def test_parse_driver_capabilities_unknown() -> None:
    with pytest.raises(InputError) as info:
        parse_driver_capabilities("compute,bogus,gfx")
    assert (info.value.file, info.value.field) == ("NVIDIA_DRIVER_CAPABILITIES", "bogus, gfx")
