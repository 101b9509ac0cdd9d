"""Parsed-spec cache: hits, invalidation, corrupt and foreign caches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hook.sources.cdi import cache
from hook.sources.cdi import registry as registry_mod
from hook.sources.cdi.registry import Registry

from .helpers import base_spec, device, write_spec


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every spec file actually parsed (cache misses)."""
    seen: list[str] = []
    real = registry_mod._parse_file

    def spy(path: str):  # type: ignore[no-untyped-def]
        seen.append(path)
        return real(path)

    monkeypatch.setattr(registry_mod, "_parse_file", spy)
    return seen


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    specs, cdir = tmp_path / "specs", tmp_path / "cache"
    spec = write_spec(specs, "a.json", base_spec(devices=[device("d0", env=["V=1"])]))
    write_spec(
        specs,
        "b.yaml",
        "cdiVersion: 0.3.0\nkind: other.com/x\ndevices: [{name: e, containerEdits: {env: [E=1]}}]\n",
    )
    return specs, cdir, spec


def test_warm_load_parses_nothing(tmp_path: Path, parses: list[str]) -> None:
    specs, cdir, _ = _setup(tmp_path)
    Registry.load([specs], cache_dir=cdir)
    assert len(parses) == 2
    cache_file = cdir / cache.CACHE_NAME
    assert cache_file.stat().st_mode & 0o777 == 0o600
    parses.clear()
    registry = Registry.load([specs], cache_dir=cdir)
    assert parses == []
    assert registry.resolve(["vendor.com/dev=d0", "other.com/x=e"]).env == ("V=1", "E=1")
    assert parses == []


def test_mtime_change_invalidates_one_file(tmp_path: Path, parses: list[str]) -> None:
    specs, cdir, spec = _setup(tmp_path)
    Registry.load([specs], cache_dir=cdir)
    parses.clear()
    st = spec.stat()
    os.utime(spec, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    Registry.load([specs], cache_dir=cdir)
    assert parses == [str(spec)]


def test_size_change_is_seen(tmp_path: Path, parses: list[str]) -> None:
    specs, cdir, spec = _setup(tmp_path)
    Registry.load([specs], cache_dir=cdir)
    st = spec.stat()
    write_spec(specs, "a.json", base_spec(devices=[device("d0", env=["V=22"])]))
    os.utime(spec, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, new size
    parses.clear()
    registry = Registry.load([specs], cache_dir=cdir)
    assert parses == [str(spec)]
    assert registry.resolve(["vendor.com/dev=d0"]).env == ("V=22",)


def test_removed_file_drops_out(tmp_path: Path) -> None:
    specs, cdir, spec = _setup(tmp_path)
    Registry.load([specs], cache_dir=cdir)
    spec.unlink()
    assert list(Registry.load([specs], cache_dir=cdir).devices) == ["other.com/x=e"]
    header = json.loads((cdir / cache.CACHE_NAME).read_bytes().split(b"\n")[1])  # after the seal line
    assert list(header["files"]) == [str(specs / "b.yaml")]


def test_broken_file_error_is_cached(tmp_path: Path, parses: list[str]) -> None:
    specs, cdir, _ = _setup(tmp_path)
    bad = write_spec(specs, "c.json", "{")
    first = Registry.load([specs], cache_dir=cdir).errors
    parses.clear()
    second = Registry.load([specs], cache_dir=cdir).errors
    assert parses == [] and first == second and str(bad) in second


@pytest.mark.parametrize(
    "content",
    [
        b"garbage",
        b"",
        b'{"magic": "something-else", "version": 1, "size": 0, "files": {}}\n',
        b'{"magic": "oci-device-hook/cdi-cache", "version": 999, "size": 0, "files": {}}\n',
        b'{"magic": "oci-device-hook/cdi-cache", "version": 1, "size": 5, "files": {}}\n',
        b'{"magic": "oci-device-hook/cdi-cache", "version": 1, "size": 0, "files": {"x": {"key": 1}}}\n',
    ],
    ids=["garbage", "empty", "foreign magic", "wrong version", "truncated", "bad entry"],
)
def test_corrupt_or_foreign_cache_is_ignored_and_rebuilt(
    tmp_path: Path, parses: list[str], content: bytes
) -> None:
    specs, cdir, _ = _setup(tmp_path)
    cdir.mkdir()
    (cdir / cache.CACHE_NAME).write_bytes(content)
    os.chmod(cdir / cache.CACHE_NAME, 0o600)
    registry = Registry.load([specs], cache_dir=cdir)
    assert len(parses) == 2 and len(registry.devices) == 2
    assert cache.read(cdir / cache.CACHE_NAME) is not None  # rebuilt


def test_world_writable_cache_not_trusted(tmp_path: Path, parses: list[str]) -> None:
    specs, cdir, _ = _setup(tmp_path)
    Registry.load([specs], cache_dir=cdir)
    os.chmod(cdir / cache.CACHE_NAME, 0o666)
    parses.clear()
    Registry.load([specs], cache_dir=cdir)
    assert len(parses) == 2


def test_tampered_body_is_rechecked(tmp_path: Path, parses: list[str]) -> None:
    specs, cdir, spec = _setup(tmp_path)
    Registry.load([specs], cache_dir=cdir)
    path = cdir / cache.CACHE_NAME
    path.write_bytes(path.read_bytes().replace(b'"V=1"', b'"V:1"'))  # same length, now invalid env
    parses.clear()
    registry = Registry.load([specs], cache_dir=cdir)
    assert registry.resolve(["vendor.com/dev=d0"]).env == ("V=1",)
    assert parses == [str(spec)]


def test_unwritable_cache_dir_still_loads(tmp_path: Path) -> None:
    specs, _cdir, _ = _setup(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert len(Registry.load([specs], cache_dir=blocker / "sub").devices) == 2
