"""The parsed mig-minors table is cached per boot and driver build (``hook.sources.nvidia.inventory``).

A hit must give exactly the table /proc gives; a new boot id or driver build, a corrupt or
foreign cache file, or a table with warnings must all fall back to reading /proc.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hook.sources import nodekey
from hook.sources.nvidia import inventory, procfs
from hook.sources.nvidia.migminors import MIG_MINORS_PATH

CACHE = Path("/run/oci-device-hook")
FILE = CACHE / inventory.MINORS_CACHE_NAME


def _load(root: Path) -> inventory.Inventory:
    return inventory.load(root, None, CACHE, need_migs=False)


def _break_minors(root: Path) -> None:
    """Make /proc's mig-minors unusable: only a cache hit can still give the old table."""
    (root / MIG_MINORS_PATH).write_text("config 1\nmonitor 2\n")


def test_a_hit_equals_what_proc_gives_and_skips_the_file(fake_host) -> None:
    root, _ = fake_host("8x-mig")
    fresh = _load(root)
    assert FILE.is_file()
    expected = procfs.read_cap_table(root)
    assert fresh.caps == expected[0] and len(fresh.caps.instances()) == 2
    _break_minors(root)
    again = _load(root)
    assert again.caps == fresh.caps and again.migs == fresh.migs and again.warnings == fresh.warnings


@pytest.mark.parametrize("change", ["boot", "driver"])
def test_a_new_boot_or_driver_build_reads_proc_again(fake_host, change: str) -> None:
    root, _ = fake_host("8x-mig")
    _load(root)
    _break_minors(root)
    if change == "boot":
        (root / "proc/sys/kernel/random/boot_id").write_text("00000000-1111-2222-3333-444444444444\n")
    else:
        path = root / procfs.VERSION_PATH
        path.write_text(path.read_text().replace("Tue Mar  5", "Wed Mar  6"))  # same version, new build
    inv = _load(root)
    assert inv.caps.instances() == ()  # the broken file was read, not the cache


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"key": 1, "by_name": {}}',
        b"null",
        "KEY-by_name-list",
        "KEY-bool-minor",
        "KEY-str-minor",
    ],
)
def test_a_bad_cache_file_is_a_miss(fake_host, content: bytes | str) -> None:
    root, _ = fake_host("8x-mig")
    good = _load(root)
    key = json.loads(nodekey.unseal(FILE.name, FILE.read_bytes()) or b"")["key"]
    if isinstance(content, str):
        by_name = {
            "KEY-by_name-list": [],
            "KEY-bool-minor": {"config": True},
            "KEY-str-minor": {"config": "1"},
        }
        content = json.dumps({"key": key, "by_name": by_name[content]}).encode()
    FILE.write_bytes(nodekey.seal(FILE.name, content) or b"")  # past the seal: the record itself judged
    inv = _load(root)
    assert inv.caps == good.caps
    assert (
        json.loads(nodekey.unseal(FILE.name, FILE.read_bytes()) or b"")["key"] == key
    )  # rewritten from /proc


def test_a_table_with_warnings_is_not_cached(fake_host) -> None:
    root, _ = fake_host("8x-mig")
    path = root / MIG_MINORS_PATH
    path.write_text(path.read_text() + "something new 7\n")
    inv = _load(root)
    assert any("skipped unexpected line" in w for w in inv.warnings)
    assert not FILE.exists()
    assert any("skipped unexpected line" in w for w in _load(root).warnings)  # still said every time


def test_no_cache_dir_no_boot_id_no_caching(fake_host) -> None:
    root, _ = fake_host("8x-mig")
    inventory.load(root, None, None, need_migs=False)
    (root / "proc/sys/kernel/random/boot_id").unlink()
    _load(root)
    assert not FILE.exists()


def test_a_rewritten_minors_record_without_the_node_seal_is_never_believed(fake_host) -> None:
    """Issue 36 item 1: a container with the host's /run rewrites the record (its key kept, a
    sibling's cap minor given to another name): without the node key's seal it is a miss, and the
    table is read from /proc again."""
    root, _ = fake_host("8x-mig")
    good = _load(root)
    doc = json.loads(nodekey.unseal(FILE.name, FILE.read_bytes()) or b"")
    doc["by_name"] = {name: minor + 1 for name, minor in doc["by_name"].items()}
    seal = FILE.read_bytes().split(b"\n", 1)[0]  # kept: only the bytes after it change
    FILE.write_bytes(seal + b"\n" + json.dumps(doc).encode())  # as root writes it: owner, mode the hook's
    FILE.chmod(0o600)
    assert inventory._cached_minors(CACHE, doc["key"]) is None  # the forged table is not read
    assert _load(root).caps == good.caps
    assert nodekey.unseal(FILE.name, FILE.read_bytes()) is not None  # rewritten, sealed
