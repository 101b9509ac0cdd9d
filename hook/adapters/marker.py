"""The ``oci-device-hook/decided`` annotation: proof that this node's hook decided this config.

Rule: pod annotations reach the OCI config (CRI-O passes them all), so a bare "decided" flag
would let any pod skip its narrowing. The marker is an HMAC-SHA256, under a node-local key only
root can read, of everything that decided: the config's device nodes and device rules as the
runtime will apply them, the pod identity and kubelet evidence the decision weighed, and the
settings it ran under (``binding``). A forged marker, one copied from another container or pod,
a config changed after the decision, a checkpoint that now says something else, or other
settings all fail the check, and the hook then decides again. No usable key means no marker is
written and none is trusted: the prestart hook decides again and finds nothing to do.

The key lives in the cache directory (``/run/oci-device-hook``, root's and 0700): losing it only
costs a second decision, and a reboot rotates it. A key file that cannot be one (empty, the wrong
length, readable by others, not root's, a symlink, not a regular file) is replaced at the next
precreate by renaming a fresh key over the name (the rename never follows what sits there), so
one bad file cannot disable markers for good.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.core.oci import OciConfig

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from hook.core.kubelet import Kubelet
    from hook.core.settings import Settings

__all__ = ["ANNOTATION", "KEY_NAME", "binding", "digest_text", "load_key", "sign", "verify"]

ANNOTATION = "oci-device-hook/decided"
KEY_NAME = "precreate.key"
KEY_BYTES = 32
_PREFIX = "v2:"


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
    doc = ["oci-device-hook/decided/v2", nodes, rules, bound]
    return json.dumps(doc, separators=(",", ":")).encode()


def sign(key: bytes, config: OciConfig, bound: str) -> str:
    import hashlib
    import hmac

    return _PREFIX + hmac.new(key, digest_text(config, bound), hashlib.sha256).hexdigest()


def verify(key: bytes | None, config: OciConfig, bound: str) -> bool:
    """The config carries a marker this node's key made over exactly these nodes, rules and ``bound``."""
    import hmac

    claimed = config.annotations.get(ANNOTATION)
    if key is None or not claimed:
        return False
    return hmac.compare_digest(claimed.encode(), sign(key, config, bound).encode())


def _safe_dir(directory: Path) -> bool:
    """Ours and writable by no one else: a key another user could replace proves nothing."""
    try:
        st = os.lstat(directory)  # a symlinked cache directory is never followed
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    return data if len(data) == KEY_BYTES else None


def load_key(cache_dir: Path, *, create: bool) -> bytes | None:
    """The node's marker key, made on first use when ``create`` (precreate); None when unusable.

    A new key is written to a private temporary name and linked into place, so two hooks
    starting at once agree on one key and no reader ever sees half a key. A bad file at the
    key's name is replaced by renaming the new key over it (``rename`` replaces the name, never
    what a symlink points at); two hooks replacing at once may each sign with their own key,
    and the loser's marker then only costs a second decision.
    """
    path = cache_dir / KEY_NAME
    if not create:
        return _read_key(path) if _safe_dir(cache_dir) else None
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    except OSError:
        return None
    if not _safe_dir(cache_dir):
        return None
    key = _read_key(path)
    if key is not None:
        return key
    tmp = cache_dir / f".{KEY_NAME}.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, os.urandom(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:  # another hook won the race, or a bad key file sits there
            if _read_key(path) is None:
                os.rename(tmp, path)
    except OSError:
        return None
    finally:
        try:  # noqa: SIM105 - contextlib would be one more import at start
            os.unlink(tmp)
        except OSError:
            pass
    return _read_key(path)
