"""The kubelet's word about one container, as values: its device-plugin allocation and pod identity.

Rule: these are what the evidence sources (``hook.sources.kubelet``) parse the kubelet's files and
the engine's keys into, and all the decision core reads of them; no parsing or I/O here.
"""

from __future__ import annotations

from hook.core.record import field, record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping

    from hook.core.claims import DraView

__all__ = ["Allocation", "Pod", "Kubelet", "UNTRUSTED", "SANDBOX"]

UNTRUSTED = "untrusted"  # the annotations name a pod, but not as one engine wrote them
SANDBOX = "sandbox"  # the pod's sandbox (pause) container, told by its engine's own key


@record
class Allocation:
    """One resource's allocation to one container, as the plugin answered it."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str]
    device_paths: tuple[tuple[str, str], ...]  # (container path, host path)
    cdi_devices: tuple[str, ...]
    mounts: tuple[tuple[str, str], ...] = ()  # (container path, host path): volume-mounts strategy
    annotations: Mapping[str, str] = field(default_factory=dict)  # cdi-annotations strategy


@record
class Pod:
    """A Kubernetes container's identity, as its own engine wrote it (``hook.sources.kubelet.podid``)."""

    uid: str
    container: str
    namespace: str  # "" when absent: then no namespace is trusted
    name: str


@record
class Kubelet:
    """What the kubelet's checkpoint says about one container, and how sure that is.

    ``state``: ``read`` (the file parsed; ``allocations`` is this container's whole allocation,
    possibly none), or ``absent`` / ``unreadable`` / ``corrupt`` (nothing known), or
    ``untrusted``: the annotations name a pod but not as one engine wrote it (``problem`` says
    why), so the checkpoint was not consulted and nothing counts as allocated; or ``sandbox``: the
    pod's sandbox (pause) container, which the kubelet never allocates a device (``pod.container``
    is ""). ``dra_view`` is the
    kubelet's DRA state about the pod (hook.sources.kubelet.dra), read whatever the checkpoint's state.
    """

    pod: Pod
    checkpoint: str
    state: str
    allocations: tuple[Allocation, ...] = ()
    dra_view: DraView | None = None
    engine: str = ""  # whose annotations named the pod (hook.sources.kubelet.podid)
    problem: str = ""  # why no pod identity is trusted (state "untrusted")

    @property
    def known(self) -> bool:
        return self.state == "read"

    @property
    def dra(self) -> bool:
        """The pod has DRA claims, which the device-plugin checkpoint does not list."""
        return self.dra_view is not None and bool(self.dra_view.claims)

    @property
    def dra_unknown(self) -> bool:
        """A DRA state file exists but cannot be read or trusted: the pod may hold claims."""
        return self.dra_view is not None and self.dra_view.unknown
