"""Injection table: OCI config in + specs + requested devices → expected config out."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.core.plan import Node
from hook.core.rules import Access, DeviceType, Rule
from hook.sources.cdi.edits import (
    CdiDeviceNode,
    ContainerEdits,
    IntelRdt,
    apply_to_config,
    go_clean,
    merge,
    to_nodes_and_rules,
)
from hook.sources.cdi.registry import Registry

from .helpers import write_spec

KIND = "vendor.com/dev"


def spec(
    devices: dict[str, dict[str, Any]],
    edits: dict[str, Any] | None = None,
    version: str = "1.1.0",
    kind: str = KIND,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cdiVersion": version,
        "kind": kind,
        "devices": [{"name": n, "containerEdits": e} for n, e in devices.items()],
    }
    if edits is not None:
        doc["containerEdits"] = edits
    return doc


def node(path: str, major: int, minor: int, **extra: Any) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, **extra}


def rule(major: int, minor: int, access: str = "rwm", type_: str = "c") -> dict[str, Any]:
    return {"allow": True, "type": type_, "major": major, "minor": minor, "access": access}


def dev(path: str, major: int, minor: int, **extra: Any) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, **extra}


@dataclass(frozen=True)
class Injection:
    name: str
    config: dict[str, Any]
    specs: dict[str, dict[str, Any]]  # file name → spec (one dir)
    request: tuple[str, ...]
    expected: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


GPU_SPEC = spec(
    {
        "0": {"deviceNodes": [node("/dev/nvidia0", 195, 0)]},
        "1": {"deviceNodes": [node("/dev/nvidia1", 195, 1)]},
    },
    {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": [node("/dev/nvidiactl", 195, 255)]},
    kind="nvidia.com/gpu",
)
BASE = {"process": {"env": ["PATH=/bin"]}}

CASES = [
    Injection(
        "env appended",
        BASE,
        {"a.json": spec({"d": {"env": ["A=1"]}})},
        (f"{KIND}=d",),
        {"process": {"env": ["PATH=/bin", "A=1"]}},
    ),
    Injection(
        "env replaces existing key in place",
        {"process": {"env": ["FOO=old", "BAR=old"]}},
        {"a.json": spec({"d": {"env": ["FOO=new"]}})},
        (f"{KIND}=d",),
        {"process": {"env": ["FOO=new", "BAR=old"]}},
    ),
    Injection(
        "env duplicate in one batch, last wins",
        {},
        {"a.json": spec({"d": {"env": ["FOO=old", "FOO=new"]}})},
        (f"{KIND}=d",),
        {"process": {"env": ["FOO=new"]}},
    ),
    Injection(
        "spec env before device env",
        {},
        {"a.json": spec({"d": {"env": ["B=2"]}}, {"env": ["A=1"]})},
        (f"{KIND}=d",),
        {"process": {"env": ["A=1", "B=2"]}},
    ),
    Injection(
        "spec edits once for two devices of one spec",
        {},
        {"g.json": GPU_SPEC},
        ("nvidia.com/gpu=0", "nvidia.com/gpu=1"),
        {
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
            "linux": {
                "devices": [
                    dev("/dev/nvidiactl", 195, 255),
                    dev("/dev/nvidia0", 195, 0),
                    dev("/dev/nvidia1", 195, 1),
                ],
                "resources": {"devices": [rule(195, 255), rule(195, 0), rule(195, 1)]},
            },
        },
    ),
    Injection(
        "duplicate request is applied once",
        {},
        {"g.json": GPU_SPEC},
        ("nvidia.com/gpu=0", "nvidia.com/gpu=0"),
        {
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
            "linux": {
                "devices": [dev("/dev/nvidiactl", 195, 255), dev("/dev/nvidia0", 195, 0)],
                "resources": {"devices": [rule(195, 255), rule(195, 0)]},
            },
        },
    ),
    Injection(
        "rules appended after existing ones",
        {"linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}}},
        {"a.json": spec({"d": {"deviceNodes": [node("/dev/x", 1, 3)]}})},
        (f"{KIND}=d",),
        {
            "linux": {
                "devices": [dev("/dev/x", 1, 3)],
                "resources": {"devices": [{"allow": False, "access": "rwm"}, rule(1, 3)]},
            }
        },
    ),
    Injection(
        "device replaced by path",
        {"linux": {"devices": [dev("/dev/x", 9, 9), dev("/dev/y", 2, 2)]}},
        {"a.json": spec({"d": {"deviceNodes": [node("/dev/x", 1, 3)]}})},
        (f"{KIND}=d",),
        {
            "linux": {
                "devices": [dev("/dev/y", 2, 2), dev("/dev/x", 1, 3)],
                "resources": {"devices": [rule(1, 3)]},
            }
        },
    ),
    Injection(
        "permissions none gives empty access",
        {},
        {"a.json": spec({"d": {"deviceNodes": [node("/dev/x", 1, 3, permissions="none")]}})},
        (f"{KIND}=d",),
        {"linux": {"devices": [dev("/dev/x", 1, 3)], "resources": {"devices": [rule(1, 3, "")]}}},
    ),
    Injection(
        "permissions rw kept verbatim",
        {},
        {"a.json": spec({"d": {"deviceNodes": [node("/dev/x", 1, 3, permissions="rw")]}})},
        (f"{KIND}=d",),
        {"linux": {"devices": [dev("/dev/x", 1, 3)], "resources": {"devices": [rule(1, 3, "rw")]}}},
    ),
    Injection(
        "block device rule",
        {},
        {"a.json": spec({"d": {"deviceNodes": [{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}]}})},
        (f"{KIND}=d",),
        {
            "linux": {
                "devices": [{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}],
                "resources": {"devices": [rule(8, 0, type_="b")]},
            }
        },
    ),
    Injection(
        "fifo gets no cgroup rule",
        {},
        {"a.json": spec({"d": {"deviceNodes": [{"path": "/dev/f", "type": "p"}]}})},
        (f"{KIND}=d",),
        {"linux": {"devices": [{"path": "/dev/f", "type": "p"}]}},
    ),
    Injection(
        "uid and gid default to process user",
        {"process": {"user": {"uid": 1000, "gid": 100}}},
        {"a.json": spec({"d": {"deviceNodes": [node("/dev/x", 1, 3)]}})},
        (f"{KIND}=d",),
        {
            "process": {"user": {"uid": 1000, "gid": 100}},
            "linux": {
                "devices": [dev("/dev/x", 1, 3, uid=1000, gid=100)],
                "resources": {"devices": [rule(1, 3)]},
            },
        },
    ),
    Injection(
        "explicit uid wins over process user",
        {"process": {"user": {"uid": 1000, "gid": 0}}},
        {"a.json": spec({"d": {"deviceNodes": [node("/dev/x", 1, 3, uid=5)]}})},
        (f"{KIND}=d",),
        {
            "process": {"user": {"uid": 1000, "gid": 0}},
            "linux": {"devices": [dev("/dev/x", 1, 3, uid=5)], "resources": {"devices": [rule(1, 3)]}},
        },
    ),
    Injection(
        "mount added",
        {},
        {
            "a.json": spec(
                {"d": {"mounts": [{"hostPath": "/h", "containerPath": "/c", "options": ["ro", "bind"]}]}}
            )
        },
        (f"{KIND}=d",),
        {"mounts": [{"source": "/h", "destination": "/c", "options": ["ro", "bind"]}]},
    ),
    Injection(
        "mount replaces same destination",
        {"mounts": [{"source": "/old", "destination": "/c"}]},
        {"a.json": spec({"d": {"mounts": [{"hostPath": "/h", "containerPath": "/c", "type": "bind"}]}})},
        (f"{KIND}=d",),
        {"mounts": [{"source": "/h", "destination": "/c", "type": "bind"}]},
    ),
    Injection(
        "mounts stable-sorted by depth",
        {
            "mounts": [
                {"source": "b", "destination": "/dest/path/b"},
                {"source": "a", "destination": "/dest/path/a"},
            ]
        },
        {"a.json": spec({"d": {"mounts": [{"hostPath": "e", "containerPath": "/dest/edit"}]}})},
        (f"{KIND}=d",),
        {
            "mounts": [
                {"source": "e", "destination": "/dest/edit"},
                {"source": "b", "destination": "/dest/path/b"},
                {"source": "a", "destination": "/dest/path/a"},
            ]
        },
    ),
    Injection(
        "depth uses Go path.Clean",
        {"mounts": [{"source": "x", "destination": "/a/b"}]},
        {"a.json": spec({"d": {"mounts": [{"hostPath": "y", "containerPath": "//a/./c/../b2/"}]}})},
        (f"{KIND}=d",),
        {
            "mounts": [
                {"source": "x", "destination": "/a/b"},
                {"source": "y", "destination": "//a/./c/../b2/"},
            ]
        },
    ),
    Injection(
        "user namespace adds idmap to bind mounts",
        {"linux": {"namespaces": [{"type": "user"}]}},
        {
            "a.json": spec(
                {
                    "d": {
                        "mounts": [
                            {"hostPath": "/h", "containerPath": "/c", "options": ["bind"]},
                            {"hostPath": "/r", "containerPath": "/r", "options": ["rbind"]},
                        ]
                    }
                }
            )
        },
        (f"{KIND}=d",),
        {
            "linux": {"namespaces": [{"type": "user"}]},
            "mounts": [
                {"source": "/h", "destination": "/c", "options": ["bind", "idmap"]},
                {"source": "/r", "destination": "/r", "options": ["rbind", "ridmap"]},
            ],
        },
    ),
    Injection(
        "hooks appended to their stages",
        {"hooks": {"prestart": [{"path": "/old"}]}},
        {
            "a.json": spec(
                {
                    "d": {
                        "hooks": [
                            {"hookName": "prestart", "path": "/p"},
                            {
                                "hookName": "createRuntime",
                                "path": "/r",
                                "args": ["r", "x"],
                                "env": ["A=1"],
                                "timeout": 5,
                            },
                            {"hookName": "poststop", "path": "/s"},
                        ]
                    }
                }
            )
        },
        (f"{KIND}=d",),
        {
            "hooks": {
                "prestart": [{"path": "/old"}, {"path": "/p"}],
                "createRuntime": [{"path": "/r", "args": ["r", "x"], "env": ["A=1"], "timeout": 5}],
                "poststop": [{"path": "/s"}],
            }
        },
    ),
    Injection(
        "additionalGids skip 0 and duplicates",
        {"process": {"user": {"uid": 0, "additionalGids": [5]}}},
        {"a.json": spec({"d": {"additionalGids": [0, 5, 6, 6]}})},
        (f"{KIND}=d",),
        {"process": {"user": {"uid": 0, "additionalGids": [5, 6]}}},
    ),
    Injection(
        "netDevices keyed by host name",
        {},
        {"a.json": spec({"d": {"netDevices": [{"hostInterfaceName": "eth1", "name": "n0"}]}})},
        (f"{KIND}=d",),
        {"linux": {"netDevices": {"eth1": {"name": "n0"}}}},
    ),
    Injection(
        "intelRdt last wins",
        {"linux": {"intelRdt": {"closID": "old"}}},
        {"a.json": spec({"d": {"intelRdt": {"closID": "one"}}, "e": {"intelRdt": {"closID": "two"}}})},
        (f"{KIND}=d", f"{KIND}=e"),
        {"linux": {"intelRdt": {"closID": "two"}}},
    ),
    Injection(
        "two specs, each spec's edits once, request order",
        {},
        {
            "a.json": spec({"d": {"env": ["D=1"]}}, {"env": ["SA=1"]}),
            "b.json": spec({"e": {"env": ["E=1"]}}, {"env": ["SB=1"]}, kind="other.com/x"),
        },
        ("other.com/x=e", f"{KIND}=d"),
        {"process": {"env": ["SB=1", "E=1", "SA=1", "D=1"]}},
    ),
]


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 20
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_injection(case: Injection, tmp_path: Path) -> None:
    for filename, doc in case.specs.items():
        write_spec(tmp_path, filename, doc)
    registry = Registry.load([tmp_path])
    assert not registry.errors
    before = copy.deepcopy(case.config)
    out = apply_to_config(case.config, registry.resolve(case.request))
    assert out == case.expected
    assert case.config == before  # pure


def test_unresolvable_changes_nothing(tmp_path: Path) -> None:
    write_spec(tmp_path, "g.json", GPU_SPEC)
    registry = Registry.load([tmp_path])
    with pytest.raises(InputError) as info:
        registry.resolve(["nvidia.com/gpu=0", "nvidia.com/gpu=7", "x.com/y=z"])
    assert info.value.field == "devices"
    assert info.value.reason == "unresolvable CDI devices nvidia.com/gpu=7, x.com/y=z"


@pytest.mark.parametrize(
    ("path", "clean"),
    [
        ("", "."),
        ("/", "/"),
        ("//a//b/", "/a/b"),
        ("/a/./b/../c", "/a/c"),
        ("/../a", "/a"),
        ("a/../../b", "../b"),
        ("./", "."),
        ("/a/b/..", "/a"),
    ],
)
def test_go_clean(path: str, clean: str) -> None:
    assert go_clean(path) == clean


def test_merge_concatenates_and_last_rdt_wins() -> None:
    a = ContainerEdits(env=("A=1",), additional_gids=(5,), intel_rdt=IntelRdt(clos_id="a"))
    b = ContainerEdits(env=("B=1",), additional_gids=(5,))
    merged = merge(a, b, ContainerEdits())
    assert merged.env == ("A=1", "B=1") and merged.additional_gids == (5, 5)
    assert merged.intel_rdt == IntelRdt(clos_id="a")
    assert merge().is_empty() and not merged.is_empty()


def test_to_nodes_and_rules() -> None:
    edits = ContainerEdits(
        device_nodes=(
            CdiDeviceNode(path="/dev/nvidia0", type="c", major=195, minor=0, file_mode=0o20666),
            CdiDeviceNode(path="/dev/sda", type="b", major=8, minor=0, permissions="r", uid=1, gid=2),
            CdiDeviceNode(path="/dev/n", type="c", major=1, minor=3, permissions="none"),
            CdiDeviceNode(path="/dev/f", type="p"),
        )
    )
    nodes, rules = to_nodes_and_rules(edits)
    assert nodes == (
        Node(path="/dev/nvidia0", type="c", major=195, minor=0, file_mode=0o666),
        Node(path="/dev/sda", type="b", major=8, minor=0, uid=1, gid=2),
        Node(path="/dev/n", type="c", major=1, minor=3),
    )
    assert rules == (
        Rule(allow=True, type=DeviceType.CHAR, major=195, minor=0, access=Access.RWM),
        Rule(allow=True, type=DeviceType.BLOCK, major=8, minor=0, access=Access.R),
    )


def test_to_nodes_needs_filled_nodes() -> None:
    unfilled = CdiDeviceNode(path="/dev/x", source="s.json", field="devices[0].containerEdits.deviceNodes[0]")
    with pytest.raises(InputError) as info:
        to_nodes_and_rules(ContainerEdits(device_nodes=(unfilled,)))
    assert (info.value.file, info.value.field) == ("s.json", "devices[0].containerEdits.deviceNodes[0].type")


def test_to_json_keeps_mounts_in_cdi_shape() -> None:
    from hook.sources.cdi.edits import ContainerEdits, Mount

    edits = ContainerEdits(
        mounts=(Mount(host_path="/h/lib", container_path="/c/lib", options=("ro",), type="bind"),)
    )
    assert edits.to_json() == {
        "mounts": [{"hostPath": "/h/lib", "containerPath": "/c/lib", "options": ["ro"], "type": "bind"}]
    }


@pytest.mark.parametrize("missing", ["type", "major", "minor"])
def test_node_without_numbers_is_an_input_error(missing: str) -> None:
    """Unfilled nodes never reach a plan: any one of type, major or minor missing is refused."""
    from hook.sources.cdi.edits import CdiDeviceNode, ContainerEdits, to_nodes_and_rules

    full = {"type": "c", "major": 195, "minor": 0}
    node = CdiDeviceNode(
        path="/dev/nvidia0", **{**full, missing: None}, source="spec.yaml", field="deviceNodes[0]"
    )
    with pytest.raises(InputError, match="has no type/major/minor"):
        to_nodes_and_rules(ContainerEdits(device_nodes=(node,)))
