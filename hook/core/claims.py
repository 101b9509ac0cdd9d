"""The kubelet's DRA claims about one pod, as values (``hook.sources.kubelet.dra`` parses the file).

Rule: values and the one path rule the settings need (where the state lives beside the checkpoint);
no parsing or I/O here.
"""

from __future__ import annotations

import posixpath

from hook.core.record import record

__all__ = ["FILE_NAME", "STATES", "DraDevice", "Claim", "DraState", "DraView", "default_path"]

FILE_NAME = "dra_manager_state"  # kubernetes pkg/kubelet/cm/dra/manager.go, every version since 1.27

# How a decision read the state: ``read`` (checksum verified), ``unverified`` (the 1.30 format,
# whose checksum is Go-specific), ``absent`` (no file: no DRA on this node), ``unreadable``
# (I/O error, not a regular file, oversized), ``corrupt`` (not the format, or a checksum mismatch).
STATES = ("read", "unverified", "absent", "unreadable", "corrupt")


@record
class DraDevice:
    """One prepared device of a claim, as its driver reported it to the kubelet."""

    driver: str
    pool: str
    device: str
    requests: tuple[str, ...]
    cdi_ids: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
            "requests": list(self.requests),
            "cdi_ids": list(self.cdi_ids),
        }


@record
class Claim:
    uid: str
    name: str
    namespace: str
    pod_uids: tuple[str, ...]
    devices: tuple[DraDevice, ...]

    @property
    def label(self) -> str:
        """How a person finds the claim: ``namespace/name (uid)``."""
        return f"{self.namespace or '?'}/{self.name or '?'} ({self.uid})"

    def to_json(self) -> dict[str, object]:
        return {
            "uid": self.uid,
            "name": self.name,
            "namespace": self.namespace,
            "drivers": sorted({d.driver for d in self.devices}),
            "devices": [d.to_json() for d in self.devices],
            "cdi_ids": [i for d in self.devices for i in d.cdi_ids],
        }


@record
class DraState:
    claims: tuple[Claim, ...]
    verified: bool


@record
class DraView:
    """What the DRA state says about one pod: where it was read, how, and the pod's claims."""

    path: str
    state: str = "absent"
    claims: tuple[Claim, ...] = ()

    @property
    def known(self) -> bool:
        """The file was read (verified or not): ``claims`` is the pod's whole DRA allocation."""
        return self.state in ("read", "unverified")

    @property
    def unknown(self) -> bool:
        """A state file exists but nothing can be decided from it."""
        return self.state in ("unreadable", "corrupt")

    def to_json(self) -> dict[str, object]:
        return {"state_file": self.path, "state": self.state, "claims": [c.to_json() for c in self.claims]}


def default_path(kubelet_checkpoint: str) -> str:
    """``<kubelet root>/dra_manager_state``: the kubelet root is the directory above the
    device-plugin checkpoint's ``device-plugins/`` (both managers get the same root dir)."""
    return posixpath.join(posixpath.dirname(posixpath.dirname(kubelet_checkpoint)), FILE_NAME)
