"""Issue 21, item 9: "already has exactly what it asked for" is exact, and a differing entry is
replaced the way the CDI reference library replaces it (runtime-tools ``generate``: ``AddDevice``
overwrites the first entry with the same path, ``RemoveMount`` drops the first with the same
destination; CDI ``ContainerEdits.Apply`` calls ``RemoveDevice`` before ``AddDevice``).

Pure cases on ``hook.sources.cdi.pending`` / ``specwriter.fold_cdi``, then the whole decision in
simulation (``hook --bundle`` with ``--output-config``) on a CDI annotation.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.specwriter import fold_cdi
from hook.sources.cdi.edits import CdiDeviceNode, ContainerEdits, Hook, Mount, apply_to_config
from hook.sources.cdi.pending import pending
from tests.bundles import DEFAULT_RULES, config, simulate, write_bundle

from .helpers import write_spec

PATH = "/dev/vendor1-dev1"
CDI_NODE = CdiDeviceNode(path=PATH, type="b", major=10, minor=1)
MOUNT = Mount(host_path="/opt/vendor/lib", container_path="/usr/lib/vendor", options=("ro", "bind"))


def _base(
    devices: list[dict[str, Any]] | None = None, mounts: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "process": {"env": ["A=1"], "user": {"uid": 0, "gid": 0}},
        "mounts": mounts or [],
        "linux": {"devices": devices or [], "resources": {"devices": []}},
    }


def _dev(kind: str, major: int, minor: int, path: str = PATH) -> dict[str, Any]:
    return {"path": path, "type": kind, "major": major, "minor": minor}


def test_another_device_at_the_path_is_not_the_node() -> None:
    cfg = _base([_dev("c", 1, 1)])
    edits = ContainerEdits(device_nodes=(CDI_NODE,))
    assert pending(cfg, edits) == edits
    out = fold_cdi(cfg, edits)
    assert [(d["path"], d["type"], d["major"], d["minor"]) for d in out["linux"]["devices"]] == [
        (PATH, "b", 10, 1)
    ]
    assert out["linux"]["resources"]["devices"] == [
        {"allow": True, "type": "b", "major": 10, "minor": 1, "access": "rwm"}
    ]


@pytest.mark.parametrize(("kind", "major", "minor"), [("c", 10, 1), ("b", 10, 2), ("b", 11, 1)])
def test_each_of_type_major_minor_counts(kind: str, major: int, minor: int) -> None:
    assert pending(_base([_dev(kind, major, minor)]), ContainerEdits(device_nodes=(CDI_NODE,))).device_nodes


def test_the_same_node_is_already_there_and_nothing_is_applied() -> None:
    cfg = _base([_dev("b", 10, 1)])
    edits = ContainerEdits(device_nodes=(CDI_NODE,), env=("A=1",))
    assert pending(cfg, edits).is_empty()
    assert fold_cdi(cfg, edits) is cfg


def test_only_the_first_entry_at_a_path_counts() -> None:
    """runc creates the first node at a path (a later mknod's EEXIST is ignored)."""
    assert pending(
        _base([_dev("c", 1, 1), _dev("b", 10, 1)]), ContainerEdits(device_nodes=(CDI_NODE,))
    ).device_nodes
    assert pending(
        _base([_dev("b", 10, 1), _dev("c", 1, 1)]), ContainerEdits(device_nodes=(CDI_NODE,))
    ).is_empty()


def test_two_entries_at_a_path_the_reference_removes_one_and_overwrites_the_next() -> None:
    other = _dev("c", 5, 5, "/dev/other")
    cfg = _base([_dev("c", 1, 1), other, _dev("c", 1, 2)])
    out = apply_to_config(cfg, ContainerEdits(device_nodes=(CDI_NODE,)))
    assert [(d["path"], d["major"], d["minor"]) for d in out["linux"]["devices"]] == [
        ("/dev/other", 5, 5),
        (PATH, 10, 1),
    ]


@pytest.mark.parametrize(
    "old",
    [
        {"destination": "/usr/lib/vendor", "source": "/elsewhere", "options": ["ro", "bind"]},
        {"destination": "/usr/lib/vendor", "source": "/opt/vendor/lib", "options": ["rw", "bind"]},
        {"destination": "/usr/lib/vendor", "source": "/opt/vendor/lib"},
        {
            "destination": "/usr/lib/vendor",
            "source": "/opt/vendor/lib",
            "options": ["ro", "bind"],
            "type": "tmpfs",
        },
    ],
    ids=["source", "options", "no-options", "type"],
)
def test_a_mount_at_the_destination_with_another_source_or_options_is_replaced(old: dict[str, Any]) -> None:
    cfg = _base(mounts=[{"destination": "/proc", "type": "proc", "source": "proc"}, old])
    edits = ContainerEdits(mounts=(MOUNT,))
    assert pending(cfg, edits) == edits
    out = fold_cdi(cfg, edits)
    mine = [m for m in out["mounts"] if m["destination"] == "/usr/lib/vendor"]
    assert mine == [
        {"destination": "/usr/lib/vendor", "source": "/opt/vendor/lib", "options": ["ro", "bind"]}
    ]


def test_the_same_mount_hook_and_env_are_not_applied_twice() -> None:
    hook = Hook(hook_name="createContainer", path="/usr/bin/vendor-hook", args=("vendor-hook", "x"))
    cfg = _base(
        mounts=[{"destination": "/usr/lib/vendor", "source": "/opt/vendor/lib", "options": ["ro", "bind"]}]
    )
    cfg["hooks"] = {"createContainer": [{"path": "/usr/bin/vendor-hook", "args": ["vendor-hook", "x"]}]}
    edits = ContainerEdits(mounts=(MOUNT,), hooks=(hook,), env=("A=1",))
    assert pending(cfg, edits).is_empty()
    partly = ContainerEdits(mounts=(MOUNT,), hooks=(hook,), env=("A=1", "B=2"), device_nodes=(CDI_NODE,))
    out = fold_cdi(copy.deepcopy(cfg), partly)  # what differs is applied, what is there is not repeated
    assert out["process"]["env"] == ["A=1", "B=2"]
    assert out["hooks"] == cfg["hooks"] and out["mounts"] == cfg["mounts"]
    assert [d["path"] for d in out["linux"]["devices"]] == [PATH]


# --- the whole decision (simulation), on a CDI annotation ----------------------------------------------


def _cdi_bundle(tmp_path: Path, present: dict[str, Any]) -> tuple[Path, list[str]]:
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "vendor1.com/dev",
        "devices": [{"name": "dev1", "containerEdits": {"deviceNodes": [_dev("b", 10, 1)]}}],
    }
    write_spec(tmp_path / "cdi", "vendor1.json", spec)
    rules = [*DEFAULT_RULES, {"allow": True, "type": "b", "major": 10, "minor": 1, "access": "rwm"}]
    cfg = config(devices=[present], rules=rules, annotations={"cdi.k8s.io/dev": "vendor1.com/dev=dev1"})
    (tmp_path / "root").mkdir()
    args = ["--cdi-spec-dir", str(tmp_path / "cdi"), "--driver-root", str(tmp_path / "root")]
    return write_bundle(tmp_path / "bundle", cfg), args


