"""The operator's settings file (``/etc/oci-device-hook/config.yaml``): read and validated once.

Rule: a missing default file means defaults; a file that cannot be read or parsed is an
``InputError`` naming it. The values and their rules are ``hook.core.settings``; this module reads
the bytes (never blocking on a FIFO), keeps the decider's view and the fast path's compiled record.
"""

from __future__ import annotations

import os
import stat as _stat
from pathlib import Path

from hook.core.errors import InputError
from hook.core.settings import (
    DeciderMode,
    EnvRequests,
    MigManagement,
    Policy,
    Settings,
    collect,
    convert,
    digest,
    document,
    parse_settings,
)

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = [  # the values are hook.core.settings'; named here too for the readers of the file
    "Policy",
    "DeciderMode",
    "MigManagement",
    "EnvRequests",
    "Settings",
    "DEFAULT_PATH",
    "parse_settings",
    "load_settings",
    "digest",
    "salvage_log",
    "lenient",
    "check_file",
]

DEFAULT_PATH = Path("/etc/oci-device-hook/config.yaml")
MAX_BYTES = 1 << 20
FASTPATH_MAX = 256 << 10


def check_file(path: Path) -> list[InputError]:
    """Every error in a settings file (``hook settings check``): all bad keys and values at once,
    each duplicate key among them (a duplicate hides no other error); a file that cannot be read
    or is not YAML is one error."""
    try:
        data = _read_file(path)
    except FileNotFoundError:
        return [InputError(str(path), "", "no such file")]
    except OSError as exc:
        return [InputError(str(path), "", exc.strerror or str(exc))]
    except InputError as exc:
        return [exc]
    duplicates: list[InputError] = []
    try:
        doc = parse_yaml(data, str(path), duplicates)
    except InputError as exc:
        return [*duplicates, exc]
    return duplicates + ([] if doc is None else collect(doc, str(path))[1])


def _read_file(path: Path) -> bytes:
    """The settings file's bytes; never blocks on a FIFO, never reads a huge file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except ValueError:
        raise InputError(str(path), "", "path contains a NUL byte") from None
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise InputError(str(path), "", "not a regular file")
        if st.st_size > MAX_BYTES:
            raise InputError(str(path), "", f"larger than {MAX_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)


def load_settings(path: Path, *, required: bool = False) -> Settings:
    """Read and validate the settings file; a missing default file means defaults.

    The live hook compiles a custom file into ``FASTPATH_CACHE`` (see ``remember_for_fast_path``),
    so a later container reads that JSON instead of importing yaml; a stale entry is ignored.
    The decider keeps the result while the file's identity holds (``hook.sources.warm``).
    """
    from hook.sources import warm

    return warm.remembered(
        ("settings", str(path), required), warm.identity(path), lambda: _load_settings(path, required)
    )


def _load_settings(path: Path, required: bool) -> Settings:
    try:
        data = _read_file(path)
    except FileNotFoundError:
        if required:
            raise InputError(str(path), "", "no such file") from None
        return Settings()
    except OSError as exc:
        raise InputError(str(path), "", exc.strerror or str(exc)) from None
    compiled = _compiled(path, data)
    settings = compiled or parse_settings(parse_yaml(data, str(path)), str(path))
    _loaded[os.path.abspath(path)] = (data, settings, compiled is not None)
    return settings


# The bytes each settings file was last loaded from in this process, what they made, and whether
# that came from the compiled record: the fast path's record is only ever written for these bytes.
_loaded: dict[str, tuple[bytes, Settings, bool]] = {}


def salvage_log(path: Path, keys: tuple[str, ...] = ("log_file", "log_max_bytes")) -> Settings:
    """Where a settings file that does not load still says the log goes: defaults, but with its
    ``log_file`` / ``log_max_bytes`` (or the ``keys`` given) when those are readable and valid (a
    file broken elsewhere, or YAML that does not parse but holds one plain top-level ``KEY: /path``
    line for a path key). The error about the file then reaches the operator's log, not the default one."""
    import re

    try:
        data = _read_file(path)
    except (OSError, InputError):
        return Settings()
    values: dict[str, Any] = {}
    try:
        doc = parse_yaml(data, str(path))
    except InputError:
        text = data.decode("utf-8", "replace")
        doc = {}
        for key in ("log_file", "metrics_textfile"):
            found = re.findall(rf"(?m)^{key}:[ \t]*(/[^\s#'\"]+)[ \t]*(?:#.*)?$", text)
            if len(found) == 1:
                doc[key] = found[0]
    if isinstance(doc, dict):
        for key in keys:
            if key in doc:
                try:  # noqa: SIM105 - contextlib would be one more import on the error path
                    values[key] = convert(key, doc[key], str(path))
                except InputError:
                    pass
    return Settings(**values)


