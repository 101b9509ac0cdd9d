"""Inventory load order, cache and snapshot (hook.sources.nvidia.inventory, hook.sources.nvidia.snapshot)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hook.core.errors import InputError
from hook.sources import nodekey
from hook.sources.nvidia import inventory
from hook.sources.nvidia.snapshot import inventory_from_json, inventory_to_json
from tests.nvidia.fake_pynvml import NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_NO_PERMISSION

CACHE = Path("/run/oci-device-hook")


@pytest.mark.parametrize("topology", ["1x", "8x"])
def test_proc_answers_without_nvml(fake_host, nvml_for, topology: str) -> None:
    root, spec = fake_host(topology)
    fake = nvml_for(topology)
    inv = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert fake.init_calls == 0 and inv.source == "proc"
    assert [(g.index, g.minor, g.uuid, g.pci_bus_id) for g in inv.gpus] == [
        (g.index, g.minor, g.uuid, g.bus) for g in spec.gpus
    ]
    assert inv.migs == () and inv.driver_version == "550.54.15"
    assert not (CACHE / "inventory.json").exists()


def test_mig_without_need_uses_proc_only(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig")
    inv = inventory.load(root, None, CACHE, need_migs=False, nvml_module=fake)
    assert fake.init_calls == 0
    assert [(m.uuid, m.gi, m.ci, m.index) for m in inv.migs] == [(None, 1, 0, 0), (None, 2, 0, 1)]
    assert inv.gpus[0].mig_enabled and not inv.gpus[1].mig_enabled


@pytest.mark.parametrize("topology", ["8x-mig", "8x-shuffled"])
def test_mig_uuids_come_from_nvml_then_cache(fake_host, nvml_for, topology: str) -> None:
    root, spec = fake_host(topology)
    fake = nvml_for(topology)
    first = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert fake.init_calls == 1 and first.source == "proc+nvml"
    assert [m.uuid for m in first.migs] == [m.uuid for m in spec.migs]
    parent = next(g for g in spec.gpus if g.mig_enabled)
    assert {(m.parent_index, m.parent_minor) for m in first.migs} == {(parent.index, parent.minor)}
    assert [(g.index, g.minor) for g in first.gpus] == [(g.index, g.minor) for g in spec.gpus]
    assert (CACHE / "inventory.json").is_file()
    second = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert fake.init_calls == 1 and second.source == "cache"
    assert (second.gpus, second.migs, second.caps) == (first.gpus, first.migs, first.caps)
    names = sorted(p.name for p in CACHE.iterdir())
    assert names == ["inventory.json", "mig-minors.json"]  # no temp file left


def _change_boot(root: Path) -> None:
    (root / "proc/sys/kernel/random/boot_id").write_text("00000000-1111-2222-3333-444444444444\n")


def _change_driver(root: Path) -> None:
    path = root / "proc/driver/nvidia/version"
    path.write_text(path.read_text().replace("550.54.15", "550.90.07"))


def _change_gpus(root: Path) -> None:
    shutil.rmtree(root / "proc/driver/nvidia/gpus/0000:db:00.0")


def _change_migs(root: Path) -> None:
    shutil.rmtree(root / "proc/driver/nvidia/capabilities/gpu0/mig/gi2")
    (root / "dev/nvidia-caps/nvidia-cap21").unlink()
    (root / "dev/nvidia-caps/nvidia-cap22").unlink()


def _sealed(text: str) -> bytes:
    """``text`` as a hook with this node's key writes it: a record past its seal, still to be judged."""
    return nodekey.seal("inventory.json", text.encode()) or b""


def _unsealed() -> str:
    return (nodekey.unseal("inventory.json", (CACHE / "inventory.json").read_bytes()) or b"").decode()


def _corrupt(root: Path) -> None:
    (CACHE / "inventory.json").write_bytes(_sealed("{not json"))


def _corrupt_inventory(root: Path) -> None:
    data = json.loads(_unsealed())
    data["inventory"]["gpus"][0]["minor"] = "zero"
    (CACHE / "inventory.json").write_bytes(_sealed(json.dumps(data)))


