"""The posix-only fast path: everything a container that needs no decision costs, and nothing more.

Rule: a container that asks for no device and is not widened is answered from the raw JSON here,
with ``posix`` and the hook's private-file primitives (``hook.sources.privatefile``: the trust-checked
reads and ``loads``, the JSON decoding through ``json``'s own C scanner; importing the ``json``
package would pull in ``re``, ``enum`` and ``functools``, most of the fast path's cost) and nothing
else at load time. The full path shares its rules: ``needs_decision`` is the question every route
asks before it decides. ``hook.core.version`` is the only other hook module read, and only for
custom settings. ``posix``, not ``os``, and no ``from __future__``: hook.sources.privatefile says
why (the annotations naming typing-only types are strings).
"""

import posix

from hook.sources.privatefile import FASTPATH_CACHE as FASTPATH_CACHE
from hook.sources.privatefile import FASTPATH_FORMAT as FASTPATH_FORMAT
from hook.sources.privatefile import FASTPATH_MAX as FASTPATH_MAX
from hook.sources.privatefile import SETTINGS_MAX, fastpath_record, is_regular, normpath, read_sealed
from hook.sources.privatefile import loads as loads
from hook.sources.privatefile import read_limited as read_limited

TYPE_CHECKING = False  # typing is not imported at run time: the fast path cannot afford it
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SETTINGS = "/etc/oci-device-hook/config.yaml"
DEFAULT_PREFIXES = ("cdi.k8s.io/",)
DEFAULT_MOUNT_ROOT = "/var/run/nvidia-container-devices"
MAX_STATE = 1 << 20
MAX_CONFIG = 16 << 20
NVIDIA_ENVS = (
    "NVIDIA_VISIBLE_DEVICES=",
    "NVIDIA_MIG_CONFIG_DEVICES=",
    "NVIDIA_MIG_MONITOR_DEVICES=",
    "NVIDIA_IMEX_CHANNELS=",
)
# Nodes every engine may add to any container, with the numbers the kernel gives them; anything
# else in linux.devices (another node, or one of these paths with other numbers) takes the slow path.
PLAIN_DEVICES = {
    "/dev/null": (1, 3),
    "/dev/zero": (1, 5),
    "/dev/full": (1, 7),
    "/dev/random": (1, 8),
    "/dev/urandom": (1, 9),
    "/dev/tty": (5, 0),
    "/dev/console": (5, 1),
    "/dev/ptmx": (5, 2),
    "/dev/fuse": (10, 229),
    "/dev/net/tun": (10, 200),
    "/dev/kvm": (10, 232),
}
PLAIN_NODES = frozenset(PLAIN_DEVICES)
# Char majors the kernel assigns statically to memory devices, ttys and pty slaves (its
# Documentation/admin-guide/devices.txt): no accelerator driver can ever register one, so an
# allow rule on them (runc's and containerd's ``c 136:* rwm`` for /dev/pts) reaches no accelerator.
STATIC_MAJORS = frozenset({1, 4, 5, *range(136, 144)})
PLAIN_NUMBERS = frozenset(PLAIN_DEVICES.values())
NUMBER_LIMIT = 1 << 31  # hook.core.oci.RULE_NUMBER_LIMIT: beyond it runc and crun read a number differently


