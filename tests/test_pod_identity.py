"""Issue 21, item 1: the pod identity comes from the keys of the engine that wrote the config.

CRI-O copies a pod's annotations into every container's config and overwrites only its own keys;
containerd passes allowed pod annotations through before writing its own. The engine is told by
``linux.cgroupsPath`` (which a pod cannot write) with its own marks. Each case below names the
victim's pod through the other engine's keys and was answered with the victim's identity (or
its namespace, in the log) by the code before this round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hook.routes.logrecord import stamp
from hook.sources.kubelet.podid import CONTAINERD, CRIO, cgroup_engine, identify
from tests.bundles import alloc_resp, checkpoint, checkpoint_entry
from tests.hosttree import make_host_tree
from tests.k8s_shapes import CONTAINER, CONTAINER_ID, GPUS, POD_UID, annotations, cgroups_path, write_cdi
from tests.test_k8s import pod_config, run

UUID2 = GPUS[2].uuid
ATTACKER = "11111111-2222-3333-4444-555555555555"
VICTIM_KEYS_CONTAINERD = {  # what a CRI-O pod writes as its own annotations
    "io.kubernetes.cri.sandbox-uid": POD_UID,
    "io.kubernetes.cri.container-name": CONTAINER,
    "io.kubernetes.cri.sandbox-namespace": "ml",
    "io.kubernetes.cri.sandbox-name": "train-0",
}
VICTIM_KEYS_CRIO = {  # what a containerd pod passes through (pod_annotations = ["*"])
    "io.kubernetes.pod.uid": POD_UID,
    "io.kubernetes.container.name": CONTAINER,
    "io.kubernetes.pod.namespace": "ml",
    "io.kubernetes.pod.name": "train-0",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("k8s-node")
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    return {"root": base / "root", "cdi": write_cdi(base / "cdi")}


def attacker(engine: str, victim: dict[str, str], **own: str) -> dict[str, str]:
    """Pod ``evil/x`` (its engine's own keys) that also carries the victim's keys of the other engine."""
    return {**annotations(engine, "evil", "x", **own), **victim, **_own_uid(engine)}


def _own_uid(engine: str) -> dict[str, str]:
    key = "io.kubernetes.pod.uid" if engine == "crio" else "io.kubernetes.cri.sandbox-uid"
    return {key: ATTACKER}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (f"/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}", (CONTAINERD, CONTAINER_ID)),
        (f"kubepods-burstable-podx.slice:cri-containerd:{CONTAINER_ID}", (CONTAINERD, CONTAINER_ID)),
        (f"/kubepods/burstable/pod{POD_UID}/crio-{CONTAINER_ID}", (CRIO, CONTAINER_ID)),
        (f"kubepods-burstable-podx.slice:crio:{CONTAINER_ID}", (CRIO, CONTAINER_ID)),
        # issue 31 (s142737-032): a containerd id is any 64 hex digits, every digit among them too
        (f"/kubepods/pod{POD_UID}/{'0123456789abcdef' * 4}", (CONTAINERD, "0123456789abcdef" * 4)),
        (f"/kubepods/pod{POD_UID}/{'0123456789abcdeg' * 4}", ("", "")),  # not hex
        (f"/kubepods/pod{POD_UID}/{'a' * 63}", ("", "")),  # not 64
        ("machine.slice:libpod:abc", ("", "")),
        ("/libpod_parent/libpod-abc", ("", "")),
        ("/odh-live/odh-1234", ("", "")),
        ("", ("", "")),
    ],
)
def test_the_cgroups_path_tells_the_engine(path: str, expected: tuple[str, str]) -> None:
    assert cgroup_engine(path) == expected


def test_a_crio_pod_naming_a_victim_through_containerds_keys_is_still_itself() -> None:
    ident = identify(attacker("crio", VICTIM_KEYS_CONTAINERD), cgroups_path("crio"))
    assert ident.engine == CRIO and ident.problem == "" and ident.pod is not None
    assert (ident.pod.uid, ident.pod.namespace, ident.pod.name) == (ATTACKER, "evil", "x")


def test_a_crio_pod_naming_a_sibling_container_is_still_its_own_container() -> None:
    ann = {**annotations("crio"), "io.kubernetes.cri.container-name": "sibling"}
    ident = identify(ann, cgroups_path("crio"))
    assert ident.pod is not None and ident.pod.container == CONTAINER and ident.problem == ""


def test_a_containerd_pod_naming_a_victim_through_crios_keys_is_still_itself() -> None:
    ident = identify(attacker("containerd", VICTIM_KEYS_CRIO), cgroups_path("containerd"))
    assert ident.engine == CONTAINERD and ident.pod is not None and ident.pod.uid == ATTACKER


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_identity_keys_without_the_engines_marks_are_no_identity(engine: str) -> None:
    ann = annotations(engine)
    ann.pop("io.kubernetes.cri.sandbox-id", None)
    ann.pop("io.kubernetes.cri-o.ContainerID", None)
    ident = identify(ann, cgroups_path(engine))
    assert ident.pod is None and "cannot be told" in ident.problem
    other = "crio" if engine == "containerd" else "containerd"  # the other engine's cgroup shape
    assert identify(annotations(engine), cgroups_path(other)).pod is None


def test_crios_container_id_must_match_its_cgroup() -> None:
    ann = annotations("crio", cid="f" * 64)
    assert identify(ann, cgroups_path("crio")).pod is None


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_each_engine_alone_is_read_as_before(engine: str) -> None:
    pod = identify(annotations(engine), cgroups_path(engine)).pod
    assert pod is not None and (pod.uid, pod.container, pod.namespace, pod.name) == (
        POD_UID,
        CONTAINER,
        "ml",
        "train-0",
    )


def test_the_log_line_is_never_filed_under_the_victims_namespace() -> None:
    """A CRI-O pod in ``evil`` that sets containerd's namespace key: its lines went to ``ml``."""
    ann = {**annotations("crio", "evil", "x"), "io.kubernetes.cri.sandbox-namespace": "ml"}
    rec = stamp({"verdict": "none"}, ann, now=0.0, cgroups_path=cgroups_path("crio"))
    assert rec.get("pod", {}).get("namespace") != "ml"
    own = stamp({}, annotations("crio", "evil", "x"), now=0.0, cgroups_path=cgroups_path("crio"))
    assert own["pod"] == {"namespace": "evil", "name": "x", "container": CONTAINER}
    assert own["engine"] == "cri-o"


def victim_allocation() -> bytes:
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2})
    entry = checkpoint_entry("nvidia.com/gpu", [UUID2], resp, pod_uid=POD_UID, container=CONTAINER)
    return checkpoint([entry])


