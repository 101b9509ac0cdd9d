"""#11 item 3: the hook's own files under its cache directory are never trusted blindly.

Every case of the issue, for each cache kept there (the fast-path settings record, the CDI
parsed-spec cache, the NVIDIA inventory cache): a FIFO, a ``/dev/zero`` symlink, a huge sparse
file, a group-writable or foreign-owned file, a symlinked or shared directory, a truncated or
foreign record, a record of another hook version with an extra key, a planted temp-file
symlink, stale temp files. Each must be a miss that is rebuilt, in well under a second, and
never an error or a write through a link.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hook.core import settings as core_settings
from hook.core.version import VERSION
from hook.routes import fastpath
from hook.sources import cachefile, nodekey
from hook.sources import settingsfile as settings
from hook.sources.cdi import cache as cdi_cache
from hook.sources.cdi.registry import Registry
from tests.cdi.helpers import base_spec, device, write_spec

NOBODY = 65534


@pytest.fixture(autouse=True)
def deadline() -> Iterator[None]:
    """A read that blocks (a FIFO) fails the test instead of hanging the suite."""

    def boom(*_: object) -> None:
        raise TimeoutError("blocked on a cache file")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fast-path record lives in ``run_dir`` for this test."""
    target = tmp_path / "run" / "fastpath.json"
    monkeypatch.setattr(fastpath, "FASTPATH_CACHE", str(target))
    monkeypatch.setattr(settings, "FASTPATH_CACHE", target)
    return target.parent


def custom_settings(tmp_path: Path, text: str = "cdi_annotation_prefixes: [example.com/cdi-]\n") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def compile_record(path: Path) -> None:
    assert settings.remember_for_fast_path(path, settings.load_settings(path)) is None
    assert fastpath.fast_settings(str(path)) == (("example.com/cdi-",), fastpath.DEFAULT_MOUNT_ROOT)


# --- what may be planted in place of a record --------------------------------------------------


def fifo(p: Path) -> None:
    os.mkfifo(p, 0o600)


def dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(8 << 30)  # 8 GiB of holes: a read would eat gigabytes
    p.chmod(0o600)


def group_writable(p: Path) -> None:
    p.chmod(0o620)


def foreign_owner(p: Path) -> None:
    os.chown(p, NOBODY, NOBODY)


def truncated(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-7])


def truncated_in_escape(p: Path) -> None:
    p.write_bytes(b'{"kind": "fastpath", "files": {"\\u00')  # the C scanner's SystemError case


def garbage(p: Path) -> None:
    p.write_bytes(b"\x00\xff{{{not json")


def empty(p: Path) -> None:
    p.write_bytes(b"")


def other_files_content(p: Path) -> None:
    p.write_bytes(b'{"kind": "inventory", "format": 1, "hook": "0.1.0", "key": {}, "inventory": {}}')


def symlink_to_good_copy(p: Path) -> None:
    copy = p.with_name("elsewhere.json")
    copy.write_bytes(p.read_bytes())
    copy.chmod(0o600)
    p.unlink()
    p.symlink_to(copy)


REPLACE = {
    "fifo": lambda p: (p.unlink(), fifo(p)),
    "dev-zero-symlink": lambda p: (p.unlink(), dev_zero(p)),
    "huge-sparse": lambda p: (p.unlink(), sparse(p)),
    "group-writable": group_writable,
    "foreign-owner": foreign_owner,
    "truncated": truncated,
    "truncated-in-escape": truncated_in_escape,
    "garbage": garbage,
    "empty": empty,
    "other-files-content": other_files_content,
    "symlink": symlink_to_good_copy,
}
CASES = pytest.mark.parametrize("plant", list(REPLACE.values()), ids=list(REPLACE))


