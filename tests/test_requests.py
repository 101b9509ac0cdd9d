"""hook.core.requests: what a container asked for, by which channel (nvidia-toolkit.md §1.3), and whether
a plugin made the ask (device-plugins.md §7 B)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.core.oci import parse_config, parse_rule
from hook.core.requests import collect, is_accelerator, is_privileged
from hook.core.settings import EnvRequests, Settings
from hook.sources.kubelet.checkpoint import Kubelet, find_allocations, parse_checkpoint
from hook.sources.kubelet.podid import identify
from tests.bundles import (
    ALLOW_ALL,
    CONTAINERD_CGROUPS_PATH,
    DEFAULT_RULES,
    POD_ANNOTATIONS,
    alloc_resp,
    checkpoint,
    checkpoint_entry,
    config,
    gpu_nodes,
    node,
    null_mount,
)

ROOT = "/var/run/nvidia-container-devices"
SRC = "/b/config.json"


def collect_from(
    cfg: dict[str, Any],
    annotations: dict[str, str] | None = None,
    settings: Settings | None = None,
    entries: list[dict[str, object]] | None = None,
) -> Any:
    c = parse_config(json.dumps(cfg).encode(), SRC, "/b")
    merged = {**c.annotations, **(annotations or {})}
    view = kubelet_view(merged, entries, cgroups=c.cgroups_path or CONTAINERD_CGROUPS_PATH)
    return collect(c, merged, settings or Settings(), view)


def kubelet_view(
    annotations: dict[str, str],
    entries: list[dict[str, object]] | None,
    state: str = "read",
    cgroups: str = CONTAINERD_CGROUPS_PATH,
) -> Kubelet | None:
    """What gather would hand ``collect``: None outside Kubernetes, else this container's entries."""
    pod = identify(annotations, cgroups).pod
    if pod is None:
        return None
    allocs = parse_checkpoint(checkpoint(entries or []), "ck") if state == "read" else ()
    return Kubelet(
        pod=pod, checkpoint="ck", state=state, allocations=find_allocations(allocs, pod.uid, pod.container)
    )


def items(reqs: Any) -> list[tuple[str, str, str, bool]]:
    return [(r.source, r.value, str(r.kind), r.from_plugin) for r in reqs.items]


# --- CDI annotations ----------------------------------------------------------------------------


def test_cdi_annotations_prefix_and_comma_lists() -> None:
    reqs = collect_from(
        config(
            annotations={
                "cdi.k8s.io/b": "nvidia.com/gpu=1,nvidia.com/gpu=2",
                "cdi.k8s.io/a": "nvidia.com/gpu=0",
                "cdi.k8s.io.alike/x": "nvidia.com/gpu=7",
                "other": "nvidia.com/gpu=6",
            }
        )
    )
    assert items(reqs) == [
        ("annotation:cdi.k8s.io/a", "nvidia.com/gpu=0", "cdi", True),
        ("annotation:cdi.k8s.io/b", "nvidia.com/gpu=1", "cdi", True),
        ("annotation:cdi.k8s.io/b", "nvidia.com/gpu=2", "cdi", True),
    ]
    assert reqs.evidence == ("annotation",)


def test_cdi_annotation_values_are_not_trimmed() -> None:
    """The reference splits at commas and refuses a name with a space (annotations_test.go)."""
    with pytest.raises(InputError, match=r"cdi\.k8s\.io/b"):
        collect_from(config(annotations={"cdi.k8s.io/b": "vendor.com/device=dev1, vendor.com/device=dev2"}))


def test_custom_annotation_prefix() -> None:
    s = Settings(cdi_annotation_prefixes=("gpustack.ai/cdi-",))
    reqs = collect_from(
        config(annotations={"gpustack.ai/cdi-0": "nvidia.com/gpu=0", "cdi.k8s.io/x": "a/b=c"}), settings=s
    )
    assert items(reqs) == [("annotation:gpustack.ai/cdi-0", "nvidia.com/gpu=0", "cdi", True)]


@pytest.mark.parametrize(
    "value",
    ["nvidia.com/gpu=0,gpu0", "nvidia.com=0", "=0", "nvidia.com/gpu", "nvidia.com/gpu=0,"],
    ids=["bare-word", "no-class", "no-kind", "no-name", "empty-element"],
)
def test_bad_annotation_element_names_the_key(value: str) -> None:
    with pytest.raises(InputError) as info:
        collect_from(config(annotations={"cdi.k8s.io/dp_abc": value}))
    assert (info.value.file, info.value.field) == ("annotations", "cdi.k8s.io/dp_abc")


def test_state_annotation_counts_like_config_annotation() -> None:
    reqs = collect_from(config(), annotations={"cdi.k8s.io/x": "nvidia.com/gpu=3"})
    assert items(reqs) == [("annotation:cdi.k8s.io/x", "nvidia.com/gpu=3", "cdi", True)]


