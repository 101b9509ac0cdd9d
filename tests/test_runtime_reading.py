"""Issue 21, items 2 and 4: a rule's numbers and a mount's paths are read the way runc reads them.

runc (and crun) read a negative major or minor as ``*``; the kernel resolves ``//dev`` as
``/dev``, and runc a relative mount destination from ``/`` and a relative bind source from the
bundle. Each test here failed on the code before this round (the reading was permissive).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.allowlist import access_of, as_allow_list
from hook.core.oci import Mount, parse_rule
from hook.core.requests import is_privileged
from hook.core.rules import Access, DeviceType, Rule, evaluate
from tests.bundles import DEFAULT_RULES, NODE_CDI, NODE_INVENTORY, checkpoint, settings_file
from tests.hosttree import make_host_tree
from tests.k8s_shapes import GPUS, write_cdi
from tests.test_k8s import denied, gpu_key, pod_config, run
from tests.test_precreate import example, nvidia_paths, precreate

C = DeviceType.CHAR
ALL_GPU_KEYS = {gpu_key(i) for i in GPUS}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 4x-k8s node of tests/test_k8s.py (NVML index 2 is /dev/nvidia3)."""
    base = tmp_path_factory.mktemp("k8s-node")
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    return {"root": base / "root", "cdi": write_cdi(base / "cdi")}


@pytest.fixture
def spec_node(tmp_path: Path) -> dict[str, Any]:
    """tests/test_precreate.py's seed-000 node (examples' inventory and CDI spec)."""
    root = tmp_path / "driver-root"
    make_host_tree(root, "8x-mig", mknod=False)
    settings = settings_file(tmp_path)
    args = ["--driver-root", str(root), "--inventory", str(NODE_INVENTORY), "--cdi-spec-dir", str(NODE_CDI)]
    return {"root": root, "settings": settings, "args": [*args, "--config", str(settings)], "tmp": tmp_path}


def _rule(**kw: Any) -> Rule:
    return parse_rule(kw, "config.json", "linux.resources.devices[0]")


@pytest.mark.parametrize("number", [-1, -2, -(1 << 31)])
def test_a_negative_number_is_a_wildcard(number: int) -> None:
    rule = _rule(allow=True, type="c", major=number, minor=number, access="rw")
    assert (rule.major, rule.minor) == (None, None)
    assert evaluate([rule], C, 195, 3, Access.R | Access.W)


@pytest.mark.parametrize("number", [1 << 31, 1 << 32, (1 << 32) + 195, -(1 << 31) - 1])
def test_a_number_runtimes_read_differently_is_read_to_the_safe_side(number: int) -> None:
    """runc: an error or no match; crun: ``int`` truncation (2^32+195 is 195, 2^31 is negative: *)."""
    allow = _rule(allow=True, type="c", major=number, minor=0, access="rw")
    assert (allow.major, allow.minor, allow.access) == (None, 0, Access.R | Access.W)
    deny = _rule(allow=False, type="c", major=number, access="rw")
    assert deny.access == Access.NONE
    assert evaluate([allow, deny], C, 195, 0, Access.R)


def test_type_a_with_numbers_allows_every_device_as_runc_applies_it() -> None:
    rule = _rule(allow=True, type="a", major=195, minor=0, access="rwm")
    assert is_privileged([rule])
    assert evaluate([rule], C, 195, 7, Access.R)


def test_a_deny_without_access_denies_nothing() -> None:
    """runc refuses it, crun's filter matches nothing with it: never read as ``rwm``."""
    rules = [_rule(allow=True, type="c", major=195, access="rw"), _rule(allow=False, type="c", major=195)]
    assert evaluate(rules, C, 195, 0, Access.R)


def test_a_rule_built_with_minus_one_matches_as_a_wildcard() -> None:
    rule = Rule(allow=True, type=C, major=-1, access=Access.R | Access.W)
    assert evaluate([rule], C, 195, 0, Access.R)


def test_the_allow_list_never_writes_a_negative_number() -> None:
    rules = [
        Rule(allow=True),
        Rule(allow=True, type=C, major=-1, minor=-1),
        Rule(allow=False, type=C, major=195, minor=0),
    ]
    out = as_allow_list(rules, {C: (1, 195)}, [(C, 195, 0), (C, 195, 1), (C, -1, 0)])
    assert all(n is None or n >= 0 for r in out for n in (r.major, r.minor)), out
    assert not access_of(list(out), C, 195, 0) and access_of(list(out), C, 195, 1) == Access.RWM


def _negatives(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k in ("major", "minor") and isinstance(v, int) and v < 0] + [
            n for v in obj.values() for n in _negatives(v)
        ]
    if isinstance(obj, list):
        return [n for v in obj for n in _negatives(v)]
    return []