@CASES
def test_fast_path_record_planted_is_a_quick_miss(
    tmp_path: Path, run_dir: Path, plant: Callable[[Path], object]
) -> None:
    path = custom_settings(tmp_path)
    compile_record(path)
    plant(run_dir / "fastpath.json")
    start = time.monotonic()
    assert fastpath.fast_settings(str(path)) is None  # the full path decides, and rewrites
    assert settings.load_settings(path).cdi_annotation_prefixes == ("example.com/cdi-",)
    assert time.monotonic() - start < 2
    assert settings.remember_for_fast_path(path, settings.load_settings(path)) is None
    assert fastpath.fast_settings(str(path)) == (("example.com/cdi-",), fastpath.DEFAULT_MOUNT_ROOT)
    assert (run_dir / "fastpath.json").is_file() and not (run_dir / "fastpath.json").is_symlink()


@CASES
def test_cdi_cache_planted_is_a_quick_miss(tmp_path: Path, plant: Callable[[Path], object]) -> None:
    specs, cdir = tmp_path / "specs", tmp_path / "cache"
    write_spec(specs, "a.json", base_spec(devices=[device("d0", env=["V=1"])]))
    Registry.load([specs], cache_dir=cdir)
    assert cdi_cache.read(cdir / cdi_cache.CACHE_NAME) is not None
    plant(cdir / cdi_cache.CACHE_NAME)
    start = time.monotonic()
    registry = Registry.load([specs], cache_dir=cdir)
    assert registry.resolve(["vendor.com/dev=d0"]).env == ("V=1",)
    assert time.monotonic() - start < 2
    assert cdi_cache.read(cdir / cdi_cache.CACHE_NAME) is not None  # rebuilt


def test_record_of_another_version_with_an_extra_key_is_rewritten(tmp_path: Path, run_dir: Path) -> None:
    """A rollback leaves a record whose settings carry a key this hook does not know."""
    path = custom_settings(tmp_path, "privileged_allocation: reject\n")
    doc = core_settings.document(core_settings.Settings())
    fmt_now = fastpath.FASTPATH_FORMAT
    for version, fmt in (("9.9.9", fmt_now), ("0.1.0", fmt_now), ("0.0.1", 1)):
        record = {
            "kind": "fastpath",
            "format": fmt,
            "hook": version if version != "0.1.0" else VERSION,
            "files": {
                str(path): {
                    "digest": nodekey.digest(path.read_bytes()),
                    "cdi_annotation_prefixes": ["cdi.k8s.io/"],
                    "volume_mount_root": "/x",
                    "settings": {**doc, "new_knob_of_another_version": True},
                }
            },
        }
        run_dir.mkdir(mode=0o700, exist_ok=True)
        (run_dir / "fastpath.json").write_bytes(
            nodekey.seal("fastpath.json", json.dumps(record).encode()) or b""
        )
        (run_dir / "fastpath.json").chmod(0o600)
        assert settings.load_settings(path).privileged_allocation is settings.Policy.REJECT
        assert settings.remember_for_fast_path(path, settings.load_settings(path)) is None
        rewritten = json.loads(
            nodekey.unseal("fastpath.json", (run_dir / "fastpath.json").read_bytes()) or b""
        )
        assert rewritten["hook"] == VERSION
        assert "new_knob_of_another_version" not in rewritten["files"][str(path)]["settings"]


def test_old_single_file_record_is_a_miss(tmp_path: Path, run_dir: Path) -> None:
    path = custom_settings(tmp_path)
    st = path.stat()
    run_dir.mkdir(mode=0o700)
    old = {
        "key": [str(path), st.st_size, st.st_mtime_ns, st.st_ino],
        "cdi_annotation_prefixes": ["x/"],
        "volume_mount_root": "/y",
        "settings": {},
    }
    (run_dir / "fastpath.json").write_text(json.dumps(old))
    (run_dir / "fastpath.json").chmod(0o600)
    assert fastpath.fast_settings(str(path)) is None