@pytest.mark.parametrize(
    ("engine", "victim"),
    [("crio", VICTIM_KEYS_CONTAINERD), ("containerd", VICTIM_KEYS_CRIO)],
    ids=["crio-pod-with-containerd-keys", "containerd-pod-with-crio-keys"],
)
def test_the_victims_allocation_never_reaches_the_attacker(
    engine: str, victim: dict[str, str], tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """The issue's reproduction in simulation: the attacker asks for the victim's GPU by env."""
    env = [f"NVIDIA_VISIBLE_DEVICES={UUID2}"]
    cfg = pod_config(engine, cri_env=env, extra_annotations=attacker(engine, victim))
    rep = run(tmp_path, node, cfg, capsys, ckpt=victim_allocation())
    assert (rep["verdict"], rep["requests"], rep["nodes"]["create"]) == ("none", [], []), rep
    k = rep["kubernetes"]
    assert (k["checkpoint_state"], k["pod_uid"], k["namespace"]) == ("read", ATTACKER, "evil")
    ignored = f"NVIDIA_VISIBLE_DEVICES={UUID2} ignored: the kubelet allocated no GPU to pod evil/x"
    assert any(ignored in w for w in rep["warnings"]), rep["warnings"]


def test_the_victim_itself_still_gets_its_gpu(tmp_path: Path, node: dict[str, Path], capsys: Any) -> None:
    cfg = pod_config("crio", cri_env=[f"NVIDIA_VISIBLE_DEVICES={UUID2}"])
    rep = run(tmp_path, node, cfg, capsys, ckpt=victim_allocation())
    assert rep["verdict"] == "apply" and rep["kubernetes"]["engine"] == "cri-o"
    assert "/dev/nvidia3" in [n["path"] for n in rep["nodes"]["create"]]


def test_precreate_hands_the_attacker_no_gpu(tmp_path: Path, node: dict[str, Path]) -> None:
    """Spec level: ``hook precreate`` used to add the victim's ``/dev/nvidia3`` and sign it."""
    import json

    from tests.bundles import settings_file
    from tests.test_precreate import precreate

    ckpt = tmp_path / "kubelet_internal_checkpoint"
    ckpt.write_bytes(victim_allocation())
    settings = settings_file(tmp_path, kubelet_checkpoint=str(ckpt))
    args = ["--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"]), "--config", str(settings)]
    env = [f"NVIDIA_VISIBLE_DEVICES={UUID2}"]
    cfg = pod_config("crio", cri_env=env, extra_annotations=attacker("crio", VICTIM_KEYS_CONTAINERD))
    cfg["linux"]["cgroupsPath"] = cgroups_path("crio")
    data = json.dumps(cfg).encode()
    res = precreate({"args": args}, data)
    assert res.returncode == 0, res.stderr
    assert res.stdout == data  # unchanged: no node, no rule, no marker
    record = json.loads((tmp_path / "hook.log").read_text().splitlines()[-1])
    assert record["kubernetes"]["checkpoint_state"] == "read" and record["pod"]["namespace"] == "evil"


