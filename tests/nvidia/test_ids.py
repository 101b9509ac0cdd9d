"""Device ID resolution (hook.sources.nvidia.ids)."""

from __future__ import annotations

import pytest

from hook.core.errors import InputError
from hook.sources.nvidia import inventory
from hook.sources.nvidia.ids import normalize_bus_id, resolve
from hook.sources.nvidia.model import Gpu, Inventory, MigDevice

MIG_A = "MIG-07ad8e7c-0197-5973-bd05-7fcd18ae754e"
MIG_B = "MIG-90825510-8f47-5052-8e15-ead851500769"
GPU1 = "GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"
GPU0 = "GPU-3f2b9c41-7d0e-4a6b-8c15-2e9f0a7b6d34"


@pytest.fixture
def inv(fake_host, nvml_for) -> Inventory:
    root, _ = fake_host("8x-mig")
    return inventory.load(root, None, None, need_migs=True, nvml_module=nvml_for("8x-mig"))


def _ids(devices: tuple[Gpu | MigDevice, ...]) -> list[str | None]:
    return [d.uuid for d in devices]


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("1", [GPU1]),
        (GPU1, [GPU1]),
        (GPU1.lower().replace("gpu-", "GpU-").upper(), [GPU1]),
        (MIG_A, [MIG_A]),
        (MIG_B.upper().replace("MIG-", "mig-"), [MIG_B]),
        ("0:0", [MIG_A]),
        ("0:1", [MIG_B]),
        (f"MIG-{GPU0}/2/0", [MIG_B]),
        ("0000:2a:00.0", [GPU1]),
        ("00000000:2A:00.0", [GPU1]),
        ("2a:00.0", [GPU1]),
        (" 1 ", [GPU1]),
    ],
    ids=[
        "index",
        "gpu uuid",
        "gpu uuid upper",
        "mig uuid",
        "mig uuid mixed case",
        "G:M first",
        "G:M second",
        "old MIG-GPU form",
        "bus id",
        "bus id 8-digit domain",
        "bus id no domain",
        "spaces trimmed",
    ],
)
def test_forms(inv: Inventory, token: str, expected: list[str]) -> None:
    assert _ids(resolve(inv, [token])) == expected


def test_all_is_every_gpu_then_every_mig(inv: Inventory) -> None:
    devices = resolve(inv, ["ALL"])
    assert len(devices) == 10 and _ids(devices)[-2:] == [MIG_A, MIG_B]


def test_order_kept_duplicates_dropped_empties_skipped(inv: Inventory) -> None:
    assert _ids(resolve(inv, ["3", "", MIG_A, "0:0", "3"])) == [inv.gpus[3].uuid, MIG_A]


def test_unknown_ids_are_all_named(inv: Inventory) -> None:
    with pytest.raises(InputError) as info:
        resolve(
            inv, ["8", "GPU-deadbeef", "1", "0:2", "0000:01:00.0", "foo"], source="NVIDIA_VISIBLE_DEVICES"
        )
    assert info.value.file == "NVIDIA_VISIBLE_DEVICES"
    assert info.value.field == "8, GPU-deadbeef, 0:2, 0000:01:00.0, foo"
    assert "unknown device IDs" in info.value.reason


def test_mig_uuid_unknown_without_nvml_says_why(fake_host) -> None:
    root, _ = fake_host("8x-mig")
    proc_only = inventory.load(root, None, None, need_migs=False)
    with pytest.raises(InputError, match="G:M index needs NVML"):  # /proc cannot prove NVML's order
        resolve(proc_only, ["0:1"])
    with pytest.raises(InputError, match="MIG UUIDs are unknown"):
        resolve(proc_only, [MIG_A])


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("3b:0.1", "0000:3b:00.1"),
        ("1:02:1f.7", "0001:02:1f.7"),
    ],
)
def test_normalize_bus_id(text: str, norm: str) -> None:
    assert normalize_bus_id(text) == norm


@pytest.mark.parametrize("text", ["3b:00", "0000:3b:00.8", "g0:00.0", "0:1"])
def test_normalize_bus_id_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_bus_id(text)