def test_several_settings_files_keep_their_records(tmp_path: Path, run_dir: Path) -> None:
    """#16: two engines (or test runs) with their own settings do not evict each other."""
    paths = []
    for n in range(3):
        (tmp_path / f"s{n}").mkdir()
        paths.append(custom_settings(tmp_path / f"s{n}", f"cdi_annotation_prefixes: [p{n}.io/]\n"))
    for p in paths:
        assert settings.remember_for_fast_path(p, settings.load_settings(p)) is None
    assert [fastpath.fast_settings(str(p)) for p in paths] == [
        ((f"p{n}.io/",), fastpath.DEFAULT_MOUNT_ROOT) for n in range(3)
    ]


# --- the directory ---------------------------------------------------------------------------


def test_symlinked_directory_is_not_followed(tmp_path: Path, run_dir: Path) -> None:
    path = custom_settings(tmp_path)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    run_dir.symlink_to(real)
    assert settings.remember_for_fast_path(path, settings.load_settings(path)) is not None  # a warning
    assert list(real.iterdir()) == []  # nothing written through the link
    # even a good record behind the link is not read
    compile_target = tmp_path / "direct"
    assert cachefile.write(str(compile_target), "x", b"{}") is None
    os.rename(compile_target / "x", real / "fastpath.json")
    assert fastpath.fast_settings(str(path)) is None


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o770])
def test_directory_open_to_others_is_not_trusted_then_narrowed(
    tmp_path: Path, run_dir: Path, mode: int
) -> None:
    path = custom_settings(tmp_path)
    compile_record(path)
    run_dir.chmod(mode)
    assert fastpath.fast_settings(str(path)) is None
    assert settings.remember_for_fast_path(path, settings.load_settings(path)) is None
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert fastpath.fast_settings(str(path)) is not None


def test_directory_of_another_user_is_never_used(tmp_path: Path, run_dir: Path) -> None:
    path = custom_settings(tmp_path)
    compile_record(path)
    os.chown(run_dir, NOBODY, NOBODY)
    assert fastpath.fast_settings(str(path)) is None
    assert settings.remember_for_fast_path(path, settings.load_settings(path)) is not None
    assert run_dir.stat().st_uid == NOBODY


def test_new_directory_is_0700(tmp_path: Path) -> None:
    assert cachefile.write(str(tmp_path / "new"), "f", b"x") is None
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "new" / "f").stat().st_mode & 0o777 == 0o600


# --- temp files ------------------------------------------------------------------------------


