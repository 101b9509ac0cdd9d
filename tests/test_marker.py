"""The precreate marker (hook/adapters/marker.py) and the node key's file handling it relies on
(hook/sources/nodekey.py), pinned by the fresh mutants of issue 24.

Rule: making or reading the node's key leaves nothing behind: no descriptor open in the hook
(the fast path runs in the same process afterwards) and no temporary file in the key dir. The
key's trust checks (owner, mode, symlinks, a writable dir) are in tests/test_precreate.py and
tests/test_decider.py. A marker holds only for the config, pod, settings and container it was made for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hook.adapters import marker
from hook.core.oci import OciConfig, parse_config
from hook.sources.nodekey import KEY_BYTES, KEY_NAME, make_key, read_key


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_making_and_reading_the_key_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """s530669-027: the key read without its ``os.close``."""
    keys = tmp_path / "keys"
    before = _fds()
    key = make_key(str(keys))  # makes it, then reads it back
    assert make_key(str(keys)) == key  # reads the one in place
    assert read_key(str(keys)) == key
    (keys / KEY_NAME).chmod(0o644)  # refused after the fstat: still closed
    assert read_key(str(keys)) is None
    assert _fds() == before


def test_making_the_key_leaves_only_the_key_in_its_dir(tmp_path: Path) -> None:
    """s530669-030: the private temporary name never unlinked after the link."""
    keys = tmp_path / "keys"
    make_key(str(keys))
    assert os.listdir(keys) == [KEY_NAME]
    (keys / KEY_NAME).write_bytes(b"short")  # a bad key is replaced by rename
    make_key(str(keys))
    assert os.listdir(keys) == [KEY_NAME]


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


def _slice_config(signed: str = "", cgroups: str = "/kubepods/pod1/ctr-a", **node: object) -> OciConfig:
    """The slice pod's decided config (its card /dev/nvidia1 and the control node), ``node``
    changing the card, ``signed`` as its marker, ``cgroups`` its ``linux.cgroupsPath``."""
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
    doc["linux"]["cgroupsPath"] = cgroups  # type: ignore[index]
    return parse_config(json.dumps(doc).encode(), "/b/config.json", "/b")


@pytest.mark.parametrize("field", sorted(NODE_FIELDS))
def test_a_node_changed_after_the_decision_voids_the_marker(field: str) -> None:
    """A decided config whose node now names another device (another GPU's minor, another major,
    a block node, another path, other owner or mode) is not the config that was decided: its
    marker must not verify, so the prestart hook and precreate decide it again."""
    key = b"k" * KEY_BYTES
    decided = _slice_config()
    signed = marker.sign(key, decided, "{}", "ctr-a") or ""
    assert marker.verify(key, _slice_config(signed), "{}", "ctr-a")  # the control: it holds as decided
    moved = _slice_config(signed, **{field: NODE_FIELDS[field]})
    assert not marker.verify(key, moved, "{}", "ctr-a"), f"a node whose {field} changed kept its marker"


# --- issue 36 item 4: a marker is one container's --------------------------------------------------


def test_a_marker_holds_only_for_the_container_it_was_made_for() -> None:
    """Made with the container's id (the wrapper knows it): another id, or another cgroupsPath,
    with the very same nodes, rules, pod evidence and settings, does not verify."""
    key = b"k" * KEY_BYTES
    signed = marker.sign(key, _slice_config(), "{}", "ctr-a") or ""
    assert signed.startswith("v3:") and marker.verify(key, _slice_config(signed), "{}", "ctr-a")
    assert not marker.verify(key, _slice_config(signed), "{}", "ctr-b")
    assert not marker.verify(key, _slice_config(signed, cgroups="/kubepods/pod1/ctr-b"), "{}", "ctr-a")
    assert not marker.verify(b"x" * KEY_BYTES, _slice_config(signed), "{}", "ctr-a")  # another node's key


def test_a_marker_made_without_the_id_is_bound_to_the_cgroups_path() -> None:
    """hooks.d precreate does not know the id: its marker binds the engine-written cgroupsPath,
    which names the container; with neither there is nothing to bind, so no marker is made."""
    key = b"k" * KEY_BYTES
    signed = marker.sign(key, _slice_config(), "{}", "") or ""
    assert marker.verify(key, _slice_config(signed), "{}", "ctr-a")  # prestart: its own id, same cgroup
    assert not marker.verify(key, _slice_config(signed, cgroups="/kubepods/pod1/ctr-b"), "{}", "ctr-a")
    assert marker.sign(key, _slice_config(cgroups=""), "{}", "") is None
    unbound = marker.sign(key, _slice_config(cgroups=""), "{}", "ctr-a") or ""
    assert not marker.verify(key, _slice_config(unbound, cgroups=""), "{}", "ctr-b")