def _settings_entry(path: str) -> "dict[str, Any] | None":
    """This settings file's compiled entry: ``{}`` for defaults (absent or all comments), the
    fast-path record's entry for a custom file (a cache of these very bytes, sealed by the node's
    key), None when unknown (the full path's to read)."""
    try:
        st = posix.stat(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None
    if not is_regular(st.st_mode):
        return None
    try:
        text = read_limited(path, SETTINGS_MAX)
    except (OSError, ValueError):
        return None
    lines = (ln.strip() for ln in text.splitlines())
    if all(not ln or ln.startswith(b"#") or ln == b"---" for ln in lines):
        return {}
    directory, _, name = FASTPATH_CACHE.rpartition("/")
    return fastpath_record(read_sealed(directory, name, FASTPATH_MAX), path, text)


def fast_settings(path: str) -> "tuple[tuple[str, ...], str] | None":
    """The two settings the fast path needs (CDI annotation prefixes, volume-mount root), or None.

    Defaults when the file is absent or all comments. Otherwise the full path has compiled them
    into ``FASTPATH_CACHE`` keyed by the file's path and its bytes' digest, sealed by the node's
    key (no key on the node: no entry); a stale, forged or missing entry means
    "take the full path", which rewrites it. So custom settings cost yaml once, not on every
    container. A settings file that is not a regular file is the full path's to report.
    """
    entry = _settings_entry(path)
    if entry is None:
        return None
    if not entry:
        return DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT
    return tuple(entry["cdi_annotation_prefixes"]), entry["volume_mount_root"]


def decider_setting(path: str) -> "str | None":
    """The settings' ``decider`` (``auto``/``off``) without yaml, as ``fast_settings`` reads the
    rest; None when unknown (no current record: ask, and the decider declines when it is off)."""
    entry = _settings_entry(path)
    if entry is None:
        return None
    value = (entry.get("settings") or {}).get("decider", "auto") if entry else "auto"
    return value if isinstance(value, str) else None


def needs_decision(
    config: "dict[str, Any]",
    annotations: "dict[str, Any]",
    prefixes: "tuple[str, ...]" = ("cdi.k8s.io/",),
    mount_root: str = "",
) -> bool:
    """A cheap superset of "this container asks for a device or is widened"; false means nothing to do."""
    linux = config.get("linux") or {}
    for rule in (linux.get("resources") or {}).get("devices") or ():
        if isinstance(rule, dict) and rule.get("allow") is True and _may_open_accelerator(rule):
            return True
    for dev in linux.get("devices") or ():
        if not isinstance(dev, dict) or not _plain_device(dev):
            return True
    for key in list(annotations) + list(config.get("annotations") or {}):
        if isinstance(key, str) and key.startswith(prefixes):
            return True
    root = _container_path(mount_root) + "/" if mount_root else ""
    for m in config.get("mounts") or ():
        dest = _container_path(str(m.get("destination", ""))) if isinstance(m, dict) else ""
        if "nvidia-container-devices" in dest or (root and dest.startswith(root)):
            return True
    names = set()
    for entry in (config.get("process") or {}).get("env") or ():
        if isinstance(entry, str) and entry.startswith(NVIDIA_ENVS):
            value = entry.partition("=")[2].strip()
            if value and value != "void":
                return True
        if isinstance(entry, str):
            names.add(entry.partition("=")[0])
    # a legacy CUDA image asks for every GPU (NVIDIA's cuda_image.go): CUDA_VERSION, no REQUIRE_CUDA
    return "CUDA_VERSION" in names and not names & {"NVIDIA_REQUIRE_CUDA", "NVIDIA_VISIBLE_DEVICES"}


def _container_path(path: str) -> str:
    """``hook.core.kpath.container_path`` with ``os`` only: ``//x`` is ``/x``, a relative path is
    below ``/``."""
    clean = normpath("/" + path)
    return clean[1:] if clean.startswith("//") else clean


def _join(directory: str, name: str) -> str:
    """``os.path.join(directory, name)`` for a relative ``name``, without importing ``os``."""
    return directory + name if directory.endswith("/") else directory + "/" + name


def _plain_device(dev: "dict[str, Any]") -> bool:
    """A ``linux.devices`` entry that is one of the plain nodes, numbers included (a /dev/null
    made as ``c 195:3`` is a GPU to the kernel, whatever its name)."""
    numbers = PLAIN_DEVICES.get(str(dev.get("path", "")))
    kind, found = dev.get("type"), (dev.get("major"), dev.get("minor"))
    return numbers is not None and kind in ("c", "u") and found == numbers


def _may_open_accelerator(rule: "dict[str, Any]") -> bool:
    """An allow rule that could let the container read or write an accelerator, as runc reads it.

    ``a`` (any numbers: runc allows every device), a typed wildcard (no number, or a negative
    one: runc's ``*``) and an exact number outside the plain nodes all may; block devices, an
    ``m``-only rule and the statically assigned tty/memory majors cannot. The full decision is
    the judge of everything this lets through (tests/test_fastpath_differential.py)."""
    kind = rule.get("type") or "a"
    if kind == "a":
        return True
    access = rule.get("access")
    if kind == "b" or (isinstance(access, str) and access and not ("r" in access or "w" in access)):
        return False
    major, minor = rule.get("major"), rule.get("minor")
    for n in (major, minor):
        if n is not None and not (_is_int(n) and -NUMBER_LIMIT <= n < NUMBER_LIMIT):
            return True  # runtimes read it differently: the full path reads it as *
    if major is None or major < 0:
        return True
    if major in STATIC_MAJORS:
        return False
    return minor is None or minor < 0 or (major, minor) not in PLAIN_NUMBERS


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strs(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _opt(obj: "dict[str, Any]", key: str, ok: object) -> bool:
    """``obj[key]`` is absent or passes ``ok`` (a type or a predicate)."""
    if key not in obj:
        return True
    v = obj[key]
    return isinstance(v, ok) if isinstance(ok, type) else bool(ok(v))  # type: ignore[operator]


def _str_map(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def well_formed(state: "dict[str, Any]", config: "dict[str, Any]") -> bool:
    """Every field ``hook.core.oci`` type-checks has the type it wants (a conservative copy of its
    rules): the fast path may only answer for input the full parsers would accept."""
    bundle = state.get("bundle", state.get("bundlePath"))
    pid = state.get("pid")
    if not (isinstance(bundle, str) and bundle and (pid is None or (_is_int(pid) and pid >= 0))):
        return False
    if not all(_opt(state, k, str) for k in ("ociVersion", "id", "status")):
        return False
    if not (_opt(state, "annotations", _str_map) and _opt(config, "annotations", _str_map)):
        return False
    if not (
        _opt(config, "ociVersion", str) and all(_opt(config, k, dict) for k in ("process", "linux", "root"))
    ):
        return False
    process, linux, root = config.get("process") or {}, config.get("linux") or {}, config.get("root") or {}
    caps = process.get("capabilities")
    if not (_opt(process, "env", _strs) and _opt(root, "path", str)):
        return False
    if caps is not None and not (
        _strs(caps) or (isinstance(caps, dict) and _strs(caps.get("bounding") or []))
    ):
        return False
    for m in _list(config.get("mounts")):
        if not (
            isinstance(m, dict)
            and isinstance(m.get("destination"), str)
            and _strs(m.get("options") or [])
            and _opt(m, "source", str)
            and _opt(m, "type", str)
        ):
            return False
    for d in _list(linux.get("devices")):
        if not (
            isinstance(d, dict)
            and isinstance(d.get("path"), str)
            and d.get("type") in ("c", "b", "u", "p")
            and all(_is_int(d.get(k)) for k in ("major", "minor"))
            and all(_opt(d, k, _is_int) for k in ("fileMode", "uid", "gid"))
        ):
            return False
    if not _opt(linux, "resources", dict):
        return False
    for r in _list((linux.get("resources") or {}).get("devices")):
        if not (
            isinstance(r, dict)
            and isinstance(r.get("allow"), bool)
            and (r.get("type") or "a") in ("a", "c", "b")
            and isinstance(r.get("access", "rwm"), str)
            and set(r.get("access", "rwm")) <= set("rwm")
            and all(_opt(r, k, _is_int) for k in ("major", "minor"))  # hook.core.oci reads every int
        ):
            return False
    return True


def _list(v: object) -> "list[Any]":
    if v is None:
        return []
    if not isinstance(v, list):
        raise TypeError("expected a list")
    return v


class Look:
    """What the live hook read of its container, handed down so nothing is read or decoded twice.

    ``state`` and ``config`` are the decoded objects (None where not decoded here: the full
    path decodes or reports them), ``config_bytes`` config.json's bytes as read (the decider is
    handed these), ``bundle`` where the state says they are, and ``done`` the fast path's answer.
    """

    __slots__ = ("bundle", "config", "config_bytes", "done", "state", "stdin")

    def __init__(self, stdin: bytes) -> None:
        self.stdin = stdin
        self.state: dict[str, Any] | None = None
        self.bundle: str | None = None
        self.config_bytes: bytes | None = None
        self.config: dict[str, Any] | None = None
        self.done = False

    def read_config(self) -> None:
        """config.json's bytes, when not read yet; a problem leaves None (the full path reports it)."""
        if self.config_bytes is None and self.bundle is not None:
            try:  # noqa: SIM105 - contextlib is one more import on the start path
                self.config_bytes = read_limited(_join(self.bundle, "config.json"), MAX_CONFIG)
            except (OSError, ValueError):
                pass


def look_at(opts: "dict[str, list[str]]", stdin: bytes, *, fast: bool = True) -> Look:
    """The live path's one load step: the state decoded, config.json read and decoded once (when
    the fast path may answer), and whether it answered "nothing to do" (``done``).

    Any doubt (unreadable input, custom settings not compiled yet) leaves ``done`` false: the
    full path then decides, and reports a problem properly, with the file and the field.
    """
    seen = Look(stdin)
    if len(stdin) > MAX_STATE:
        return seen
    try:
        state = loads(stdin)
    except Exception:  # any doubt: the full path decodes (and reports) it
        return seen
    if not isinstance(state, dict):
        return seen
    seen.state = state
    bundle = state.get("bundle") or state.get("bundlePath")
    if isinstance(bundle, str) and bundle and "\0" not in bundle:
        seen.bundle = bundle
    settings = fast_settings((opts.get("--config") or [DEFAULT_SETTINGS])[-1]) if fast else None
    if settings is None or seen.bundle is None:
        return seen
    try:
        seen.read_config()
        if seen.config_bytes is None:
            return seen
        config = loads(seen.config_bytes)
        if isinstance(config, dict):
            seen.config = config
        annotations = state.get("annotations") or {}
        if not isinstance(config, dict) or not isinstance(annotations, dict):
            return seen
        if not well_formed(state, config):
            return seen
        seen.done = not needs_decision(config, annotations, *settings)
    except Exception:  # any doubt (deep, huge, odd input): the full path decides
        pass
    return seen


def fast_path(opts: "dict[str, list[str]]", stdin: bytes) -> bool:
    """Answer "nothing to do" from raw JSON (``look_at``), or return False to take the full path."""
    return look_at(opts, stdin).done


def precreate_fast(opts: "dict[str, list[str]]", stdin: bytes) -> bool:
    """``hook precreate``'s fast path: this config (on stdin) needs no decision, pass it on as is."""
    fast = fast_settings((opts.get("--config") or [DEFAULT_SETTINGS])[-1])
    if fast is None:
        return False
    try:
        config = loads(stdin)
        if not isinstance(config, dict) or not well_formed({"bundle": "-"}, config):
            return False
        return not needs_decision(config, {}, *fast)
    except (ValueError, TypeError, AttributeError):
        return False