def test_precreate_narrows_a_minus_one_wildcard_and_writes_none_back(spec_node: dict[str, Any]) -> None:
    """The issue's reproduction: moby-derived tooling writes ``c -1:-1 rwm`` for ``c *:* rwm``.
    The allow-list used to re-emit it, and runc opened every GPU of a "narrowed" config."""
    cfg = json.loads(example("slice-privileged"))
    cfg["linux"]["resources"]["devices"].append(
        {"allow": True, "type": "c", "major": -1, "minor": -1, "access": "rwm"}
    )
    res = precreate(spec_node, json.dumps(cfg).encode())
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    raw = out["linux"]["resources"]["devices"]
    assert _negatives(raw) == []
    rules = [parse_rule(r, "out", "r") for r in raw]  # as runc reads them
    assert [m for m in range(8) if access_of(rules, C, 195, m)] == [1]
    assert nvidia_paths(out) == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidiactl"]


def test_a_minus_one_wildcard_beyond_the_allocation_is_narrowed(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """A pod the kubelet allocated no GPU, with ``c 195:-1 rw``: every GPU is opened by that rule."""
    rules = [*DEFAULT_RULES, {"allow": True, "type": "c", "major": 195, "minor": -1, "access": "rw"}]
    rep = run(tmp_path, node, pod_config(rules=rules), capsys, ckpt=checkpoint([]))
    assert denied(rep) >= ALL_GPU_KEYS, rep
    assert rep["container"]["widened"] is True
    assert all(n is None or n >= 0 for r in rep["cgroup"] for n in (r["major"], r["minor"]))


# --- item 4: paths as the kernel and runc resolve them ----------------------------------------------


def _shared(mounts: list[Mount], path: str) -> bool:
    from hook.core.hostdev import shared_mount

    return shared_mount(mounts, path, ("/dev",)) is not None


def _bind(source: str, dest: str) -> Mount:
    return Mount(destination=dest, source=source, type="bind", options=("rbind",))


@pytest.mark.parametrize(
    ("source", "dest", "path"),
    [
        ("//dev", "/dev", "/dev/nvidia0"),  # the kernel reads // as /
        ("///dev/", "/dev", "/dev/nvidia0"),
        ("/dev", "//dev", "/dev/nvidia0"),
        ("/dev", "dev", "/dev/nvidia0"),  # runc: a relative destination is under /
        ("//dev/nvidia-caps", "//dev/nvidia-caps", "/dev/nvidia-caps/nvidia-cap1"),
        ("/dev", "/dev", "//dev/nvidia0"),
    ],
)
def test_the_hosts_dev_is_recognised_however_it_is_spelled(source: str, dest: str, path: str) -> None:
    assert _shared([_bind(source, dest)], path)


def test_a_relative_bind_source_is_read_from_the_bundle() -> None:
    """runc changes into the bundle before it builds the mounts: ``../../dev`` can be the host's."""
    from hook.core.hostdev import shared_mount

    mounts = [_bind("../../../../../../../../dev", "/dev")]
    assert shared_mount(mounts, "/dev/nvidia0", ("/dev",), "/run/bundles/b1") is not None
    assert shared_mount([_bind("rootfs/dev", "/dev")], "/dev/nvidia0", ("/dev",), "/run/bundles/b1") is None


def test_a_relative_bind_source_without_a_bundle_is_taken_as_the_hosts_dev() -> None:
    """precreate has no bundle yet: the hook cannot tell where ``dev`` points, so it fails closed."""
    from hook.core.hostdev import shared_mount

    assert shared_mount([_bind("dev", "/dev")], "/dev/nvidia0", ("/dev",), "") is not None


def test_an_ordinary_tmpfs_dev_is_not_the_hosts() -> None:
    tmpfs = Mount(destination="//dev", source="tmpfs", type="tmpfs", options=())
    assert not _shared([_bind("/dev", "/dev"), tmpfs], "/dev/nvidia0")


def test_an_accelerator_path_is_recognised_with_a_doubled_slash() -> None:
    from hook.core.requests import is_accelerator
    from hook.core.settings import DEFAULT_ACCELERATOR_NODES

    assert is_accelerator("//dev/nvidia3", DEFAULT_ACCELERATOR_NODES)
    assert is_accelerator("/dev//nvidia3", DEFAULT_ACCELERATOR_NODES)
    assert is_accelerator("dev/nvidia3", DEFAULT_ACCELERATOR_NODES)  # runc: below the container's /


def test_a_node_at_a_doubled_slash_path_is_narrowed_like_any_other(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """A pod allocated no GPU whose linux.devices names ``//dev/nvidia3`` (runc creates /dev/nvidia3)."""
    g = GPUS[2]
    dev = {"path": f"//dev/nvidia{g.minor}", "type": "c", "major": 195, "minor": g.minor, "fileMode": 0o666}
    rep = run(tmp_path, node, pod_config(devices=[dev]), capsys, ckpt=checkpoint([]))
    assert rep["nodes"]["remove"] == [dev["path"]], rep

