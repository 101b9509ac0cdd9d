"""Behaviours that one-line mutants of the core got past (issue 17), each pinned here.

Rule: each test names the mutant it kills (its id in ``bench/mutants.tsv``, origin ``hand``);
``bench/mutate --only h`` shows them all killed. The shuffled-topology, narrowing and CDI-mode
survivors are pinned in ``tests/test_topologies.py``, undo in ``tests/apply/test_devnodes.py``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.core.oci import parse_config
from hook.core.requests import collect
from hook.core.settings import EnvRequests, Settings
from hook.routes import fastpath
from hook.sources.nvidia.migminors import build_cap_table, parse_mig_minors
from hook.sources.nvidia.model import CapNode
from tests.bundles import POD_CAPS, config, state, write_bundle

# --- requests: CAP_SYS_ADMIN counts as privileged for the env channel (h03) -------------------------


def _collect(cfg: dict[str, Any], settings: Settings) -> Any:
    c = parse_config(json.dumps(cfg).encode(), "/b/config.json", "/b")
    return collect(c, dict(c.annotations), settings)


def test_sys_admin_pod_env_request_is_kept_when_unprivileged_env_is_refused() -> None:
    """Not privileged, but CAP_SYS_ADMIN in the bounding set: the env request still counts (h03)."""
    refuse = Settings(env_requests=EnvRequests.NEVER)
    cfg = config(["NVIDIA_VISIBLE_DEVICES=0"], caps=sorted([*POD_CAPS, "CAP_SYS_ADMIN"]))
    reqs = _collect(cfg, refuse)
    assert [(r.source, r.value) for r in reqs.items] == [("env:NVIDIA_VISIBLE_DEVICES", "0")]
    assert reqs.warnings == ()
    plain = _collect(config(["NVIDIA_VISIBLE_DEVICES=0"], caps=POD_CAPS), refuse)
    assert plain.items == ()  # the control: without SYS_ADMIN the same env is refused


# --- capability table: the driver's capability file wins (h04, h05) ---------------------------------

MINORS = "config 1\nmonitor 2\ngpu6/gi1/access 66\ngpu6/gi1/ci0/access 67\n"


def test_dev_node_never_overrides_the_capability_file() -> None:
    """``/dev/nvidia-caps`` may carry another mode (an admin chmod); the driver's file decides (h04)."""
    proc = {"gpu6/gi1/access": CapNode(minor=66, mode=0o444)}
    dev = {66: CapNode(minor=66, mode=0o666), 67: CapNode(minor=67, mode=0o444)}
    table, warnings = build_cap_table(parse_mig_minors(MINORS), proc, dev)
    assert table.gi[(6, 1)] == CapNode(minor=66, mode=0o444)
    assert table.ci[(6, 1, 0)] == CapNode(minor=67, mode=0o444)  # only in /dev: taken from there
    assert warnings == ()


def test_capability_missing_from_mig_minors_is_refused() -> None:
    """A capability file mig-minors does not list is not a capability of this driver (h05)."""
    proc = {"gpu6/gi2/access": CapNode(minor=75), "gpu6/gi1/access": CapNode(minor=66)}
    table, warnings = build_cap_table(parse_mig_minors(MINORS), proc, {})
    assert dict(table.gi) == {(6, 1): CapNode(minor=66)}
    assert warnings == ()


# --- the fast path never answers for a config the full parser rejects (h06, h07) ---------------------


