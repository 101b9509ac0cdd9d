"""The os-only fast path: everything a container that needs no decision costs, and nothing more.

Rule: this module sits below everything it serves (``hook.entry``, ``hook.routes.live``,
``hook.routes.precreate``, ``hook.sources.settingsfile``, ``hook.sources.cachefile``) and imports
only ``os`` at load time, so
the console entry, the caches and the full path share one copy of each rule without an import
circle. A container that asks for no device and is not widened is answered from the raw JSON
here, decoded by ``json``'s own C scanner (``loads``: importing the ``json`` package would pull in
``re``, ``enum`` and ``functools``, most of the fast path's cost). ``hook.core.version`` is the only
hook module read, and only for custom settings.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time: the fast path cannot afford it
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SETTINGS = "/etc/oci-device-hook/config.yaml"
DEFAULT_PREFIXES = ("cdi.k8s.io/",)
DEFAULT_MOUNT_ROOT = "/var/run/nvidia-container-devices"
FASTPATH_CACHE = "/run/oci-device-hook/fastpath.json"
FASTPATH_FORMAT = 2  # 2: one entry per settings file, with the hook's version
FASTPATH_MAX = 256 << 10
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


class _Defaults:
    """What ``_json.make_scanner`` reads from its context: exactly ``json.JSONDecoder()``'s defaults."""

    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    strict = True
    memo: dict[str, Any] = {}


_JSON_WS = " \t\n\r"  # json.decoder.WHITESPACE
_OTHER_ENCODING = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")  # BOMs json.detect_encoding honours
_scanner: list[Any] = []  # [scan_once] once built; [None] where this Python has no _json


def loads(data: bytes) -> Any:
    """``json.loads(data)`` (same value, a ValueError where it fails) without importing ``json``.

    UTF-8 input goes through the C scanner ``json.loads`` itself uses, set up as its default
    decoder. Whatever ``json.detect_encoding`` might read as another encoding (a BOM, a NUL in the
    first four bytes), a Python without ``_json``, and every way the scanner can fail other than
    a plain decode error (a ``SystemError`` on a truncated escape, a ``RecursionError`` on deep
    nesting) are handed to ``json.loads`` itself: the trick never decides a case the public way
    would decide differently (tests/fuzz proves it on mutated and truncated real configs).
    """
    if not _scanner:
        try:
            from _json import make_scanner
        except ImportError:
            _scanner.append(None)
        else:
            _scanner.append(make_scanner(_Defaults()))  # type: ignore[arg-type]
    scan_once = _scanner[0]
    if scan_once is not None and b"\x00" not in data[:4] and not data.startswith(_OTHER_ENCODING):
        try:
            text = data.decode("utf-8", "surrogatepass")
            value, end = scan_once(text, len(text) - len(text.lstrip(_JSON_WS)))
            if not text[end:].lstrip(_JSON_WS):
                return value
        except Exception:  # any surprise of the trick: ask the public way
            pass
    import json

    return json.loads(data)