@pytest.mark.parametrize(
    "change",
    [_change_boot, _change_driver, _change_gpus, _change_migs, _corrupt, _corrupt_inventory],
    ids=["boot id", "driver version", "gpu set", "mig instances", "corrupt json", "corrupt inventory"],
)
def test_cache_invalidation(fake_host, nvml_for, change) -> None:
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig")
    inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    change(root)
    inv = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert fake.init_calls == 2 and inv.source == "proc+nvml"
    third = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert fake.init_calls == 2 and third.source == "cache"  # rewritten under the new key


def test_corrupt_cache_is_reported_and_rebuilt(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    CACHE.mkdir(parents=True, mode=0o700)
    (CACHE / "inventory.json").write_bytes(_sealed("{not json"))
    (CACHE / "inventory.json").chmod(0o600)
    fake = nvml_for("8x-mig")
    inv = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert any("unreadable cache" in w for w in inv.warnings)
    assert inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake).source == "cache"


@pytest.mark.parametrize(
    "doc",
    [
        {"kind": "inventory", "format": 1, "hook": "0.0.1-other"},
        {"kind": "inventory", "format": 99},
        {"kind": "fastpath", "format": 1},
    ],
    ids=["other-hook-version", "other-format", "another-files-content"],
)
def test_cache_of_another_version_is_a_silent_miss(fake_host, nvml_for, doc) -> None:
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig")
    inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    record = json.loads(_unsealed())
    (CACHE / "inventory.json").write_bytes(
        _sealed(json.dumps({**record, "hook": record["hook"], **doc, "extra": 1}))
    )
    inv = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert (inv.source, inv.warnings, fake.init_calls) == ("proc+nvml", (), 2)
    assert inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake).source == "cache"