# --- volume mounts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dest", "expected"),
    [
        pytest.param(f"{ROOT}/GPU-aaaa", ("GPU-aaaa", "nvidia"), id="uuid"),
        pytest.param(f"{ROOT}/0", ("0", "nvidia"), id="index"),
        pytest.param(f"{ROOT}/cdi/nvidia.com/gpu/0", ("nvidia.com/gpu=0", "cdi"), id="cdi-slash-form"),
        pytest.param(f"{ROOT}/cdi/nvidia.com/gpu=1", ("nvidia.com/gpu=1", "cdi"), id="cdi-equals-form"),
        pytest.param(f"{ROOT}/imex/3", ("3", "imex"), id="imex"),
        pytest.param(f"{ROOT}//2/", ("2", "nvidia"), id="unclean-path"),
    ],
)
def test_volume_mount_forms(dest: str, expected: tuple[str, str]) -> None:
    reqs = collect_from(config(mounts=[null_mount(dest)]))
    clean = dest.replace("//", "/").rstrip("/")
    assert items(reqs) == [(f"mount:{clean}", *expected, True)]


@pytest.mark.parametrize(
    "mount",
    [
        pytest.param({"destination": f"{ROOT}/0", "source": "/tmp/x", "type": "bind"}, id="not-dev-null"),
        pytest.param(null_mount("/var/run/nvidia-container-devices-alike/0"), id="prefix-alike"),
        pytest.param(null_mount(ROOT), id="the-root-itself"),
    ],
)
def test_mounts_that_are_not_requests(mount: dict[str, object]) -> None:
    assert collect_from(config(mounts=[mount])).items == ()


def test_duplicate_mounts_skipped_and_mounts_win_over_env() -> None:
    reqs = collect_from(
        config(
            ["NVIDIA_VISIBLE_DEVICES=all"],
            mounts=[null_mount(f"{ROOT}/1"), null_mount(f"{ROOT}/1"), null_mount(f"{ROOT}/imex/0")],
        )
    )
    assert items(reqs) == [
        (f"mount:{ROOT}/1", "1", "nvidia", True),
        (f"mount:{ROOT}/imex/0", "0", "imex", True),
    ]
    assert reqs.warnings == (f"NVIDIA_VISIBLE_DEVICES=all ignored: the allocation came from mount:{ROOT}/1",)


def test_annotations_win_over_mounts() -> None:
    reqs = collect_from(
        config(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"}, mounts=[null_mount(f"{ROOT}/1")])
    )
    assert items(reqs) == [("annotation:cdi.k8s.io/x", "nvidia.com/gpu=0", "cdi", True)]


# --- visible-devices env ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param([], [], id="unset"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES="], [], id="empty"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=void"], [], id="void"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=0,void"], [], id="void-element"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES= , "], [], id="blank-elements"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=none"], [("none", "none")], id="none"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=0,ALL"], [("all", "nvidia")], id="all-element"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES= 0 ,1"], [("0", "nvidia"), ("1", "nvidia")], id="index-list"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=GPU-a1"], [("GPU-a1", "nvidia")], id="gpu-uuid"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=MIG-b2"], [("MIG-b2", "nvidia")], id="mig-uuid"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=0:1"], [("0:1", "nvidia")], id="gpu-mig-index"),
        pytest.param(
            ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"], [("nvidia.com/gpu=0", "cdi")], id="cdi-name"
        ),
        pytest.param(
            ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=3"],
            [("3", "nvidia")],
            id="duplicate-last-wins",
        ),
    ],
)
def test_env_forms(env: list[str], expected: list[tuple[str, str]]) -> None:
    reqs = collect_from(config(env))
    assert items(reqs) == [("env:NVIDIA_VISIBLE_DEVICES", v, k, False) for v, k in expected]
    assert reqs.from_plugin is False


@pytest.mark.parametrize(
    ("extra", "evidence"),
    [
        pytest.param(
            ["CUDA_DEVICE_MEMORY_LIMIT_0=1000m"], "env:CUDA_DEVICE_MEMORY_LIMIT_0", id="hami-memory"
        ),
        pytest.param(["CUDA_DEVICE_SM_LIMIT=50"], "env:CUDA_DEVICE_SM_LIMIT", id="hami-sm"),
        pytest.param(["CUDA_MPS_PIPE_DIRECTORY=/mps/x"], "env:CUDA_MPS_PIPE_DIRECTORY", id="mps"),
        pytest.param(["VROCM_X=1"], "env:VROCM_X", id="gpustack-vrocm"),
    ],
)
def test_env_corroborated_by_plugin_only_siblings(extra: list[str], evidence: str) -> None:
    reqs = collect_from(config(["NVIDIA_VISIBLE_DEVICES=1", *extra]))
    assert items(reqs) == [("env:NVIDIA_VISIBLE_DEVICES", "1", "nvidia", True)]
    assert reqs.evidence == ("env", f"corroborated-by:{evidence}")