def test_planted_temp_symlink_never_makes_root_overwrite_a_file(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temp name is unpredictable and created O_EXCL|O_NOFOLLOW: even a guessed name is safe."""
    path = custom_settings(tmp_path)
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    victim.chmod(0o600)
    run_dir.mkdir(mode=0o700)
    monkeypatch.setattr(os, "urandom", lambda n: b"\x00" * n)
    for name in (f".fastpath.json.{os.getpid()}", f".fastpath.json.{os.getpid()}.00000000.tmp"):
        (run_dir / name).symlink_to(victim)
    settings.remember_for_fast_path(path, settings.load_settings(path))
    assert victim.read_text() == "root:secret\n"


def test_stale_temp_files_are_swept_fresh_ones_kept(tmp_path: Path) -> None:
    d = tmp_path / "c"
    assert cachefile.write(str(d), "f", b"1") is None
    stale, fresh = d / ".f.1.aaaa.tmp", d / ".f.2.bbbb.tmp"
    stale.write_text("left by a killed hook")
    fresh.write_text("another hook is writing")
    old = time.time() - cachefile.STALE_TEMP_S - 5
    os.utime(stale, (old, old))
    assert cachefile.write(str(d), "f", b"2") is None
    assert sorted(p.name for p in d.iterdir()) == [".f.2.bbbb.tmp", "f"]


def test_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    d = tmp_path / "c"
    (d / "f").mkdir(parents=True)  # rename over a directory fails
    d.chmod(0o700)
    assert cachefile.write(str(d), "f", b"1") is not None
    assert [p.name for p in d.iterdir()] == ["f"]


def test_writes_and_reads_leave_no_descriptor_open(tmp_path: Path) -> None:
    """Issue 24 (fresh mutant s530669-041: ``write`` without its ``os.close(dfd)``): the hook's
    process goes on after a cache write (the fast path, the decider), so a leaked directory fd
    per write adds up; success and failure both close everything."""
    d = tmp_path / "c"
    before = set(os.listdir("/proc/self/fd"))
    assert cachefile.write(str(d), "f", b"1") is None
    assert cachefile.read(str(d), "f", 100) == b"1"
    (d / "g").mkdir()  # rename over a directory fails
    assert cachefile.write(str(d), "g", b"1") is not None
    assert set(os.listdir("/proc/self/fd")) == before


# --- issue 36 item 1: a record is the node key's, and a cache of the settings file's bytes ------


def _sealed_record(path: Path, compiled_from: bytes, text_settings: dict[str, object]) -> bytes:
    doc = {**core_settings.document(core_settings.Settings()), **text_settings}
    entry = {
        "digest": nodekey.digest(compiled_from),
        "cdi_annotation_prefixes": ["cdi.k8s.io/"],
        "volume_mount_root": "/x",
        "settings": doc,
    }
    record = {**cachefile.stamp("fastpath", fastpath.FASTPATH_FORMAT), "files": {str(path): entry}}
    return nodekey.seal("fastpath.json", json.dumps(record).encode()) or b""


def test_a_sealed_entry_for_other_bytes_of_the_file_is_a_miss(tmp_path: Path, run_dir: Path) -> None:
    """The compiled settings are a cache of this file's bytes: an entry the node's key sealed, but
    compiled from other bytes at this path (a replayed or stale record), never stands in for the file."""
    path = custom_settings(tmp_path, "privileged_allocation: reject\n")
    run_dir.mkdir(mode=0o700)
    forged = _sealed_record(path, b"privileged_allocation: audit\n", {"privileged_allocation": "audit"})
    (run_dir / "fastpath.json").write_bytes(forged)
    (run_dir / "fastpath.json").chmod(0o600)
    assert settings.load_settings(path).privileged_allocation is settings.Policy.REJECT
    assert fastpath.fast_settings(str(path)) is None
    honest = _sealed_record(path, path.read_bytes(), {"privileged_allocation": "reject"})
    (run_dir / "fastpath.json").write_bytes(honest)  # the same record over these bytes is believed
    assert fastpath.fast_settings(str(path)) == (("cdi.k8s.io/",), "/x")


def test_an_unsealed_record_is_a_miss_even_when_ours(tmp_path: Path, run_dir: Path) -> None:
    """Owner and mode prove nothing (a uid-0 container with the host's /run writes as root): a
    record without this node's seal, or sealed by another key, is a miss and is rewritten."""
    path = custom_settings(tmp_path)
    compile_record(path)
    record = run_dir / "fastpath.json"
    plain = nodekey.unseal("fastpath.json", record.read_bytes()) or b""
    record.write_bytes(plain)
    assert fastpath.fast_settings(str(path)) is None
    other = nodekey.SEAL + nodekey.mac(bytes(32), b"odh-record-v1", b"fastpath.json", plain).hex().encode()
    record.write_bytes(other + b"\n" + plain)
    assert fastpath.fast_settings(str(path)) is None
    compile_record(path)  # the full path rewrites it under the node's key
    assert nodekey.unseal("fastpath.json", record.read_bytes()) is not None


def test_no_node_key_means_no_cache_read_or_written(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose key cannot be had (here: its dir's parent is a file) decides without caches:
    a sealed record there is not believed, and none is written."""
    path = custom_settings(tmp_path)
    compile_record(path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr(nodekey, "KEY_DIR", str(blocker / "keys"))
    assert fastpath.fast_settings(str(path)) is None
    assert cachefile.read(str(run_dir), "fastpath.json", 1 << 20) is None
    warning = cachefile.write(str(tmp_path / "cache"), "x.json", b"{}")
    assert warning is not None and "no node key" in warning
    assert not (tmp_path / "cache" / "x.json").exists()