def test_no_cache_dir_means_no_cache(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig")
    inventory.load(root, None, None, need_migs=True, nvml_module=fake)
    inventory.load(root, None, None, need_migs=True, nvml_module=fake)
    assert fake.init_calls == 2 and not CACHE.exists()


def test_cache_majors_and_caps_are_fresh(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig")
    inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    devices = root / "proc/devices"
    devices.write_text(devices.read_text().replace("511 nvidia-uvm", "509 nvidia-uvm"))
    inv = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert inv.source == "cache" and inv.majors.uvm == 509


def test_nvml_failure_falls_back_to_proc(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig", fail_init=NVML_ERROR_LIBRARY_NOT_FOUND)
    inv = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert inv.source == "proc" and [m.uuid for m in inv.migs] == [None, None]
    assert any("libnvidia-ml.so.1" in w and "MIG device UUIDs are unknown" in w for w in inv.warnings)
    assert not (CACHE / "inventory.json").exists()


def test_mig_permission_failure_keeps_proc_migs_and_no_cache(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig", fail_mig=NVML_ERROR_NO_PERMISSION)
    inv = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert inv.source == "proc+nvml" and [(m.uuid, m.gi) for m in inv.migs] == [(None, 1), (None, 2)]
    assert any("Insufficient Permissions" in w for w in inv.warnings)
    assert not (CACHE / "inventory.json").exists()


def test_gpus_not_listable_from_proc_uses_nvml(fake_host, nvml_for) -> None:
    root, spec = fake_host("8x")
    shutil.rmtree(root / "proc/driver/nvidia/gpus")
    fake = nvml_for("8x")
    inv = inventory.load(root, None, None, need_migs=False, nvml_module=fake)
    assert fake.init_calls == 1 and [g.uuid for g in inv.gpus] == [g.uuid for g in spec.gpus]


def test_hidden_uuid_uses_nvml(fake_host, nvml_for) -> None:
    root, _ = fake_host("1x")
    info = root / "proc/driver/nvidia/gpus/0000:18:00.0/information"
    info.write_text(info.read_text().replace("GPU-3f2b9c41-7d0e-4a6b-8c15-2e9f0a7b6d34", "??"))
    fake = nvml_for("1x")
    inv = inventory.load(root, None, None, need_migs=False, nvml_module=fake)
    assert fake.init_calls == 1 and inv.gpus[0].uuid.startswith("GPU-3f2b9c41")


def test_neither_proc_nor_nvml_is_an_error(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x")
    shutil.rmtree(root / "proc/driver/nvidia/gpus")
    with pytest.raises(InputError) as info:
        inventory.load(
            root, None, None, need_migs=False, nvml_module=nvml_for("8x", fail_init=NVML_ERROR_NO_PERMISSION)
        )
    assert info.value.file == "NVML" and "Insufficient Permissions" in info.value.reason
    assert any("could not list the GPUs" in note for note in info.value.__notes__)


def test_missing_proc_devices_is_an_error(fake_host, nvml_for) -> None:
    root, _ = fake_host("1x")
    (root / "proc/devices").unlink()
    with pytest.raises(InputError) as info:
        inventory.load(root, None, None, need_migs=False, nvml_module=nvml_for("1x"))
    assert info.value.file == "/host/proc/devices"


def test_snapshot_round_trip_and_file_wins(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    inv = inventory.load(root, None, None, need_migs=True, nvml_module=nvml_for("8x-mig"))
    text = inventory.dumps(inv)
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    assert inventory_from_json(text, "s.json") == inv
    snap = Path("/snap.json")
    snap.write_text(text)
    fake = nvml_for("8x-mig")
    shutil.rmtree(root)  # the file needs no /proc
    loaded = inventory.load(root, snap, CACHE, need_migs=True, nvml_module=fake)
    assert fake.init_calls == 0 and loaded.source == "file" and loaded.migs == inv.migs


def _snapshot(fake_host) -> dict:
    root, _ = fake_host("8x-mig")
    return inventory_to_json(inventory.load(root, None, None, need_migs=False))


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.pop("driver_version"), "driver_version"),
        (lambda d: d["gpus"][1].update(minor=-1), "gpus[1].minor"),
        (lambda d: d["gpus"][0].update(mig_enabled=1), "gpus[0].mig_enabled"),
        (lambda d: d["migs"][1].update(gi=True), "migs[1].gi"),
        (lambda d: d["caps"]["ci"][0].pop("minor"), "caps.ci[0].minor"),
        (lambda d: d["majors"].update(uvm="511"), "majors.uvm"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(warnings=[3]), "warnings[0]"),
    ],
    ids=[
        "missing key",
        "negative",
        "int for bool",
        "bool for int",
        "cap minor",
        "major string",
        "version",
        "warn",
    ],
)
def test_snapshot_errors_name_the_field(fake_host, edit, field: str) -> None:
    data = _snapshot(fake_host)
    edit(data)
    with pytest.raises(InputError) as info:
        inventory_from_json(json.dumps(data), "inv.json")
    assert (info.value.file, info.value.field) == ("inv.json", field)


def test_snapshot_not_json_and_unreadable(fs) -> None:
    with pytest.raises(InputError) as info:
        inventory_from_json(b"{", "inv.json")
    assert info.value.file == "inv.json" and "not valid JSON" in info.value.reason
    with pytest.raises(InputError) as info:
        inventory.load(Path("/"), Path("/absent.json"), None, need_migs=False)
    assert info.value.file == "/absent.json"


def test_cache_write_failure_is_a_warning(fake_host, nvml_for) -> None:
    root, _ = fake_host("8x-mig")
    blocker = Path("/run/blocked")
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file, not a directory")
    inv = inventory.load(root, None, blocker, need_migs=True, nvml_module=nvml_for("8x-mig"))
    assert inv.source == "proc+nvml" and any("cache not written" in w for w in inv.warnings)


def test_a_rewritten_inventory_without_the_node_seal_is_never_believed(fake_host, nvml_for) -> None:
    """Issue 36 item 1: the inventory record rewritten by a writer of /run (its key kept, a GPU's
    minor changed) is a miss without the node key's seal: the inventory is read again."""
    root, _ = fake_host("8x-mig")
    fake = nvml_for("8x-mig")
    good = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    data = json.loads(_unsealed())
    data["inventory"]["gpus"][0]["minor"] = 7
    seal = (CACHE / "inventory.json").read_bytes().split(b"\n", 1)[0]  # kept: only what follows changes
    (CACHE / "inventory.json").write_bytes(seal + b"\n" + json.dumps(data).encode())
    (CACHE / "inventory.json").chmod(0o600)
    again = inventory.load(root, None, CACHE, need_migs=True, nvml_module=fake)
    assert again.source == "proc+nvml" and again.gpus == good.gpus
