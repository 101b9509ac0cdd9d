"""Registry: two spec dirs, priority, conflicts, broken files isolated, NVIDIA fixtures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hook.core.errors import InputError
from hook.sources.cdi.registry import Registry

from .helpers import FIXTURES, base_spec, device, write_spec


def _env_of(registry: Registry, name: str) -> tuple[str, ...]:
    return registry.resolve([name]).env


def test_later_dir_wins_per_device(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    write_spec(
        etc, "v.json", base_spec(devices=[device("d1", env=["FROM=etc"]), device("d2", env=["FROM=etc"])])
    )
    write_spec(run, "v.json", base_spec(devices=[device("d1", env=["FROM=run"])]))
    registry = Registry.load([etc, run])
    assert not registry.errors
    assert _env_of(registry, "vendor.com/dev=d1") == ("FROM=run",)
    assert _env_of(registry, "vendor.com/dev=d2") == ("FROM=etc",)
    assert registry.devices["vendor.com/dev=d1"].priority == 1


def test_same_priority_conflict_drops_device_and_blames_both(tmp_path: Path) -> None:
    a = write_spec(tmp_path, "a.json", base_spec(devices=[device("d1"), device("d2")]))
    b = write_spec(
        tmp_path,
        "b.yaml",
        "cdiVersion: 0.3.0\nkind: vendor.com/dev\ndevices: [{name: d1, containerEdits: {env: [B=1]}}]\n",
    )
    registry = Registry.load([tmp_path])
    assert "vendor.com/dev=d1" not in registry.devices
    assert "vendor.com/dev=d2" in registry.devices
    line = f"conflicting device 'vendor.com/dev=d1' (specs '{a}', '{b}')"
    assert registry.errors == {str(a): (line,), str(b): (line,)}


def test_lower_priority_conflict_is_not_rescued_by_higher_dir(tmp_path: Path) -> None:
    """The reference cache deletes a conflicted name after the scan, whatever later dirs define."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    write_spec(etc, "a.json", base_spec())
    write_spec(etc, "b.json", base_spec())
    write_spec(run, "c.json", base_spec(devices=[device("d0", env=["RUN=1"])]))
    registry = Registry.load([etc, run])
    assert "vendor.com/dev=d0" not in registry.devices
    with pytest.raises(InputError, match=r"unresolvable CDI devices vendor\.com/dev=d0"):
        registry.resolve(["vendor.com/dev=d0"])
    assert set(registry.errors) == {str(etc / "a.json"), str(etc / "b.json")}


def test_broken_file_is_isolated(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    write_spec(etc, "good.json", base_spec())
    bad = write_spec(run, "bad.json", base_spec(kind="broken"))
    junk = write_spec(run, "junk.yaml", "a: [")
    registry = Registry.load([etc, run])
    assert list(registry.devices) == ["vendor.com/dev=d0"]
    assert set(registry.errors) == {str(bad), str(junk)}
    assert registry.errors[str(bad)] == (f"{bad}: kind: invalid kind 'broken': expected vendor/class",)


def test_an_unresolvable_device_names_the_spec_file_that_did_not_parse(tmp_path: Path) -> None:
    """The device asked for may be in the broken file: the error says which file, and why."""
    write_spec(tmp_path, "good.json", base_spec())
    junk = write_spec(tmp_path, "gpu.yaml", "a: [")
    with pytest.raises(InputError) as info:
        Registry.load([tmp_path]).resolve(["nvidia.com/gpu=0"])
    reason = info.value.reason
    assert reason.startswith("unresolvable CDI devices nvidia.com/gpu=0; spec file(s) that did not load: ")
    assert f"{junk}: " in reason and str(tmp_path / "good.json") not in reason


def test_only_json_and_yaml_not_recursive(tmp_path: Path) -> None:
    write_spec(tmp_path, "a.yml", base_spec(devices=[device("yml")]))
    write_spec(tmp_path, "a.txt", base_spec(devices=[device("txt")]))
    write_spec(tmp_path / "sub", "a.json", base_spec(devices=[device("sub")]))
    (tmp_path / "dir.json").mkdir()
    write_spec(tmp_path, "z.json", base_spec(devices=[device("json")]))
    registry = Registry.load([tmp_path, tmp_path / "missing"])
    assert list(registry.devices) == ["vendor.com/dev=json"]
    assert not registry.errors


def test_lexical_order_within_a_dir(tmp_path: Path) -> None:
    for name in ("b.json", "a.json", "c.json"):
        write_spec(tmp_path, name, base_spec(kind=f"v.com/{name[0]}"))
    assert Registry.load([tmp_path]).spec_paths() == tuple(
        str(tmp_path / n) for n in ("a.json", "b.json", "c.json")
    )


def test_all_unresolved_names_in_one_error(tmp_path: Path) -> None:
    write_spec(tmp_path, "a.json", base_spec())
    with pytest.raises(InputError) as info:
        Registry.load([tmp_path]).resolve(["v.com/x=1", "vendor.com/dev=d0", "v.com/x=2"])
    assert info.value.reason == "unresolvable CDI devices v.com/x=1, v.com/x=2"
    assert str(tmp_path) in info.value.file


def test_nvidia_fixtures_resolve(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("nvidia-gpu.yaml", "nvidia-management.yaml"):
        shutil.copy(FIXTURES / name, run / name)
    registry = Registry.load([tmp_path / "etc", run])
    assert not registry.errors
    mig = registry.resolve(["nvidia.com/gpu=0:0"])
    assert [n.path for n in mig.device_nodes] == [
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-uvm",
        "/dev/nvidiactl",
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]
    mgmt = registry.resolve(["management.nvidia.com/gpu=all"])
    paths = [n.path for n in mgmt.device_nodes]
    assert {"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidiactl"} <= set(paths)
    assert mgmt.env == ("NVIDIA_VISIBLE_DEVICES=void",)
    both = registry.resolve(["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-9a1b2c3d-0000-1111-2222-333344445555"])
    assert both.env == ("NVIDIA_VISIBLE_DEVICES=void",)  # spec edits once
    assert [h.args[1] for h in both.hooks] == ["create-symlinks", "update-ldcache", "create-symlinks"]
