"""Which Kubernetes pod a container belongs to, from the keys only its engine writes.

Rule: pure functions of the config's annotations and ``linux.cgroupsPath``. A pod can put any
annotation into its containers' configs: CRI-O copies every pod annotation into each container's
config and then overwrites only its own keys (cri-o ``internal/factory/container/container.go``,
``SpecAddAnnotations``: sandbox annotations first, then ``io.kubernetes.cri-o.*``, then the
kubelet's labels ``io.kubernetes.pod.*`` / ``io.kubernetes.container.name``); containerd passes
pod annotations through when its ``pod_annotations`` allow them, before it writes its own
``io.kubernetes.cri.*`` keys (containerd ``internal/cri/server/container_create.go``,
``internal/cri/annotations/annotations.go``, ``DefaultCRIAnnotations``). So the first key found
is no identity: a CRI-O pod that sets containerd's keys to a victim's UID would be the victim.

The engine is told from what a pod cannot write: ``linux.cgroupsPath``, which the engine builds
from the kubelet's cgroup parent and the container id it generated. CRI-O names the container's
cgroup ``crio-<id>`` (cgroupfs) or ``<slice>:crio:<id>`` (systemd) and writes the same id as
``io.kubernetes.cri-o.ContainerID`` (cri-o ``internal/config/cgmgr``,
``internal/annotations/annotations.go``); containerd's CRI plugin uses ``<parent>/<id>`` or
``<slice>:cri-containerd:<id>`` with a 64-hex id and always writes
``io.kubernetes.cri.sandbox-id`` (``getCgroupsPath``, ``DefaultCRIAnnotations``). Only that
engine's keys are read: the other engine's keys are a pod's own annotations, so they never name
the pod, and never unmake the identity either (a pod that could make itself "untrusted" would
choose its own decision; issue 36). Pod identity keys without either engine's marks are no
trusted identity: the caller counts no allocation, ignores every request, narrows every
over-grant (a privileged container's too) and says why.

The pod's sandbox (pause) container is told the same way, by its engine's own key alone:
containerd's ``io.kubernetes.cri.container-type`` and CRI-O's ``io.kubernetes.cri-o.ContainerType``
are ``sandbox`` there (containerd ``internal/cri/annotations``, cri-o ``internal/annotations``);
each engine writes its own keys after a pod's, so a pod cannot unmake its sandbox.
"""

from __future__ import annotations

from hook.core.kubelet import Pod
from hook.core.record import record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["CONTAINERD", "CRIO", "CONTAINER_TYPE", "Identity", "identify", "cgroup_engine"]

CONTAINERD = "containerd"
CRIO = "cri-o"
# (pod UID, container name, namespace, pod name) as each engine writes them
KEYS = {
    CONTAINERD: (
        "io.kubernetes.cri.sandbox-uid",
        "io.kubernetes.cri.container-name",
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
    ),
    CRIO: (
        "io.kubernetes.pod.uid",
        "io.kubernetes.container.name",
        "io.kubernetes.pod.namespace",
        "io.kubernetes.pod.name",
    ),
}
CONTAINERD_SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
CRIO_CONTAINER_ID = "io.kubernetes.cri-o.ContainerID"
CONTAINER_TYPE = {CONTAINERD: "io.kubernetes.cri.container-type", CRIO: "io.kubernetes.cri-o.ContainerType"}
_HEX = frozenset("0123456789abcdef")


@record
class Identity:
    """``engine``: whose keys were read ("" when none could be told); ``pod``: None outside
    Kubernetes or when untrusted; ``problem``: why pod identity keys give no trusted identity;
    ``sandbox``: the engine's own key says this is the pod's sandbox container."""

    engine: str
    pod: Pod | None
    problem: str = ""
    sandbox: bool = False  # the pod's sandbox (pause) container: ``pod.container`` is ""

    @property
    def kubernetes(self) -> bool:
        return self.pod is not None or bool(self.problem) or self.sandbox


def cgroup_engine(cgroups_path: str) -> tuple[str, str]:
    """(engine, container id) as the engine wrote ``linux.cgroupsPath``; ("", "") for any other shape."""
    parts = cgroups_path.split(":")
    if len(parts) == 3 and not cgroups_path.startswith("/"):  # systemd: slice:prefix:name
        prefix, name = parts[1], parts[2]
        if prefix == "crio" and name:
            return CRIO, name
        if prefix == "cri-containerd" and name:
            return CONTAINERD, name
        return "", ""
    last = cgroups_path.rstrip("/").rsplit("/", 1)[-1]
    if last.startswith("crio-") and len(last) > 5:
        return CRIO, last[5:]
    if len(last) == 64 and set(last) <= _HEX:
        return CONTAINERD, last
    return "", ""


def _values(annotations: Mapping[str, str], engine: str) -> tuple[str, ...]:
    return tuple(annotations.get(k, "") for k in KEYS[engine])


def identify(annotations: Mapping[str, str], cgroups_path: str) -> Identity:
    """The container's pod as its own engine wrote it (see the module rule)."""
    engine, cid = cgroup_engine(cgroups_path)
    if engine == CRIO and annotations.get(CRIO_CONTAINER_ID) != cid:
        engine = ""
    if engine == CONTAINERD and not annotations.get(CONTAINERD_SANDBOX_ID):
        engine = ""
    present = {e: _values(annotations, e) for e in KEYS}
    named = [e for e, values in present.items() if any(values)]
    if not engine:
        if not named:
            return Identity(engine="", pod=None)
        keys = " and ".join("containerd's" if e == CONTAINERD else "CRI-O's" for e in named)
        return Identity(
            engine="",
            pod=None,
            problem=f"{keys} pod identity keys, but neither engine's own marks with a matching "
            f"linux.cgroupsPath ({cgroups_path or 'none'}): the engine cannot be told",
        )
    uid, container, namespace, name = present[engine]  # the other engine's keys are a pod's word
    if annotations.get(CONTAINER_TYPE[engine]) == "sandbox":  # no container name: the pod's own
        pod = Pod(uid=uid, container="", namespace=namespace, name=name)
        return Identity(engine=engine, pod=pod, sandbox=True)
    if not (uid and container):
        return Identity(engine=engine, pod=None)
    return Identity(engine=engine, pod=Pod(uid=uid, container=container, namespace=namespace, name=name))
