"""The marker key's file handling (hook/adapters/marker.py), pinned by the fresh mutants of issue 24.

Rule: making or reading the node's key leaves nothing behind: no descriptor open in the hook
(the fast path runs in the same process afterwards) and no temporary file in the cache dir
(another hook lists that dir, and a stray ``.key.<pid>`` is never cleaned up). The key's trust
checks (owner, mode, symlinks, a writable dir) are in tests/test_precreate.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hook.adapters import marker
from hook.adapters.marker import KEY_NAME, load_key
from hook.core.oci import OciConfig, parse_config


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


# --- issue 31: the marker binds every number of every node -------------------------------------------

NODE_FIELDS = {
    "minor": 2,  # /dev/nvidia1 now opens GPU 2
    "major": 237,  # ...or a capability
    "type": "b",
    "path": "/dev/nvidia9",
    "fileMode": 0o600,
    "uid": 1000,
    "gid": 1000,
}


def _slice_config(signed: str = "", **node: object) -> OciConfig:
    """The slice pod's decided config (its card /dev/nvidia1 and the control node), ``node``
    changing the card, ``signed`` as its marker."""
    owner = {"fileMode": 0o666, "uid": 0, "gid": 0}
    card = {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, **owner}
    ctl = {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, **owner}
    rules = [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rw"},
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rw"},
    ]
    doc = {
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {"args": ["sh"], "cwd": "/"},
        "linux": {"devices": [{**card, **node}, ctl], "resources": {"devices": rules}},
        "annotations": {marker.ANNOTATION: signed} if signed else {},
    }
    return parse_config(json.dumps(doc).encode(), "/b/config.json", "/b")


@pytest.mark.parametrize("field", sorted(NODE_FIELDS))
def test_a_node_changed_after_the_decision_voids_the_marker(field: str) -> None:
    """A decided config whose node now names another device (another GPU's minor, another major,
    a block node, another path, other owner or mode) is not the config that was decided: its
    marker must not verify, so the prestart hook and precreate decide it again."""
    key = b"k" * marker.KEY_BYTES
    decided = _slice_config()
    signed = marker.sign(key, decided, "{}")
    assert marker.verify(key, _slice_config(signed), "{}")  # the control: it holds as decided
    moved = _slice_config(signed, **{field: NODE_FIELDS[field]})
    assert not marker.verify(key, moved, "{}"), f"a node whose {field} changed kept its marker"
