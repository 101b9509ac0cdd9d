"""The ``oci-device-hook/decided`` annotation: proof that this node's hook decided this config.

Rule: pod annotations reach the OCI config (CRI-O passes them all), so a bare "decided" flag
would let any pod skip its narrowing. The marker is a keyed BLAKE2b under the node key
(``hook.sources.nodekey``: root's, in ``/var/lib/oci-device-hook``, never under ``/run``, which a
pod with a hostPath can read) of everything that decided: the config's device nodes and device
rules as the runtime will apply them, the pod identity and kubelet evidence the decision weighed,
the settings it ran under (``binding``), and the container itself: its id where the stage knows
it, and its ``cgroupsPath`` (engine-written, naming the container). A forged marker, one copied
from another container or pod, a config changed after the decision, a checkpoint that now says
something else, or other settings all fail the check, and the hook then decides again. No usable
key, or nothing that names the container, means no marker is written and none is trusted: the
prestart hook decides again and finds nothing to do. Losing the key only costs a second decision.
"""

from __future__ import annotations

from hook.core.oci import OciConfig

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from hook.core.kubelet import Kubelet
    from hook.core.settings import Settings

__all__ = ["ANNOTATION", "binding", "digest_text", "sign", "verify"]

ANNOTATION = "oci-device-hook/decided"
_PREFIX = "v3:"  # v3: the node key, BLAKE2b, the container bound (v2: HMAC-SHA256 under a key in /run)
_PERSON = b"odh-marker-v3"


def binding(kubelet: Kubelet | None, settings: Settings) -> str:
    """What decided besides the config's devices: the pod identity and the kubelet's evidence
    (the checkpoint's state and this container's whole allocation; None outside Kubernetes),
    and a digest of the settings. Precreate binds the values its decision used; prestart
    gathers them again, so a marker replayed into another pod, or onto a node whose checkpoint
    or settings say something else now, no longer matches."""
    import json

    from hook.core.record import asdict
    from hook.core.settings import digest

    evidence = asdict(kubelet) if kubelet is not None else None
    doc = {"kubelet": evidence, "settings": digest(settings)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=_plain)


def _plain(value: object) -> object:
    """JSON for what ``asdict`` leaves (enums, sets): the same text in every process, never a repr
    with an address or a hash order, or no marker would ever verify."""
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    return str(value)


def digest_text(config: OciConfig, bound: str) -> bytes:
    """What the marker covers: every node and every device rule, as the runtime will read them,
    and ``bound`` (``binding``).

    Built from the parsed values (not the raw JSON), so an engine that re-encodes the config
    (podman's precreate round trip drops ``null`` and reorders keys) keeps the marker valid.
    """
    import json

    nodes = [[d.path, d.type, d.major, d.minor, d.file_mode, d.uid, d.gid] for d in config.devices]
    rules = [[r.allow, str(r.type), r.major, r.minor, str(r.access)] for r in config.resource_rules]
    doc = ["oci-device-hook/decided/v3", config.cgroups_path, nodes, rules, bound]
    return json.dumps(doc, separators=(",", ":")).encode()


def sign(key: bytes, config: OciConfig, bound: str, container_id: str) -> str | None:
    """The marker for this config in this container (``container_id``: the runtime's id, "" where
    the stage does not know it); None when nothing names the container (no id, no cgroupsPath):
    such a marker would hold for any container, so none is made."""
    if not container_id and not config.cgroups_path:
        return None
    return _PREFIX + _mac(key, config, bound, container_id)


def _mac(key: bytes, config: OciConfig, bound: str, container_id: str) -> str:
    from hook.sources.nodekey import mac

    return mac(key, _PERSON, container_id.encode(), digest_text(config, bound)).hex()


def verify(key: bytes | None, config: OciConfig, bound: str, container_id: str) -> bool:
    """The config carries a marker this node's key made over exactly these nodes, rules and
    ``bound``, for this container: its id, or (a marker made where the id was not known, hooks.d
    precreate) its ``cgroupsPath``, which the engine writes and names the container by."""
    from hook.sources.nodekey import same

    claimed = config.annotations.get(ANNOTATION)
    if key is None or not claimed or not claimed.startswith(_PREFIX):
        return False
    ids = [i for i in {container_id, ""} if i or config.cgroups_path]
    return any(same(claimed.encode(), (_PREFIX + _mac(key, config, bound, i)).encode()) for i in ids)