def read_limited(fd_or_path: int | str, limit: int) -> bytes:
    """At most ``limit`` bytes (a path: a ValueError when larger); never blocks on a FIFO or a tty."""
    if isinstance(fd_or_path, int):
        with open(fd_or_path, "rb", closefd=False) as f:
            return f.read(limit + 1)
    fd = os.open(fd_or_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not _regular(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = _read_fd(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def _regular(mode: int) -> bool:
    return mode & 0o170000 == 0o100000  # stat.S_ISREG without importing stat


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(limit - size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def open_private(directory: str, name: str, limit: int) -> int | None:
    """An fd on ``directory/name`` if both are the hook's own, else None (a cache miss).

    The rule for every file under the cache directory (``hook.sources.cachefile`` writes them; the fast
    path reads here, with ``os`` only): the directory is not a symlink, is owned by this user
    and open to no one else; the file is opened ``O_NOFOLLOW|O_NONBLOCK`` relative to it and
    ``fstat`` says regular, ours, not group/other-writable and at most ``limit`` bytes before a
    byte is read. A FIFO, a device, a symlink, a planted or huge file is a miss, never a hang.
    """
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except (OSError, ValueError):
        return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        ours = st.st_uid == os.geteuid() and not st.st_mode & 0o022
        if _regular(st.st_mode) and ours and st.st_size <= limit:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_private(directory: str, name: str, limit: int) -> bytes | None:
    """The bytes of ``directory/name`` under ``open_private``'s rule, else None (a cache miss)."""
    fd = open_private(directory, name, limit)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        data = _read_fd(fd, size + 1)
        return data if len(data) == size else None  # changed while read: a miss
    except OSError:
        return None
    finally:
        os.close(fd)


def settings_identity(path: str, st: os.stat_result) -> list[object]:
    """What ties a fast-path record to one settings file's content (any edit changes it)."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def fastpath_record(data: bytes | None, path: str, st: os.stat_result) -> dict[str, Any] | None:
    """This settings file's entry in the fast-path record, or None when anything is off.

    The record is ``{"format", "hook", "files": {abspath: entry}}``: several settings files
    (several engines, a test run) each keep their entry. Another format or hook version, a
    foreign shape, garbage or a truncated file is a miss; the full path rewrites it.
    """
    if data is None:
        return None
    from hook.core.version import VERSION  # only for custom settings: the default fast path never reads it

    try:
        doc = loads(data)
        entry = doc["files"][os.path.abspath(path)]
        if (
            doc["kind"] != "fastpath"
            or doc["format"] != FASTPATH_FORMAT
            or doc["hook"] != VERSION
            or entry["key"] != settings_identity(path, st)
            or not _strs(entry["cdi_annotation_prefixes"])
            or not all(entry["cdi_annotation_prefixes"])
            or not isinstance(entry["volume_mount_root"], str)
            or not isinstance(entry["settings"], dict)
        ):
            return None
    except Exception:  # whatever the file holds, it is only a miss
        return None
    return entry if isinstance(entry, dict) else None


def fast_settings(path: str) -> tuple[tuple[str, ...], str] | None:
    """The two settings the fast path needs (CDI annotation prefixes, volume-mount root), or None.

    Defaults when the file is absent or all comments. Otherwise the full path has compiled them
    into ``FASTPATH_CACHE`` keyed by the file's path and identity; a stale or missing entry means
    "take the full path", which rewrites it. So custom settings cost yaml once, not on every
    container. A settings file that is not a regular file is the full path's to report.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT
    except (OSError, ValueError):
        return None
    if not _regular(st.st_mode):
        return None
    if st.st_size < 65536:
        try:
            text = read_limited(path, 65536)
        except (OSError, ValueError):
            return None
        lines = (ln.strip() for ln in text.splitlines())
        if all(not ln or ln.startswith(b"#") or ln == b"---" for ln in lines):
            return DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT
    directory, name = os.path.split(FASTPATH_CACHE)
    entry = fastpath_record(read_private(directory, name, FASTPATH_MAX), path, st)
    if entry is None:
        return None
    return tuple(entry["cdi_annotation_prefixes"]), entry["volume_mount_root"]


def needs_decision(
    config: dict[str, Any],
    annotations: dict[str, Any],
    prefixes: tuple[str, ...] = ("cdi.k8s.io/",),
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
    clean = os.path.normpath("/" + path)
    return clean[1:] if clean.startswith("//") else clean


def _plain_device(dev: dict[str, Any]) -> bool:
    """A ``linux.devices`` entry that is one of the plain nodes, numbers included (a /dev/null
    made as ``c 195:3`` is a GPU to the kernel, whatever its name)."""
    numbers = PLAIN_DEVICES.get(str(dev.get("path", "")))
    kind, found = dev.get("type"), (dev.get("major"), dev.get("minor"))
    return numbers is not None and kind in ("c", "u") and found == numbers


def _may_open_accelerator(rule: dict[str, Any]) -> bool:
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


def _opt(obj: dict[str, Any], key: str, ok: object) -> bool:
    """``obj[key]`` is absent or passes ``ok`` (a type or a predicate)."""
    if key not in obj:
        return True
    v = obj[key]
    return isinstance(v, ok) if isinstance(ok, type) else bool(ok(v))  # type: ignore[operator]


def _str_map(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def well_formed(state: dict[str, Any], config: dict[str, Any]) -> bool:
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


def _list(v: object) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise TypeError("expected a list")
    return v


def fast_path(opts: dict[str, list[str]], stdin: bytes) -> bool:
    """Answer "nothing to do" from raw JSON, or return False to take the full path.

    Any doubt (unreadable input, custom settings) returns False: the full path then reports it
    properly, with the file and the field.
    """
    fast = fast_settings((opts.get("--config") or [DEFAULT_SETTINGS])[-1])
    if len(stdin) > MAX_STATE or fast is None:
        return False
    try:
        state = loads(stdin)
        bundle = state.get("bundle") or state.get("bundlePath")
        config = loads(read_limited(os.path.join(bundle, "config.json"), MAX_CONFIG))
        annotations = state.get("annotations") or {}
        if (
            not isinstance(config, dict)
            or not isinstance(annotations, dict)
            or not well_formed(state, config)
        ):
            return False
        return not needs_decision(config, annotations, *fast)
    except Exception:  # any doubt (deep, huge, odd input): the full path decides
        return False


def precreate_fast(opts: dict[str, list[str]], stdin: bytes) -> bool:
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
