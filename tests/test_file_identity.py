"""Issue 28 item 5: every view the hook keeps of a file is tied to its ctime too, and MIG UUIDs to
the instance's incarnation.

A file rewritten in place with the same size and its old mtime put back (``os.utime``, ``touch -r``,
a tool that preserves times) keeps its inode, size and mtime: only ``st_ctime_ns`` moves. Each
keeper (the decider's warm views, the CDI spec cache, the fast path's settings record, the NVIDIA
inventory cache) must see that rewrite. None of these tests depends on an inode number being
reused: the file is the same inode throughout.

MIG instances destroyed and made again with the same GI/CI ids get new UUIDs; the inventory cache
used to key instances by (GPU, GI, CI) alone and handed out the old UUIDs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.core.oci import parse_config_object
from hook.core.settings import Settings
from hook.routes import fastpath
from hook.routes.gather import Options, inputs_for_config
from hook.sources import nodekey, warm
from hook.sources import settingsfile as settings
from hook.sources.cdi.registry import Registry
from hook.sources.nvidia import inventory, nvml
from tests.bundles import config
from tests.cdi.helpers import base_spec, device, write_spec
from tests.hosttree import cap_minor, make_host_tree
from tests.nvidia.fake_pynvml import FakeNvml

TICK = 0.05  # past the filesystem's timestamp granularity, so the rewrite's ctime differs


def rewrite_in_place(path: Path, old: bytes, new: bytes) -> None:
    """``path``'s bytes ``old`` become ``new`` (same length) in the same inode; mtime put back."""
    assert len(old) == len(new)
    st = path.stat()
    time.sleep(TICK)
    data = path.read_bytes()
    assert old in data
    with open(path, "r+b") as f:
        f.write(data.replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


# --- the decider's warm views (hook.sources.warm) --------------------------------------------------


@pytest.fixture
def warm_on() -> Iterator[None]:
    warm.enable()
    yield
    warm.enable(False)


def test_a_warm_view_sees_a_same_size_rewrite_with_the_mtime_put_back(tmp_path: Path, warm_on: None) -> None:
    f = tmp_path / "settings.yaml"
    f.write_text("privileged_allocation: narrow\n")
    assert warm.remembered("f", warm.identity(f), f.read_text) == "privileged_allocation: narrow\n"
    rewrite_in_place(f, b"narrow", b"reject")
    assert warm.remembered("f", warm.identity(f), f.read_text) == "privileged_allocation: reject\n"


# --- the CDI spec cache ----------------------------------------------------------------------------


def test_the_cdi_cache_sees_a_same_size_rewrite_with_the_mtime_put_back(tmp_path: Path) -> None:
    specs, cdir = tmp_path / "specs", tmp_path / "cache"
    spec = write_spec(specs, "a.json", base_spec(devices=[device("d0", env=["V=1"])]))
    assert Registry.load([specs], cache_dir=cdir).resolve(["vendor.com/dev=d0"]).env == ("V=1",)
    rewrite_in_place(spec, b"V=1", b"V=2")
    assert Registry.load([specs], cache_dir=cdir).resolve(["vendor.com/dev=d0"]).env == ("V=2",)


# --- the fast path's settings record --------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "run" / "fastpath.json"
    monkeypatch.setattr(fastpath, "FASTPATH_CACHE", str(target))
    monkeypatch.setattr(settings, "FASTPATH_CACHE", target)
    return target.parent


def test_the_fast_path_record_sees_a_same_size_settings_rewrite(tmp_path: Path, run_dir: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("cdi_annotation_prefixes: [aaaa.io/]\n")
    assert settings.remember_for_fast_path(path, settings.load_settings(path)) is None
    assert fastpath.fast_settings(str(path)) == (("aaaa.io/",), fastpath.DEFAULT_MOUNT_ROOT)
    rewrite_in_place(path, b"aaaa.io/", b"bbbb.io/")
    assert fastpath.fast_settings(str(path)) is None  # a miss: the full path reads the file again


# --- the NVIDIA inventory cache: MIG instances made again ----------------------------------------

GI_DIR = "proc/driver/nvidia/capabilities/gpu0/mig/gi2"
NEW_UUID = "MIG-5c1d0e2f-3a4b-5c6d-8e9f-a0b1c2d3e4f5"


@pytest.fixture
def mig_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Seed 000 (MIG on card 0: GI 1 and GI 2) on disk, with a fake NVML the test can re-point."""
    root = tmp_path / "root"
    spec = make_host_tree(root, "8x-mig", mknod=False)
    fake = {"nvml": FakeNvml(spec)}
    monkeypatch.setattr(nvml, "_import", lambda _module: fake["nvml"])
    return {"root": root, "spec": spec, "fake": fake, "cache": tmp_path / "cache", "tmp": tmp_path}


def remake_gi2(node: dict[str, Any]) -> str:
    """Destroy GI 2 and make it again with the same ids (the driver writes its capability files
    anew); NVML now names it by a new UUID. Returns the old UUID."""
    spec = node["spec"]
    old = spec.migs[1]
    files = {
        p.relative_to(node["root"] / GI_DIR): p.read_bytes()
        for p in (node["root"] / GI_DIR).rglob("*")
        if p.is_file()
    }
    time.sleep(TICK)
    shutil.rmtree(node["root"] / GI_DIR)
    for rel, data in files.items():
        (node["root"] / GI_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        (node["root"] / GI_DIR / rel).write_bytes(data)
    new = dataclasses.replace(old, uuid=NEW_UUID)
    node["fake"]["nvml"] = FakeNvml(dataclasses.replace(spec, migs=(spec.migs[0], new)))
    return old.uuid


def test_a_remade_mig_instance_is_not_served_from_the_cache(mig_node: dict[str, Any]) -> None:
    root, cache = mig_node["root"], mig_node["cache"]
    first = inventory.load(root, None, cache, need_migs=True)
    assert first.source == "proc+nvml" and (cache / "inventory.json").is_file()
    assert inventory.load(root, None, cache, need_migs=True).source == "cache"
    old = remake_gi2(mig_node)
    inv = inventory.load(root, None, cache, need_migs=True)
    assert inv.source == "proc+nvml"
    uuids = {m.uuid for m in inv.migs}
    assert NEW_UUID in uuids and old not in uuids
    assert inventory.load(root, None, cache, need_migs=True).source == "cache"  # rewritten, new key


def decide_env(node: dict[str, Any], value: str) -> set[str]:
    """The /dev paths a non-Kubernetes container asking ``NVIDIA_VISIBLE_DEVICES=value`` is given."""
    from hook.core.decide import decide

    raw = config([f"NVIDIA_VISIBLE_DEVICES={value}"])
    cfg = parse_config_object(raw, "config.json", "")
    settings_obj = Settings(cache_dir=str(node["cache"]), log_file=str(node["tmp"] / "hook.log"))
    opts = Options(
        driver_root=node["root"], spec_dirs=(node["tmp"] / "no-cdi",), use_cache=True, settings=settings_obj
    )
    plan = decide(inputs_for_config(cfg, {}, "c1", opts))
    return {n.path for n in plan.create}


def test_an_old_uuid_is_refused_and_the_new_one_granted_after_a_remake(mig_node: dict[str, Any]) -> None:
    gi2 = cap_minor(0, 2)
    old = mig_node["spec"].migs[1].uuid
    assert f"/dev/nvidia-caps/nvidia-cap{gi2}" in decide_env(mig_node, old)  # cached now
    remake_gi2(mig_node)
    with pytest.raises(InputError, match="unknown device ID"):
        decide_env(mig_node, old)  # its caps now belong to whoever made the new instance
    assert f"/dev/nvidia-caps/nvidia-cap{gi2}" in decide_env(mig_node, NEW_UUID)


def test_a_uuid_the_cached_inventory_lacks_is_read_again_once(mig_node: dict[str, Any]) -> None:
    """A cache written before the instance's UUID was known to it (here: edited to lack it) is not
    the last word: the UUID is looked for once more from /proc and NVML before it is refused."""
    gi2 = cap_minor(0, 2)
    uuid = mig_node["spec"].migs[1].uuid
    inventory.load(mig_node["root"], None, mig_node["cache"], need_migs=True)
    path = mig_node["cache"] / "inventory.json"
    record = json.loads(nodekey.unseal(path.name, path.read_bytes()) or b"")
    for mig in record["inventory"]["migs"]:
        if mig["uuid"] == uuid:
            mig["uuid"] = "MIG-00000000-0000-0000-0000-000000000000"
    path.write_bytes(nodekey.seal(path.name, json.dumps(record).encode()) or b"")  # as a hook wrote it
    assert inventory.load(mig_node["root"], None, mig_node["cache"], need_migs=True).source == "cache"
    assert f"/dev/nvidia-caps/nvidia-cap{gi2}" in decide_env(mig_node, uuid)
    with pytest.raises(InputError, match="unknown device ID"):
        decide_env(mig_node, "MIG-11111111-2222-3333-4444-555555555555")