def test_env_ignored_when_unprivileged_and_not_accepted() -> None:
    s = Settings(env_requests=EnvRequests.NEVER)
    reqs = collect_from(config(["NVIDIA_VISIBLE_DEVICES=0"]), settings=s)
    assert reqs.items == ()
    assert reqs.warnings == (
        "NVIDIA_VISIBLE_DEVICES ignored in an unprivileged container (env_requests: never)",
    )
    privileged = collect_from(config(["NVIDIA_VISIBLE_DEVICES=0"], privileged=True), settings=s)
    assert items(privileged) == [("env:NVIDIA_VISIBLE_DEVICES", "0", "nvidia", False)]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            ["NVIDIA_MIG_CONFIG_DEVICES=all"], [("env:NVIDIA_MIG_CONFIG_DEVICES", "mig-config")], id="config"
        ),
        pytest.param(
            ["NVIDIA_MIG_MONITOR_DEVICES=ALL "],
            [("env:NVIDIA_MIG_MONITOR_DEVICES", "mig-monitor")],
            id="monitor",
        ),
        pytest.param(["NVIDIA_MIG_MONITOR_DEVICES="], [], id="empty"),
        # issue 21, item 9: empty items are skipped, as libnvidia-container does
        pytest.param(
            ["NVIDIA_MIG_MONITOR_DEVICES=,all"],
            [("env:NVIDIA_MIG_MONITOR_DEVICES", "mig-monitor")],
            id=",all",
        ),
        pytest.param(
            ["NVIDIA_MIG_CONFIG_DEVICES= all, ,"],
            [("env:NVIDIA_MIG_CONFIG_DEVICES", "mig-config")],
            id="all,,",
        ),
        pytest.param(["NVIDIA_MIG_MONITOR_DEVICES=, ,"], [], id="only-commas"),
    ],
)
def test_mig_management_env(env: list[str], expected: list[tuple[str, str]]) -> None:
    reqs = collect_from(config([*env, "NVIDIA_VISIBLE_DEVICES=all"], privileged=True))
    mig = [i for i in items(reqs) if i[2].startswith("mig-")]
    assert mig == [(src, "all", kind, False) for src, kind in expected]


@pytest.mark.parametrize("value", ["0", "GPU-a,all", "none"])
def test_mig_management_only_all(value: str) -> None:
    with pytest.raises(InputError) as info:
        env = [f"NVIDIA_MIG_CONFIG_DEVICES={value}", "NVIDIA_VISIBLE_DEVICES=0"]
        collect_from(config(env, privileged=True))
    assert (info.value.file, info.value.field) == (SRC, "process.env.NVIDIA_MIG_CONFIG_DEVICES")


@pytest.mark.parametrize("value", ["all", "0", "bogus"])
def test_mig_management_ignored_without_a_gpu(value: str) -> None:
    """NVIDIA's hook returns before the MIG envs when no GPU is requested (getNvidiaConfig)."""
    reqs = collect_from(config([f"NVIDIA_MIG_CONFIG_DEVICES={value}", f"NVIDIA_MIG_MONITOR_DEVICES={value}"]))
    assert items(reqs) == []


# --- linux.devices with specific allow rules ------------------------------------------------------


def test_accelerator_nodes_with_specific_allow_rule() -> None:
    gpus = gpu_nodes()
    rule = {"allow": True, "type": "c", "major": 195, "minor": 2, "access": "rw"}
    kfd_rule = {"allow": True, "type": "c", "major": 234, "minor": 0, "access": "rw"}
    devices = [gpus[2], gpus[3], node("/dev/kfd", 234, 0), node("/dev/fuse", 10, 229)]
    reqs = collect_from(config(devices=devices, rules=[*DEFAULT_RULES, rule, kfd_rule]))
    assert items(reqs) == [("linux.devices", "/dev/nvidia2", "node", True)]
    assert reqs.items[0].node is not None and reqs.items[0].node.minor == 2


def test_privileged_specific_rules_are_not_an_allocation() -> None:
    """CRI-O: allow-all, then the CRI device's rule appended; the set comes from the other evidence."""
    rule = {"allow": True, "type": "c", "major": 195, "minor": 2, "access": "rw"}
    reqs = collect_from(config(devices=gpu_nodes(), rules=[*ALLOW_ALL, rule]))
    assert reqs.items == ()


# --- kubelet checkpoint -----------------------------------------------------------------------------


