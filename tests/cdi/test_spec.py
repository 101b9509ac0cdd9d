"""Conformance table for spec parsing and validation (one case per rule, CDI-style ids)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.sources.cdi.spec import SpecError, parse_spec, spec_problems

from .helpers import FIXTURES, base_spec, device


@dataclass(frozen=True)
class Case:
    name: str
    doc: Any  # a dict (dumped as JSON) or raw text
    field: str | None = None  # None: valid
    rule: str = ""
    source: str = "spec.json"

    def data(self) -> bytes:
        return (self.doc if isinstance(self.doc, str) else json.dumps(self.doc)).encode()


def _edits(**edits: Any) -> dict[str, Any]:
    return base_spec(devices=[device(**edits)])


def _node(**node: Any) -> dict[str, Any]:
    return _edits(deviceNodes=[{"path": "/dev/x", **node}])


def _hook(**hook: Any) -> dict[str, Any]:
    return _edits(hooks=[{"hookName": "createContainer", "path": "/bin/h", **hook}])


DN = "devices[0].containerEdits.deviceNodes[0]"
HK = "devices[0].containerEdits.hooks[0]"
ED = "devices[0].containerEdits"

CASES = [
    # --- syntax and strictness
    Case("valid minimal json", base_spec()),
    Case(
        "valid yaml",
        "cdiVersion: 0.3.0\nkind: v.com/c\ndevices:\n- name: d\n  containerEdits: {env: [A=1]}\n",
        source="s.yaml",
    ),
    Case("invalid json syntax", "{", "", "syntax"),
    Case("invalid yaml syntax", "a: [", "", "syntax", source="s.yaml"),
    Case("empty json document", "null", "", "empty"),
    Case("empty yaml document", "", "", "empty", source="s.yaml"),
    Case("top level is a list", "[]", "", "type"),
    Case("duplicate key json top level", '{"kind": "a/b", "kind": "c/d"}', "", "duplicate-key"),
    Case(
        "duplicate key json nested",
        json.dumps(base_spec())[:-1] + ', "containerEdits": {"env": [], "env": []}}',
        "",
        "duplicate-key",
    ),
    Case(
        "duplicate key yaml", "cdiVersion: 0.3.0\ncdiVersion: 0.4.0\n", "", "duplicate-key", source="s.yaml"
    ),
    Case(
        "duplicate key yaml nested",
        "cdiVersion: 0.3.0\nkind: v.com/c\ndevices:\n- name: d\n  name: e\n  containerEdits: {env: [A=1]}\n",
        "",
        "duplicate-key",
        source="s.yaml",
    ),
    Case("unknown top-level key", base_spec(extra=1), "extra", "strict-keys"),
    Case(
        "unknown device key", base_spec(devices=[{**device(), "nme": "x"}]), "devices[0].nme", "strict-keys"
    ),
    Case("unknown edits key", _edits(env=["A=1"], envs=["B=2"]), f"{ED}.envs", "strict-keys"),
    Case("unknown device node key", _node(majr=1), f"{DN}.majr", "strict-keys"),
    Case(
        "miscased key additionalGIDs accepted (Go's JSON matches keys case-insensitively)",
        {**_edits(additionalGIDs=[5]), "cdiVersion": "0.7.0"},
    ),
    Case("missing cdiVersion", base_spec(cdiVersion=None), "cdiVersion", "required"),
    Case("missing kind", base_spec(kind=None), "kind", "required"),
    Case("missing devices", base_spec(devices=None), "devices", "required"),
    Case(
        "device without containerEdits",
        base_spec(devices=[{"name": "d"}]),
        "devices[0].containerEdits",
        "required",
    ),
    Case("device node without path", _edits(deviceNodes=[{"type": "c"}]), f"{DN}.path", "required"),
    Case(
        "mount without containerPath",
        _edits(mounts=[{"hostPath": "/a"}]),
        f"{ED}.mounts[0].containerPath",
        "required",
    ),
    Case("hook without hookName", _edits(hooks=[{"path": "/bin/x"}]), f"{HK}.hookName", "required"),
    Case("null optional field is absent", _edits(env=["A=1"], mounts=None)),
    # --- types
    Case("major is a string", _node(type="c", major="195"), f"{DN}.major", "type"),
    Case("major is a bool", _node(type="c", major=True), f"{DN}.major", "type"),
    Case("uid out of uint32 range", _node(uid=2**32), f"{DN}.uid", "type"),
    Case("negative gid", _node(gid=-1), f"{DN}.gid", "type"),
    Case("additionalGids item not int", _edits(additionalGids=["5"]), f"{ED}.additionalGids[0]", "type"),
    Case("env is a string not a list", _edits(env="A=1"), f"{ED}.env", "type"),
    Case(
        "annotations value a number becomes its text",
        base_spec(cdiVersion="0.6.0", annotations={"a": 1}),
    ),
    Case(
        "annotations value a list is not a string",
        base_spec(cdiVersion="0.6.0", annotations={"a": [1]}),
        "annotations['a']",
        "type",
    ),
    Case("negative hook timeout", _hook(timeout=-1), f"{HK}.timeout", "type"),
    # --- versions
    Case("version with leading v", base_spec(cdiVersion="v1.1.0")),
    Case("version 0.3.0 baseline", base_spec(cdiVersion="0.3.0")),
    Case("version 1.0.0", base_spec(cdiVersion="1.0.0")),
    Case("version 0.2.0 too old", base_spec(cdiVersion="0.2.0"), "cdiVersion", "version"),
    Case("unknown version 1.2.0", base_spec(cdiVersion="1.2.0"), "cdiVersion", "version"),
    Case("malformed version 1.1", base_spec(cdiVersion="1.1"), "cdiVersion", "version"),
    Case("two leading v rejected", base_spec(cdiVersion="vv1.1.0"), "cdiVersion", "version"),
    Case(
        "mount type needs 0.4.0",
        {**_edits(mounts=[{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]), "cdiVersion": "0.3.0"},
        f"{ED}.mounts[0].type",
        "min-version",
    ),
    Case(
        "hostPath needs 0.5.0",
        {**_node(hostPath="/dev/y"), "cdiVersion": "0.4.0"},
        f"{DN}.hostPath",
        "min-version",
    ),
    Case(
        "digit-first device name needs 0.5.0",
        base_spec(cdiVersion="0.4.0", devices=[device("0")]),
        "devices[0].name",
        "min-version",
    ),
    Case("digit-first device name ok at 0.5.0", base_spec(cdiVersion="0.5.0", devices=[device("0")])),
    Case(
        "spec annotations need 0.6.0",
        base_spec(cdiVersion="0.5.0", annotations={"a": "b"}),
        "annotations",
        "min-version",
    ),
    Case(
        "device annotations need 0.6.0",
        base_spec(cdiVersion="0.5.0", devices=[{**device(), "annotations": {"a": "b"}}]),
        "devices[0].annotations",
        "min-version",
    ),
    Case(
        "dotted class needs 0.6.0",
        base_spec(cdiVersion="0.5.0", kind="vendor.com/c.d"),
        "kind",
        "min-version",
    ),
    Case(
        "additionalGids need 0.7.0",
        {**_edits(additionalGids=[5]), "cdiVersion": "0.6.0"},
        f"{ED}.additionalGids",
        "min-version",
    ),
    Case("additionalGids ok at 0.7.0", {**_edits(additionalGids=[5]), "cdiVersion": "0.7.0"}),
    Case(
        "intelRdt needs 0.7.0",
        {**_edits(intelRdt={"closID": "c"}), "cdiVersion": "0.6.0"},
        f"{ED}.intelRdt",
        "min-version",
    ),
    Case(
        "netDevices need 1.1.0",
        {**_edits(netDevices=[{"hostInterfaceName": "eth1", "name": "n0"}]), "cdiVersion": "1.0.0"},
        f"{ED}.netDevices",
        "min-version",
    ),
    Case(
        "intelRdt schemata needs 1.1.0",
        {**_edits(intelRdt={"schemata": ["L3:0=f"]}), "cdiVersion": "0.8.0"},
        f"{ED}.intelRdt.schemata",
        "min-version",
    ),
    Case(
        "intelRdt enableMonitoring needs 1.1.0",
        {**_edits(intelRdt={"enableMonitoring": True}), "cdiVersion": "0.8.0"},
        f"{ED}.intelRdt.enableMonitoring",
        "min-version",
    ),
    Case(
        "spec-level netDevices need 1.1.0",
        base_spec(
            cdiVersion="1.0.0", containerEdits={"netDevices": [{"hostInterfaceName": "eth1", "name": "n0"}]}
        ),
        "containerEdits.netDevices",
        "min-version",
    ),
    # --- kind and names
    Case("kind without slash", base_spec(kind="vendor.com"), "kind", "kind"),
    Case("kind with empty vendor", base_spec(kind="/class"), "kind", "kind"),
    Case("kind vendor ends with dash", base_spec(kind="vendor.com-/c"), "kind", "kind"),
    Case("kind vendor starts with digit", base_spec(kind="1vendor/c"), "kind", "kind"),
    Case("kind class with equals", base_spec(kind="vendor.com/device="), "kind", "kind"),
    Case("kind with two slashes", base_spec(kind="vendor.com/foo/bar"), "kind", "kind"),
    Case("one-letter vendor and class", base_spec(kind="a/b")),
    Case("device name with colon", base_spec(devices=[device("0:1")])),
    Case(
        "device name ends with colon", base_spec(devices=[device("dev:")]), "devices[0].name", "device-name"
    ),
    Case(
        "device name starts with dash", base_spec(devices=[device("-dev")]), "devices[0].name", "device-name"
    ),
    Case("device name empty", base_spec(devices=[device("")]), "devices[0].name", "device-name"),
    Case("device name with slash", base_spec(devices=[device("a/b")]), "devices[0].name", "device-name"),
    Case(
        "duplicate device names",
        base_spec(devices=[device("d"), device("e"), device("d")]),
        "devices[2].name",
        "unique-name",
    ),
    Case("no devices", base_spec(devices=[]), "devices", "no-devices"),
    Case(
        "empty device edits",
        base_spec(devices=[{"name": "d", "containerEdits": {}}]),
        "devices[0].containerEdits",
        "empty-edits",
    ),
    Case(
        "device edits with only empty lists",
        base_spec(devices=[{"name": "d", "containerEdits": {"env": []}}]),
        "devices[0].containerEdits",
        "empty-edits",
    ),
    Case("empty spec-level edits allowed", base_spec(containerEdits={})),
    Case("device with only intelRdt is not empty", {**_edits(intelRdt={}), "cdiVersion": "0.7.0"}),
    # --- env
    Case("env FOO= is valid", _edits(env=["FOO="])),
    Case("env without =", _edits(env=["FOO"]), f"{ED}.env[0]", "env"),
    Case("env with empty name", _edits(env=["=x"]), f"{ED}.env[0]", "env"),
    Case(
        "spec-level env invalid",
        base_spec(containerEdits={"env": ["A=1", "B"]}),
        "containerEdits.env[1]",
        "env",
    ),
    # --- device nodes
    Case("device node path only", _node()),
    Case("device node relative path is valid", _edits(deviceNodes=[{"path": "dev/x"}])),
    Case("device node empty path", _edits(deviceNodes=[{"path": ""}]), f"{DN}.path", "device-path"),
    Case("device node relative hostPath is valid", {**_node(hostPath="dev/y"), "cdiVersion": "0.5.0"}),
    Case("device node negative major", _node(type="c", major=-1), f"{DN}.major", "device-number"),
    Case("device node type b", _node(type="b", major=8, minor=0)),
    Case(
        "device node type u and p",
        _edits(deviceNodes=[{"path": "/dev/u", "type": "u"}, {"path": "/dev/p", "type": "p"}]),
    ),
    Case("device node wrong type", _node(type="x"), f"{DN}.type", "device-type"),
    Case("device node permissions rw", _node(permissions="rw")),
    Case("device node permissions none", _node(permissions="none")),
    Case("device node wrong permissions", _node(permissions="rwx"), f"{DN}.permissions", "permissions"),
    Case("device node fileMode and ids", _node(fileMode=0o600, uid=1000, gid=1000)),
    # --- mounts
    Case(
        "mount valid", _edits(mounts=[{"hostPath": "/a", "containerPath": "/b", "options": ["ro", "bind"]}])
    ),
    Case(
        "mount empty hostPath",
        _edits(mounts=[{"hostPath": "", "containerPath": "/b"}]),
        f"{ED}.mounts[0].hostPath",
        "mount",
    ),
    # --- hooks
    Case(
        "hook valid all stages",
        _edits(
            hooks=[
                {"hookName": s, "path": "/bin/h"}
                for s in (
                    "prestart",
                    "createRuntime",
                    "createContainer",
                    "startContainer",
                    "poststart",
                    "poststop",
                )
            ]
        ),
    ),
    Case("hook unknown name", _hook(hookName="preStart"), f"{HK}.hookName", "hook-name"),
    Case("hook relative path is valid", _hook(path="bin/h")),
    Case("hook empty path", _hook(path=""), f"{HK}.path", "hook-path"),
    Case("hook bad env", _hook(env=["NOEQ"]), f"{HK}.env[0]", "env"),
    Case("hook args and timeout", _hook(args=["h", "x"], env=["PATH=/bin"], timeout=5)),
    # --- intelRdt
    Case("intelRdt closID slash", {**_edits(intelRdt={"closID": "/"}), "cdiVersion": "0.7.0"}),
    Case(
        "intelRdt closID with slash",
        {**_edits(intelRdt={"closID": "a/b"}), "cdiVersion": "0.7.0"},
        f"{ED}.intelRdt.closID",
        "rdt-closid",
    ),
    Case(
        "intelRdt closID dotdot",
        {**_edits(intelRdt={"closID": ".."}), "cdiVersion": "0.7.0"},
        f"{ED}.intelRdt.closID",
        "rdt-closid",
    ),
    Case(
        "intelRdt closID newline",
        {**_edits(intelRdt={"closID": "a\nb"}), "cdiVersion": "0.7.0"},
        f"{ED}.intelRdt.closID",
        "rdt-closid",
    ),
    # --- net devices
    Case("netDevices valid", _edits(netDevices=[{"hostInterfaceName": "eth1", "name": "n0"}])),
    Case(
        "netDevice empty name",
        _edits(netDevices=[{"hostInterfaceName": "eth1", "name": ""}]),
        f"{ED}.netDevices[0].name",
        "netdev",
    ),
    Case(
        "netDevices duplicate host name",
        _edits(
            netDevices=[
                {"hostInterfaceName": "eth1", "name": "a"},
                {"hostInterfaceName": "eth1", "name": "b"},
            ]
        ),
        f"{ED}.netDevices[1].hostInterfaceName",
        "netdev",
    ),
    Case(
        "netDevices duplicate name",
        _edits(
            netDevices=[
                {"hostInterfaceName": "eth1", "name": "a"},
                {"hostInterfaceName": "eth2", "name": "a"},
            ]
        ),
        f"{ED}.netDevices[1].name",
        "netdev",
    ),
]


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_conformance(case: Case) -> None:
    if case.field is None:
        spec = parse_spec(case.data(), case.source, 3)
        assert spec.source == case.source and spec.priority == 3
        return
    with pytest.raises(SpecError) as info:
        parse_spec(case.data(), case.source, 0)
    assert info.value.file == case.source
    assert info.value.field == case.field
    assert info.value.rule == case.rule
    assert isinstance(info.value, InputError)


def test_all_problems_are_collected() -> None:
    doc = _edits(env=["BAD"], deviceNodes=[{"path": "", "type": "z"}])
    _raw, problems = spec_problems(json.dumps(doc).encode(), "f.json")
    assert [(p.field, p.rule) for p in problems] == [
        (f"{ED}.env[0]", "env"),
        (f"{DN}.path", "device-path"),
        (f"{DN}.type", "device-type"),
    ]


def test_parsed_values() -> None:
    doc = _edits(
        deviceNodes=[
            {
                "path": "/dev/x",
                "hostPath": "/dev/y",
                "type": "c",
                "major": 1,
                "minor": 3,
                "permissions": "rw",
                "fileMode": 0o640,
                "uid": 1,
                "gid": 2,
            }
        ],
        mounts=[{"hostPath": "/a", "containerPath": "/b", "options": ["ro"], "type": "bind"}],
        hooks=[{"hookName": "poststop", "path": "/bin/h", "args": ["h"], "timeout": 3}],
    )
    spec = parse_spec(json.dumps({**doc, "containerEdits": {"env": ["S=1"]}}).encode(), "f.json", 1)
    dev = spec.devices[0]
    assert (spec.vendor, spec.class_, dev.qualified_name) == ("vendor.com", "dev", "vendor.com/dev=d0")
    node = dev.edits.device_nodes[0]
    assert (node.host_path, node.type, node.major, node.minor, node.permissions, node.file_mode) == (
        "/dev/y",
        "c",
        1,
        3,
        "rw",
        0o640,
    )
    assert node.source == "f.json" and node.field == DN
    assert dev.edits.mounts[0].options == ("ro",) and dev.edits.hooks[0].timeout == 3
    assert dev.spec_edits.env == ("S=1",)


@pytest.mark.parametrize(
    "name", ["nvidia-gpu.yaml", "nvidia-management.yaml", "static/nvidia-gpu-minimal.yaml"]
)
def test_nvidia_fixtures_parse(name: str) -> None:
    spec = parse_spec((FIXTURES / name).read_bytes(), name, 0)
    assert spec.devices


def test_nvidia_gpu_fixture_names() -> None:
    spec = parse_spec((FIXTURES / "nvidia-gpu.yaml").read_bytes(), "nvidia-gpu.yaml", 0)
    names = [d.name for d in spec.devices]
    assert {"0", "1", "0:0", "all"} <= set(names)
    assert any(n.startswith("GPU-") for n in names) and any(n.startswith("MIG-") for n in names)
