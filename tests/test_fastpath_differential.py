"""Issue 21, item 3: the fast path is a superset of the full decision, checked differentially.

Hypothesis draws containers (rules as runc reads them, ``linux.devices``, env, mounts, CDI
annotations, capabilities, with or without a Kubernetes pod identity (containerd's, CRI-O's, or
an untrusted mix) and a kubelet checkpoint)
on the 4x-k8s node. For each, the fast path's answer (``fastpath.well_formed`` and
``needs_decision``, exactly what ``hook.entry`` and ``hook precreate`` ask) is compared with the
full decision (``gather.inputs_for_config`` + ``decide``). The test fails whenever the fast path
says "nothing to do" for a container whose full decision would change something (any rule,
node or removal), refuse it, or fail on it.

The world is an engine's: a kubelet allocation reaches the config the way the engine writes it
(the plugin's env, its ``/dev/null`` mounts or its CDI annotation), never as a checkpoint entry
the config shows no trace of. CI runs ``ODH_DIFF_EXAMPLES`` examples (default 300); the longer
run recorded in docs/testing.md sets it higher.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hook.core.decide import decide
from hook.core.errors import HookError
from hook.core.oci import parse_config_object
from hook.core.plan import Verdict
from hook.core.settings import Settings
from hook.routes.fastpath import DEFAULT_MOUNT_ROOT, DEFAULT_PREFIXES, needs_decision, well_formed
from hook.routes.gather import Options, inputs_for_config
from tests.bundles import alloc_resp, checkpoint, checkpoint_entry
from tests.hosttree import CAPS_MAJOR, UVM_MAJOR, make_host_tree
from tests.k8s_shapes import CONTAINER, GPUS, POD_UID, annotations, cgroups_path, write_cdi

EXAMPLES = int(os.environ.get("ODH_DIFF_EXAMPLES", "300"))
CID = "c0ffee" * 10 + "beef"
UUID2 = GPUS[2].uuid
MAJORS = [None, -1, -2, 1, 4, 5, 10, 136, 143, 195, UVM_MAJOR, CAPS_MAJOR, 226, 7, 1 << 31]
MINORS = [None, -1, 0, 1, 2, 3, GPUS[2].minor, 200, 229, 255]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("differential")
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    (base / "ckpt-empty").write_bytes(checkpoint([]))
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2})
    entry = checkpoint_entry("nvidia.com/gpu", [UUID2], resp, pod_uid=POD_UID, container=CONTAINER)
    (base / "ckpt-gpu2").write_bytes(checkpoint([entry]))
    return {"base": base, "root": base / "root", "cdi": write_cdi(base / "cdi")}


def _rule() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "allow": st.sampled_from([True, True, False]),
            "type": st.sampled_from(["c", "c", "c", "b", "a", "", None]),
        },
        optional={
            "major": st.sampled_from(MAJORS),
            "minor": st.sampled_from(MINORS),
            "access": st.sampled_from(["", "r", "w", "m", "rw", "rm", "rwm"]),
        },
    ).map(lambda r: {k: v for k, v in r.items() if v is not None})


def _device() -> st.SearchStrategy[dict[str, Any]]:
    plain = st.sampled_from([("/dev/null", 1, 3), ("/dev/fuse", 10, 229), ("/dev/tty", 5, 0)])
    odd = st.sampled_from(
        [
            ("/dev/null", 195, 0),  # a plain name with a GPU's numbers
            ("//dev/null", 1, 3),
            (f"/dev/nvidia{GPUS[2].minor}", 195, GPUS[2].minor),
            ("/dev/nvidia0", 195, 0),
            ("/dev/nvidiactl", 195, 255),
            ("/dev/xyz", 195, 1),
        ]
    )
    return st.one_of(plain, odd).map(
        lambda t: {"path": t[0], "type": "c", "major": t[1], "minor": t[2], "fileMode": 0o666}
    )


ENV = st.lists(
    st.sampled_from(
        [
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_VISIBLE_DEVICES=void",
            "NVIDIA_VISIBLE_DEVICES=",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            "CUDA_VERSION=12.4.1",
            "NVIDIA_REQUIRE_CUDA=cuda>=12",
            "CUDA_DEVICE_MEMORY_LIMIT_0=1000m",
            "LANG=C",
        ]
    ),
    max_size=4,
)


@st.composite
def containers(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """(config, checkpoint file name or "") for one container of the drawn world."""
    k8s = draw(st.sampled_from([True, True, False]))  # a Kubernetes pod's is the richest decision
    # whose pod: containerd's, CRI-O's, or a CRI-O pod that names another through containerd's keys
    engine = draw(st.sampled_from(["containerd", "crio", "mixed"]))
    identity = annotations("crio" if engine == "mixed" else engine, cid=CID) if k8s else {}
    if k8s and engine == "mixed":
        identity["io.kubernetes.cri.sandbox-uid"] = "0" * 8 + POD_UID[8:]
    allocated = k8s and draw(st.sampled_from([True, False, False]))
    env = ["PATH=/bin", *(draw(ENV) if draw(st.booleans()) else [])]
    mounts: list[dict[str, Any]] = [{"destination": "/proc", "type": "proc", "source": "proc"}]
    extra: dict[str, str] = {}
    if allocated:
        how = draw(st.sampled_from(["env", "mount", "cdi"]))
        if how == "env":
            env.append(f"NVIDIA_VISIBLE_DEVICES={UUID2}")
        elif how == "mount":
            env.append(f"NVIDIA_VISIBLE_DEVICES={DEFAULT_MOUNT_ROOT}")
            dest = draw(st.sampled_from([DEFAULT_MOUNT_ROOT, "/" + DEFAULT_MOUNT_ROOT])) + f"/{UUID2}"
            mounts.append({"destination": dest, "type": "bind", "source": "/dev/null", "options": ["ro"]})
        else:
            extra[f"cdi.k8s.io/nvidia-device-plugin_{UUID2}"] = f"nvidia.com/gpu={UUID2}"
    if draw(st.integers(0, 3)) == 0:
        mounts.append({"destination": draw(st.sampled_from(["/dev", "//dev", "/data"])), "type": "bind",
                       "source": draw(st.sampled_from(["/dev", "//dev", "/srv"])), "options": ["rbind"]})
    rules = draw(st.lists(_rule(), max_size=5))
    if draw(st.booleans()):
        rules.insert(0, {"allow": False, "access": "rwm"})
    caps = ["CAP_CHOWN", *(["CAP_SYS_ADMIN"] if draw(st.booleans()) else [])]
    config = {
        "ociVersion": "1.1.0",
        "process": {"args": ["sh"], "env": env, "capabilities": {"bounding": caps}},
        "root": {"path": "rootfs"},
        "mounts": mounts,
        "annotations": {**identity, **extra},
        "linux": {
            "cgroupsPath": cgroups_path("containerd" if engine == "containerd" else "crio", CID),
            "devices": draw(st.lists(_device(), max_size=3)) if draw(st.booleans()) else [],
            "resources": {"devices": rules},
        },
    }
    ckpt = "" if not k8s else "ckpt-gpu2" if allocated else draw(st.sampled_from(["ckpt-empty"] * 3 + [""]))
    return config, ckpt


def full_decision_changes(world: dict[str, Path], config: dict[str, Any], ckpt: str) -> str:
    """What the full decision would do that "nothing to do" is not ("" when it does nothing)."""
    base = world["base"]
    s = Settings(
        kubelet_checkpoint=str(base / (ckpt or "no-such-checkpoint")),
        log_file=str(base / "hook.log"),
        cache_dir=str(base / "cache"),
    )
    opts = Options(driver_root=world["root"], spec_dirs=(world["cdi"],), settings=s, use_cache=False)
    try:
        parsed = parse_config_object(config, "config.json", "/run/bundle")
        plan = decide(inputs_for_config(parsed, {}, CID, opts))
    except HookError as exc:
        return f"error: {exc}"
    if plan.verdict is Verdict.DENY:
        return f"deny: {plan.reason}"
    return f"{plan.verdict}: {plan.reason}" if plan.changes else ""


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(drawn=containers())
def test_fast_path_never_skips_a_decision(world: dict[str, Path], drawn: tuple[dict[str, Any], str]) -> None:
    config, ckpt = drawn
    if not well_formed({"bundle": "/run/bundle"}, config):
        return  # the fast path hands it to the full path
    if needs_decision(config, {}, DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT):
        return
    assert full_decision_changes(world, config, ckpt) == "", config


@pytest.mark.parametrize(
    "rule",
    [
        {"allow": True, "type": "c", "major": 195, "access": "rw"},  # the c 195:* rw
        {"allow": True, "type": "c", "access": "rwm"},  # c *:* rwm
        {"allow": True, "type": "c", "major": -1, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"},  # no node for it
    ],
)
def test_an_allow_that_reaches_a_gpu_takes_the_full_path(
    world: dict[str, Path], rule: dict[str, Any]
) -> None:
    """The issue's shape: a pod the kubelet allocated nothing, no NVIDIA env, an allow rule that
    opens a GPU. Both fast paths answered "nothing to do"; the full decision narrows it."""
    config = {
        "process": {"env": ["PATH=/bin"]},
        "annotations": annotations("containerd"),
        "linux": {
            "cgroupsPath": f"/kubepods/pod{POD_UID}/{CID}",
            "resources": {"devices": [{"allow": False, "access": "rwm"}, rule]},
        },
    }
    assert full_decision_changes(world, config, "ckpt-empty").startswith("apply: narrowed")
    assert needs_decision(config, {}, DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT)


DEFAULTS = [  # runc's own defaults and containerd's WithDefaultUnixDevices, as a config carries them
    {"allow": False, "access": "rwm"},
    {"allow": True, "type": "c", "major": 136, "access": "rwm"},
    {"allow": True, "type": "c", "access": "m"},
    {"allow": True, "type": "b", "access": "rwm"},
    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
    {"allow": True, "type": "c", "major": 5, "minor": 2, "access": "rwm"},
    {"allow": True, "type": "c", "major": 10, "minor": 200, "access": "rwm"},
]


def test_an_ordinary_container_keeps_the_fast_path() -> None:
    config = {
        "linux": {
            "resources": {"devices": DEFAULTS},
            "devices": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}],
        }
    }
    assert not needs_decision(config, {}, DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT)