def test_checkpoint_requests_come_first_and_env_is_ignored() -> None:
    resp = alloc_resp(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-a"},
        devices=[("/dev/dri/renderD128", "/dev/dri/renderD129", "rw")],
        cdi=["nvidia.com/gpu=0"],
    )
    reqs = collect_from(
        config(["NVIDIA_VISIBLE_DEVICES=all"], annotations=POD_ANNOTATIONS),
        entries=[checkpoint_entry("nvidia.com/gpu", ["GPU-a"], resp)],
    )
    src = "kubelet-checkpoint:nvidia.com/gpu"
    assert items(reqs) == [
        (src, "nvidia.com/gpu=0", "cdi", True),
        (src, "GPU-a", "nvidia", True),
        (src, "/dev/dri/renderD129", "node", True),
    ]
    assert reqs.warnings == (f"NVIDIA_VISIBLE_DEVICES=all ignored: the allocation came from {src}",)
    assert reqs.evidence == ("kubelet-checkpoint",)


def test_env_refused_by_the_kubelet_is_named_for_the_deny_reason() -> None:
    """No allocation in the checkpoint: the env is no request, and ``ignored_env`` names it (the
    "no device requested: ... is no request here" reason is built from it)."""
    reqs = collect_from(config(["NVIDIA_VISIBLE_DEVICES=all"], annotations=POD_ANNOTATIONS), entries=[])
    assert items(reqs) == []
    assert reqs.ignored_env == ("NVIDIA_VISIBLE_DEVICES=all",)
    assert "the kubelet allocated no GPU" in reqs.warnings[0]


def test_checkpoint_device_ids_fallback_for_nvidia_resources() -> None:
    reqs = collect_from(
        config(annotations=POD_ANNOTATIONS),
        entries=[
            checkpoint_entry("nvidia.com/gpu", ["GPU-a::0", "GPU-a::1", "GPU-b"]),
            checkpoint_entry("example.com/fpga", ["fpga-0"]),
        ],
    )
    src = "kubelet-checkpoint:nvidia.com/gpu"
    assert items(reqs) == [(src, "GPU-a", "nvidia", True), (src, "GPU-b", "nvidia", True)]


def test_checkpoint_volume_mount_strategy_env_is_not_an_id() -> None:
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": ROOT})
    reqs = collect_from(
        config(annotations=POD_ANNOTATIONS), entries=[checkpoint_entry("nvidia.com/gpu", ["GPU-a"], resp)]
    )
    assert items(reqs) == []


# --- privilege and accelerator predicates ----------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "privileged"),
    [
        pytest.param([{"allow": True, "access": "rwm"}], True, id="allow-all"),
        pytest.param([{"allow": True, "type": "a", "access": "rw"}], True, id="allow-a-rw"),
        pytest.param([{"allow": True, "access": "m"}], False, id="mknod-only"),
        pytest.param([{"allow": True, "type": "c", "access": "rwm"}], False, id="all-char-only"),
        # no type is "a", and runc applies "a" to every device whatever its numbers (issue 21)
        pytest.param([{"allow": True, "major": 195, "access": "rwm"}], True, id="one-major"),
        pytest.param(DEFAULT_RULES, False, id="default-pod"),
    ],
)
def test_is_privileged(rules: list[dict[str, object]], privileged: bool) -> None:
    assert is_privileged([parse_rule(r, "x", "r") for r in rules]) is privileged


@pytest.mark.parametrize(
    ("path", "accel"),
    [
        ("/dev/nvidia0", True),
        ("/dev/nvidia12", True),
        ("/dev/nvidiactl", False),
        ("/dev/nvidia-uvm", False),
        ("/dev/nvidia-caps/nvidia-cap2", True),
        ("/dev/dri/renderD128", True),
        ("/dev/dri/card0", True),
        ("/dev/kfd", False),
        ("/dev/davinci3", True),
        ("/dev/./nvidia1", True),
        ("/tmp/nvidia0", False),
    ],
)
def test_is_accelerator(path: str, accel: bool) -> None:
    assert is_accelerator(path, Settings().accelerator_nodes) is accel


def test_checkpoint_cdi_annotations_strategy_names_each_device() -> None:
    """Issue 24 (fresh mutant s530669-072, ``"=" not in n``): the plugin's cdi-annotations answer
    (``AllocateResponse.annotations``) lists CDI names; blank or nameless items are skipped."""
    resp = alloc_resp(
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=1, ,nvidia.com/gpu=3"}
    )
    reqs = collect_from(
        config(annotations=POD_ANNOTATIONS), entries=[checkpoint_entry("nvidia.com/gpu", ["GPU-b"], resp)]
    )
    src = "kubelet-checkpoint:nvidia.com/gpu"
    cdi = [(s, v, k, p) for s, v, k, p in items(reqs) if k == "cdi"]
    assert cdi == [(src, "nvidia.com/gpu=1", "cdi", True), (src, "nvidia.com/gpu=3", "cdi", True)]