def test_an_untrusted_pod_gets_nothing_from_a_dev_null_mount(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """The volume-mounts strategy's ``/dev/null`` mount is pod-writable too: without a trusted
    identity nothing vouches for it."""
    from tests.k8s_shapes import MOUNT_ROOT, null_mount

    env = [f"NVIDIA_VISIBLE_DEVICES={MOUNT_ROOT}"]
    cfg = pod_config(
        "crio",
        cri_env=env,
        mounts=[null_mount(f"{MOUNT_ROOT}/{UUID2}")],
    )
    cfg["annotations"] = unmarked("crio")  # the victim's keys, without CRI-O's own marks
    rep = run(tmp_path, node, cfg, capsys, ckpt=victim_allocation())
    assert (rep["verdict"], rep["requests"], rep["nodes"]["create"]) == ("none", [], []), rep
    assert any("volume mount ignored: no trusted pod identity" in w for w in rep["warnings"])


# --- issue 36 item 2: untrusted is never freer than trusted ------------------------------------------

# one pod annotation naming the other engine's pod UID, as a pod can write it: CRI-O copies every
# pod annotation in; containerd passes io.kubernetes.pod.* where its pod_annotations allow them
OTHER_ENGINES_KEY = {
    "crio": {"io.kubernetes.cri.sandbox-uid": "x"},
    "containerd": {"io.kubernetes.pod.uid": "x"},
}


@pytest.mark.parametrize("engine", ["crio", "containerd"])
def test_the_other_engines_keys_never_make_the_identity_untrusted(engine: str) -> None:
    """The engine's own keys name the pod; what the other engine would write is a pod's word."""
    ident = identify({**annotations(engine), **OTHER_ENGINES_KEY[engine]}, cgroups_path(engine))
    assert ident.problem == "" and ident.pod is not None
    assert (ident.pod.uid, ident.pod.container) == (POD_UID, CONTAINER)
    victim = VICTIM_KEYS_CONTAINERD if engine == "crio" else VICTIM_KEYS_CRIO
    ident = identify(attacker(engine, victim), cgroups_path(engine))  # every field of the victim's
    assert ident.problem == "" and ident.pod is not None and ident.pod.uid == ATTACKER


def _privileged(engine: str, extra: dict[str, str]) -> dict[str, Any]:
    from tests.bundles import ALLOW_ALL
    from tests.k8s_shapes import control_devs, gpu_dev

    cfg = pod_config(engine, rules=ALLOW_ALL, devices=[*(gpu_dev(i) for i in GPUS), *control_devs()])
    cfg["annotations"].update(extra)
    return cfg


@pytest.mark.parametrize("engine", ["crio", "containerd"])
def test_a_privileged_pod_with_an_allocation_is_narrowed_whatever_the_other_engines_keys(
    engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """The issue's escape: a privileged pod allocated GPU 2 adds the other engine's UID key and
    was "left alone" with every GPU (no request of an untrusted identity is the plugin's)."""
    cfg = _privileged(engine, OTHER_ENGINES_KEY[engine])
    rep = run(tmp_path, node, cfg, capsys, ckpt=victim_allocation())
    assert rep["verdict"] == "apply", rep["reason"]
    assert rep["kubernetes"]["checkpoint_state"] == "read" and rep["kubernetes"]["identity_problem"] == ""
    kept = {n["path"] for n in rep["keeps"] if n["major"] == 195 and n["minor"] is not None}
    assert kept == {f"/dev/nvidia{GPUS[2].minor}", "/dev/nvidiactl"}, rep["keeps"]


def unmarked(engine: str, cid: str = CONTAINER_ID) -> dict[str, str]:
    """Identity keys without the engine's own marks (no ContainerID / sandbox-id): untrusted."""
    ann = annotations(engine, cid=cid)
    ann.pop("io.kubernetes.cri.sandbox-id", None)
    ann.pop("io.kubernetes.cri-o.ContainerID", None)
    return ann


@pytest.mark.parametrize(("policy", "verdict"), [("narrow", "apply"), ("reject", "deny")])
@pytest.mark.parametrize("engine", ["crio", "containerd"])
def test_a_privileged_container_with_no_trusted_identity_is_narrowed_or_refused(
    engine: str, policy: str, verdict: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """No trusted identity is a pod the kubelet allocated nothing: a privileged one loses every GPU
    (or is refused under ``privileged_allocation: reject``), and the reason says which."""
    from tests.bundles import settings_file, simulate, write_bundle

    cfg = _privileged(engine, {})
    cfg["annotations"] = unmarked(engine)
    ckpt = tmp_path / "kubelet_internal_checkpoint"
    ckpt.write_bytes(victim_allocation())  # the very pod's allocation: unread without an identity
    settings = settings_file(tmp_path, kubelet_checkpoint=str(ckpt), privileged_allocation=policy)
    args = ["--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"]), "--config", str(settings)]
    rc, rep, err = simulate(write_bundle(tmp_path / "bundle", cfg), *args, capsys=capsys)
    assert err == "" and rc == (0 if verdict == "apply" else 3), (rc, err)
    assert rep["kubernetes"]["checkpoint_state"] == "untrusted"
    assert rep["verdict"] == verdict, rep["reason"]
    assert "no trusted pod identity" in rep["reason"]
    if verdict == "apply":
        assert rep["reason"].startswith("narrowed a privileged container")
        assert {("c", 195, g.minor) for g in GPUS.values()} <= {
            (r["type"], r["major"], r["minor"]) for r in rep["cgroup"] if not r["allow"]
        }
        assert [n["path"] for n in rep["keeps"] if n["major"] == 195 and n["minor"] is not None] == [
            "/dev/nvidiactl"
        ]
    else:
        assert "(policy: reject)" in rep["reason"] and rep["keeps"] == []


def test_a_privileged_pod_with_no_allocation_and_a_trusted_identity_is_still_left_alone(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """DinD and tooling pods: no allocation is no narrowing, the other engine's keys or not."""
    rep = run(tmp_path, node, _privileged("crio", OTHER_ENGINES_KEY["crio"]), capsys)
    assert rep["verdict"] == "none" and rep["cgroup"] == [] and "left alone" in rep["reason"]