def _set(cfg: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    *parents, last = path.split(".")
    node: Any = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    node[int(last) if isinstance(node, list) else last] = value
    return out


PLAIN = config(["LANG=C"], devices=[{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}])
BROKEN = {
    "device-type": ("linux.devices.0.type", "x"),
    "device-major": ("linux.devices.0.major", "10"),
    "device-filemode": ("linux.devices.0.fileMode", "0666"),
    "device-path": ("linux.devices.0.path", 5),
    "rule-allow": ("linux.resources.devices.0.allow", "no"),
    "rule-access": ("linux.resources.devices.0.access", "rwx"),
    "rule-type": ("linux.resources.devices.0.type", "z"),
    "resources": ("linux.resources", []),
    "env": ("process.env", "LANG=C"),
    "annotations": ("annotations", {"a": 1}),
    "mount-destination": ("mounts", [{"destination": 1}]),
    "root-path": ("root.path", 1),
    "linux": ("linux", []),
}


@pytest.mark.parametrize("where", sorted(BROKEN))
def test_fast_path_never_accepts_what_the_parser_rejects(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, value = BROKEN[where]
    cfg = _set(PLAIN, path, value)
    with pytest.raises(InputError):
        parse_config(json.dumps(cfg).encode(), "config.json", "/b")
    monkeypatch.setattr(fastpath, "FASTPATH_CACHE", str(tmp_path / "fastpath.json"))
    opts = {"--config": [str(tmp_path / "absent.yaml")]}
    good = write_bundle(tmp_path / "good", PLAIN)
    assert fastpath.fast_path(opts, state(good)) is True  # the control: the intact config is answered
    bad = write_bundle(tmp_path / "bad", cfg)
    assert fastpath.fast_path(opts, state(bad)) is False


# --- decide: rules and nodes come in (major, minor, type) order, whatever the grant order (g008) -----


def test_additions_are_ordered_by_major_minor_then_type() -> None:
    """A CDI device may name a block and a char node with the same numbers: ``b`` sorts before ``c``,
    so the plan (and the eBPF program built from it) does not depend on the spec's order."""
    from hook.core.decide import Grant, Inputs, decide
    from hook.core.plan import Node
    from hook.core.requests import DeviceRequest, Kind, Requests
    from hook.core.rules import Access, DeviceType

    cfg = parse_config(json.dumps(config()).encode(), "/b/config.json", "/b")
    req = DeviceRequest(source="annotation:cdi.k8s.io/x", value="v.com/c=d", kind=Kind.CDI, from_plugin=True)
    grants = (
        Grant(node=Node(path="/dev/x-c", type="c", major=259, minor=0), access=Access.R | Access.W),
        Grant(node=Node(path="/dev/x-b", type="b", major=259, minor=0), access=Access.R | Access.W),
        Grant(node=Node(path="/dev/x-a", type="c", major=258, minor=9), access=Access.R | Access.W),
    )
    requests = Requests(items=(req,), evidence=("annotation",), warnings=(), driver_capabilities="")
    plan = decide(
        Inputs(container_id="c", config=cfg, settings=Settings(), requests=requests, grants={req: grants})
    )
    assert [(r.type, r.major, r.minor) for r in plan.rules] == [
        (DeviceType.CHAR, 258, 9),
        (DeviceType.BLOCK, 259, 0),
        (DeviceType.CHAR, 259, 0),
    ]
    assert [n.path for n in plan.create] == ["/dev/x-a", "/dev/x-b", "/dev/x-c"]


# --- decide: one node granted by two requests gets what either grants (issue 31, s142737-086) -----


def test_a_node_granted_by_two_requests_gets_the_access_of_both() -> None:
    """Two CDI devices may both name a node (a shared control node, one spec giving it ``r``, the
    other ``rw``): the container asked for both devices, so the node's rule allows what either
    grants, never only what both do (a device would then lose the write its spec gives it)."""
    from hook.core.decide import Grant, Inputs, decide
    from hook.core.plan import Node
    from hook.core.requests import DeviceRequest, Kind, Requests
    from hook.core.rules import Access

    cfg = parse_config(json.dumps(config()).encode(), "/b/config.json", "/b")
    ctl = Node(path="/dev/x-ctl", type="c", major=259, minor=255)
    card = Node(path="/dev/x-a", type="c", major=259, minor=0)
    reqs = [
        DeviceRequest(source="annotation:cdi.k8s.io/x", value=f"v.com/c={d}", kind=Kind.CDI, from_plugin=True)
        for d in ("a", "b")
    ]
    grants = {
        reqs[0]: (Grant(node=ctl, access=Access.R), Grant(node=card, access=Access.R)),
        reqs[1]: (Grant(node=ctl, access=Access.R | Access.W),),
    }
    requests = Requests(items=tuple(reqs), evidence=("annotation",), warnings=(), driver_capabilities="")
    plan = decide(Inputs(container_id="c", config=cfg, settings=Settings(), requests=requests, grants=grants))
    access = {(r.major, r.minor): r.access for r in plan.rules if r.allow}
    assert access[(259, 255)] == Access.R | Access.W
    assert access[(259, 0)] == Access.R
