"""The marker key's file handling (hook/adapters/marker.py), pinned by the fresh mutants of issue 24.

Rule: making or reading the node's key leaves nothing behind: no descriptor open in the hook
(the fast path runs in the same process afterwards) and no temporary file in the cache dir
(another hook lists that dir, and a stray ``.key.<pid>`` is never cleaned up). The key's trust
checks (owner, mode, symlinks, a writable dir) are in tests/test_precreate.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from hook.adapters import marker
from hook.adapters.marker import KEY_NAME, load_key


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_making_and_reading_the_key_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """s530669-027: ``_read_key`` without its ``os.close``."""
    cache = tmp_path / "cache"
    before = _fds()
    key = load_key(cache, create=True)  # makes it, then reads it back
    assert key is not None
    assert load_key(cache, create=True) == key  # reads the one in place
    assert load_key(cache, create=False) == key
    (cache / KEY_NAME).chmod(0o644)  # refused after the fstat: still closed
    assert load_key(cache, create=False) is None
    assert _fds() == before


def test_making_the_key_leaves_only_the_key_in_the_cache_dir(tmp_path: Path) -> None:
    """s530669-030: the private temporary name never unlinked after the link."""
    cache = tmp_path / "cache"
    assert load_key(cache, create=True) is not None
    assert os.listdir(cache) == [KEY_NAME]
    (cache / KEY_NAME).write_bytes(b"short")  # a bad key is replaced by rename
    assert load_key(cache, create=True) is not None
    assert os.listdir(cache) == [KEY_NAME]


def test_a_cache_dir_that_cannot_be_checked_is_not_safe(tmp_path: Path) -> None:
    """s530669-021: ``_safe_dir`` fails closed when lstat fails (the caller then trusts nothing)."""
    assert marker._safe_dir(tmp_path / "missing") is False
    assert marker._safe_dir(tmp_path) is True