def lenient(
    path: Path, keys: tuple[str, ...], *, required: bool = False
) -> tuple[Settings, InputError | None]:
    """The settings a tool that must survive a broken file reads (``hook log``, ``hook metrics``:
    the signal of the failure they report): the file's own values where it loads, else the defaults
    with only ``keys`` salvaged from it, and the error (for a warning, and ``settings_valid``)."""
    try:
        return load_settings(path, required=required), None
    except InputError as exc:
        if required and not path.exists():
            raise  # a --config naming no file is the command line's mistake, not a broken file
        return salvage_log(path, keys), exc


def parse_yaml(data: bytes, source: str, duplicates: list[InputError] | None = None) -> Any:
    """Decode a settings document; a duplicate key is an error (YAML would keep the last silently).

    With ``duplicates`` (``hook settings check``), each duplicate is appended there instead and the
    document is still decoded (the first value kept), so the file's other errors show too."""
    import yaml  # only containers that reach the slow path pay for it

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[object] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    line = key_node.start_mark.line + 1
                    error = InputError(source, str(key), f"duplicate key (line {line})")
                    if duplicates is None:
                        raise error
                    duplicates.append(error)
                seen.add(key)
            mapping = super().construct_mapping(node, deep=deep)
            if duplicates is not None:  # the first value, as the error names the later line
                for key_node, value_node in reversed(node.value):
                    if isinstance(key_node, yaml.ScalarNode) and not key_node.tag.endswith(":merge"):
                        key = self.construct_object(key_node, deep=True)
                        mapping[key] = self.construct_object(value_node, deep=deep)
            return mapping

    try:
        return yaml.load(data, Loader=Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise InputError(source, where, f"not valid YAML ({getattr(exc, 'problem', exc)})") from None


def _compiled(path: Path, data: bytes) -> Settings | None:
    """The settings compiled from these very bytes of this file (``data``), or None; a record this
    node's key did not seal (planted, or another version's) is a miss like any other."""
    from hook.sources.privatefile import fastpath_record

    directory, name = os.path.split(str(FASTPATH_CACHE))
    entry = fastpath_record(_cachefile().read(directory, name, FASTPATH_MAX), str(path), data)
    if entry is None:
        return None
    try:
        return parse_settings(entry["settings"], str(path))
    except InputError:
        return None


def _still_compiled(path: Path, data: bytes) -> bool:
    """``_compiled(path, data)`` found a record; the decider keeps a found one while the record
    file's identity holds (``hook.sources.warm``; any rewrite or removal moves it), so a request
    does not reread and re-seal-check it (~0.2 ms). A miss is never kept: it is written next."""
    from hook.sources import warm

    ident = warm.identity(FASTPATH_CACHE)
    return warm.remembered(
        ("fastpath compiled", os.path.abspath(path)),
        (ident, data),
        lambda: _compiled(path, data) is not None,
        keep=lambda found: found and ident is not None,
    )


def _cachefile() -> Any:
    from hook.sources import cachefile

    return cachefile


FASTPATH_CACHE = Path("/run/oci-device-hook/fastpath.json")
FASTPATH_ENTRIES = 16  # settings files remembered at once (engines, test runs); the oldest goes


def remember_for_fast_path(path: Path, settings: Settings) -> str | None:
    """Compile what ``hook.routes.fastpath`` needs from a custom settings file: a cache of the bytes
    ``settings`` was parsed from (their digest is the entry's key), sealed by the node's key with
    the other files' entries (up to ``FASTPATH_ENTRIES``). Settings this process did not load
    from ``path`` are not written: the record never says what the file does not.

    Returns a warning text instead of raising: a missing cache only costs speed, never a decision.
    """
    import json

    from hook.sources.nodekey import digest
    from hook.sources.privatefile import FASTPATH_FORMAT, loads

    key = os.path.abspath(path)
    seen = _loaded.get(key)
    if seen is None or seen[1] is not settings or seen[2]:
        return None  # not loaded from this file here, or already compiled from these very bytes
    data = seen[0]
    if _still_compiled(path, data):
        return None
    directory, name = os.path.split(str(FASTPATH_CACHE))
    cachefile = _cachefile()
    files: dict[str, Any] = {}
    old = cachefile.read(directory, name, FASTPATH_MAX)
    try:
        doc: Any = loads(old) if old is not None else None
        if cachefile.current(doc, "fastpath", FASTPATH_FORMAT) and isinstance(doc["files"], dict):
            files = dict(doc["files"])
    except Exception:  # an unreadable record is simply replaced
        files = {}
    files.pop(key, None)
    files[key] = {
        "digest": digest(data),
        "cdi_annotation_prefixes": list(settings.cdi_annotation_prefixes),
        "volume_mount_root": settings.volume_mount_root,
        "settings": document(settings),
    }
    while len(files) > FASTPATH_ENTRIES:
        files.pop(next(iter(files)))
    record = {**cachefile.stamp("fastpath", FASTPATH_FORMAT), "files": files}
    return cachefile.write(directory, name, json.dumps(record).encode())  # type: ignore[no-any-return]