def test_a_config_with_another_device_at_the_path_is_not_already_served(tmp_path: Path, capsys: Any) -> None:
    bundle, args = _cdi_bundle(tmp_path, {**_dev("c", 1, 1), "fileMode": 0o666})
    out = tmp_path / "out.json"
    rc, rep, err = simulate(bundle, *args, "--output-config", str(out), capsys=capsys)
    assert (rc, err) == (0, "")
    assert rep["verdict"] == "apply" and "already has" not in rep["reason"], rep["reason"]
    assert [(n["path"], n["type"], n["major"], n["minor"]) for n in rep["nodes"]["create"]] == [
        (PATH, "b", 10, 1)
    ]
    assert rep["nodes"]["remove"] == [PATH]
    decided = json.loads(out.read_text())
    assert [
        (d["type"], d["major"], d["minor"]) for d in decided["linux"]["devices"] if d["path"] == PATH
    ] == [("b", 10, 1)]


def test_a_config_with_the_very_node_is_already_served(tmp_path: Path, capsys: Any) -> None:
    bundle, args = _cdi_bundle(tmp_path, {**_dev("b", 10, 1), "fileMode": 0o666})
    rc, rep, err = simulate(bundle, *args, capsys=capsys)
    assert (rc, err, rep["verdict"]) == (0, "", "none")
    assert rep["reason"] == "the container already has exactly what it asked for"


def test_odd_json_values_in_the_config_are_compared_not_raised_on() -> None:
    """A config's env, hooks and gids may hold any JSON value (runc never reads some of them):
    comparing against them must not raise (an unhashable value once made a traceback)."""
    hook = Hook(hook_name="prestart", path="/x")
    cfg = _base()
    cfg["process"]["env"] = [{"a": 1}, "A=1"]
    cfg["process"]["user"]["additionalGids"] = [[1], 5]
    cfg["hooks"] = {"prestart": [{"path": {"x": 1}, "args": [{}]}, "junk"], "poststop": "junk"}
    rest = pending(cfg, ContainerEdits(env=("A=1",), hooks=(hook,), additional_gids=(5, 6)))
    assert (rest.env, rest.hooks, rest.additional_gids) == ((), (hook,), (6,))


def test_u_is_a_char_device_as_runc_reads_it() -> None:
    node = CdiDeviceNode(path=PATH, type="c", major=10, minor=1)
    assert pending(_base([_dev("u", 10, 1)]), ContainerEdits(device_nodes=(node,))).is_empty()
    assert pending(_base([_dev("u", 10, 1)]), ContainerEdits(device_nodes=(CDI_NODE,))).device_nodes
