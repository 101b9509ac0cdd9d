"""The kubelet's word on one container: its device-plugin checkpoint and DRA state, as decisions weigh them.

Rule: never raises. A missing, unreadable or corrupt file is a state the decision weighs (and a
warning), so a container that asks for no device always starts; a pod identity that is not its
engine's own (``hook.sources.kubelet.podid``) consults neither file. The decider keeps a pod's
view while both files keep their identity (``hook.sources.warm``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.core.errors import InputError
from hook.core.kubelet import SANDBOX, UNTRUSTED
from hook.core.settings import Settings
from hook.sources.inputfile import read_limited, read_regular
from hook.sources.kubelet import checkpoint as ckpt
from hook.sources.kubelet.podid import identify

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping

    from hook.sources.kubelet.dra import DraView

__all__ = ["MAX_CHECKPOINT_BYTES", "forget", "kubelet_evidence", "kubelet_view"]

MAX_CHECKPOINT_BYTES = 64 << 20


def kubelet_view(
    annotations: dict[str, str], cgroups_path: str, settings: Settings, warnings: list[str]
) -> ckpt.Kubelet | None:
    """What the kubelet's checkpoint and DRA state say about this container; None outside Kubernetes.

    Never raises: a missing, unreadable or corrupt file is a state the decision weighs (and a
    warning), so a container that asks for no device always starts. A pod identity that is not
    its engine's own (``hook.sources.kubelet.podid``) consults neither: state ``untrusted``; nor
    does the pod's sandbox container, which the kubelet never allocates a device: ``sandbox``.
    """
    ident = identify(annotations, cgroups_path)
    if ident.sandbox and ident.pod is not None:
        return ckpt.Kubelet(pod=ident.pod, checkpoint="", state=SANDBOX, engine=ident.engine)
    if ident.pod is None:
        if not ident.problem:
            return None
        consequence = "a Kubernetes container with no allocation: no request counts, over-grants are narrowed"
        warnings.append(f"no trusted pod identity: {ident.problem}; {consequence}")
        anonymous = ckpt.Pod(uid="", container="", namespace="", name="")
        checkpoint = settings.kubelet_checkpoint
        return ckpt.Kubelet(pod=anonymous, checkpoint=checkpoint, state=UNTRUSTED, problem=ident.problem)
    pod, engine = ident.pod, ident.engine
    from hook.sources import warm

    # the decider keeps this pod's view while both kubelet files keep their identity
    key = (warm.identity(settings.kubelet_checkpoint), warm.identity(settings.dra_state_path))
    found: list[str] = []
    files = (settings.kubelet_checkpoint, settings.dra_state_path)
    slot = ("kubelet", *files, pod.uid, pod.container, pod.namespace, pod.name, engine)
    view, said = warm.remembered(
        slot, key, lambda: (_read_kubelet(pod, engine, settings, found), tuple(found))
    )
    warnings += said
    return view


def _read_kubelet(pod: ckpt.Pod, engine: str, settings: Settings, warnings: list[str]) -> ckpt.Kubelet:
    path = Path(settings.kubelet_checkpoint)
    dra_view = _dra(pod, settings, warnings)

    def view(state: str, allocs: tuple[ckpt.Allocation, ...] = ()) -> ckpt.Kubelet:
        return ckpt.Kubelet(
            pod=pod,
            checkpoint=str(path),
            state=state,
            allocations=allocs,
            dra_view=dra_view,
            engine=engine,
        )

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the container's start
            raise InputError(str(path), "", "not a regular file")
        data = read_limited(path, MAX_CHECKPOINT_BYTES, "kubelet checkpoint")
    except FileNotFoundError:
        return view("absent")
    except OSError as exc:
        warnings.append(f"{path}: {exc.strerror or exc}; using the other evidence")
        return view("unreadable")
    except InputError as exc:
        if os.path.lexists(path):
            warnings.append(f"{exc}; using the other evidence")
            return view("unreadable")
        return view("absent")
    try:
        return view("read", ckpt.parse_checkpoint(data, str(path), (pod.uid, pod.container)))
    except InputError as exc:
        warnings.append(f"{exc}; using the other evidence")
    except Exception as exc:  # a decoder bug must not stop a container: the file is then "corrupt"
        warnings.append(f"{path}: cannot decode ({type(exc).__name__}); using the other evidence")
    return view("corrupt")


def kubelet_evidence(
    annotations: Mapping[str, str], cgroups_path: str, settings: Settings
) -> ckpt.Kubelet | None:
    """The kubelet's word on this container exactly as a decision reads it (its warnings dropped):
    what the precreate marker binds, gathered again by the stage that checks the marker."""
    return kubelet_view(dict(annotations), cgroups_path, settings, [])


def _dra(pod: ckpt.Pod, settings: Settings, warnings: list[str]) -> DraView:
    """The kubelet's DRA state about this pod (hook.sources.kubelet.dra): a missing file is no DRA on
    this node;
    one that cannot be read or trusted is a warning naming it, and nothing is decided from it."""
    from hook.sources.kubelet import dra  # Kubernetes pods only
    from hook.sources.kubelet.dra import DraView

    path = settings.dra_state_path
    try:
        data = read_regular(Path(path), dra.MAX_BYTES, "kubelet DRA state")
    except FileNotFoundError:
        return DraView(path=path, state="absent")
    except InputError as exc:
        warnings.append(f"{exc}; nothing decided from the kubelet's DRA state")
        return DraView(path=path, state="unreadable")
    try:
        state = dra.parse_state(data, path, pod.uid)
    except InputError as exc:
        warnings.append(f"{exc}; nothing decided from the kubelet's DRA state")
        return DraView(path=path, state="corrupt")
    except Exception as exc:  # a parser bug must not stop a container
        warnings.append(
            f"{path}: cannot decode ({type(exc).__name__}); nothing decided from the kubelet's DRA state"
        )
        return DraView(path=path, state="corrupt")
    return DraView(
        path=path, state="read" if state.verified else "unverified", claims=dra.claims_of(state, pod.uid)
    )


def forget(pod_uid: str, container: str) -> int:
    """Drop the views kept for this pod's container (``hook nri`` on RemoveContainer); how many."""
    from hook.sources import warm

    def mine(slot: object) -> bool:
        return isinstance(slot, tuple) and slot[:1] == ("kubelet",) and slot[3:5] == (pod_uid, container)

    return warm.forget(mine)
