"""Engine registration as data: containerd's config edits and the hooks.d file's name, computed.

Rule: pure functions of file contents; ``hook.tools.install`` reads and writes the files,
``hook.tools.doctor``
reports. containerd's config is edited as text, line by line, never re-emitted: comments, order
and every key we do not own stay byte for byte, and a result is accepted only when ``tomllib``
reads it as the original with exactly the intended ``BinaryName`` values changed. Python has no
TOML writer, and one is not needed for setting one string per runtime handler.

containerd facts (as ``nvidia-ctk runtime configure`` treats them, NVIDIA/nvidia-container-toolkit
pkg/config/engine/containerd/containerd.go): a missing or empty config means version 2; a
non-empty config without ``version`` is version 1 (not supported here); the CRI runtime plugin is
``io.containerd.grpc.v1.cri`` in version 2 and ``io.containerd.cri.v1.runtime`` from version 3;
a handler's runc binary is ``options.BinaryName`` of ``...containerd.runtimes.<handler>``.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from hook.core.errors import InputError
from hook.core.record import record

__all__ = [
    "HOOKS_NAME",
    "LATE_HOOKS_NAME",
    "PRECREATE_NAME",
    "NVIDIA_HOOKS_NAMES",
    "Handler",
    "ContainerdEdit",
    "cri_plugin",
    "config_version",
    "handlers",
    "handlers_in",
    "register_containerd",
    "unregister_containerd",
    "hooks_file_name",
    "hooks_order",
    "StageHooks",
    "base_spec_hooks",
    "runs_after_nvidia",
]

RUNC_TYPES = frozenset({"io.containerd.runc.v2", "io.containerd.runc.v1", "io.containerd.runtime.v1.linux"})
DEFAULT_RUNTIME_TYPE = "io.containerd.runc.v2"
HOOKS_NAME = "oci-device-hook.json"
PRECREATE_NAME = "oci-device-hook-precreate.json"  # as packaging/engines ships it
LATE_HOOKS_NAME = "zz-oci-device-hook.json"  # sorts after NVIDIA's file: ours runs after its hook
NVIDIA_HOOKS_NAMES = ("oci-nvidia-hook.json", "nvidia-container-toolkit.json")


# --- containerd --------------------------------------------------------------------------------------


def config_version(doc: Mapping[str, Any], empty: bool) -> int:
    if empty:
        return 2
    v = doc.get("version", 1)
    return v if isinstance(v, int) and not isinstance(v, bool) else -1


def cri_plugin(version: int) -> str:
    return "io.containerd.grpc.v1.cri" if version == 2 else "io.containerd.cri.v1.runtime"


def _runtimes_path(version: int) -> list[str]:
    return ["plugins", cri_plugin(version), "containerd", "runtimes"]


def _get(doc: Mapping[str, Any], path: Sequence[str]) -> Any:
    obj: Any = doc
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    return obj


@record(kw_only=False)
class Handler:
    """One containerd runtime handler and the runc binary it runs ("" = containerd's default, runc)."""

    name: str
    runtime_type: str
    binary: str
    default: bool
    base_spec: str = ""  # the handler's base_runtime_spec file ("" = containerd's built-in spec)


def parse(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, "", f"not valid TOML ({exc})") from None


def handlers(text: str, source: str, version: int | None = None) -> tuple[int, list[Handler]]:
    """The config's version and its runtime handlers (``[]`` where it defines none).

    ``version`` is the root config's for an imported file (containerd reads a drop-in's plugin
    names as its root's; ``hook.tools.ctdconfig`` checks the drop-in's own ``version`` agrees)."""
    doc = parse(text, source)
    if version is None:
        version = config_version(doc, not text.strip())
    if version not in (2, 3):
        raise InputError(source, "version", f"containerd config version {version} is not supported (2 or 3)")
    return version, handlers_in(doc, version)


def handlers_in(doc: Mapping[str, Any], version: int) -> list[Handler]:
    """The runtime handlers of a decoded config (or of a merged view of several)."""
    runtimes = _get(doc, _runtimes_path(version)) or {}
    if not isinstance(runtimes, Mapping):
        return []
    default = _get(doc, ["plugins", cri_plugin(version), "containerd", "default_runtime_name"]) or "runc"
    out = []
    for name, body in runtimes.items():
        if not isinstance(body, Mapping):
            continue
        binary = _get(body, ["options", "BinaryName"])
        base = body.get("base_runtime_spec")
        out.append(
            Handler(
                name,
                str(body.get("runtime_type", "")),
                binary if isinstance(binary, str) else "",
                name == default,
                base if isinstance(base, str) else "",
            )
        )
    return out


# --- TOML text, line by line ------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _split_keys(text: str) -> list[str] | None:
    """``a."b.c".d`` → ``["a", "b.c", "d"]``; None where it is not a plain dotted key."""
    keys, i, text = [], 0, text.strip()
    while i < len(text):
        if text[i] in "\"'":
            quote = text[i]
            end = text.find(quote, i + 1)
            if end < 0:
                return None
            raw = text[i + 1 : end]
            keys.append(json.loads(f'"{raw}"') if quote == '"' else raw)
            i = end + 1
        else:
            m = _BARE.match(text, i)
            if not m:
                return None
            keys.append(m.group())
            i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text):
            if text[i] != ".":
                return None
            i += 1
            while i < len(text) and text[i] in " \t":
                i += 1
    return keys


def _header(line: str) -> list[str] | None:
    """The key path of a ``[table]`` header line (``[[array]]`` headers give ``["[["]``)."""
    s = line.strip()
    if s.startswith("[["):
        return ["[["]
    if not s.startswith("["):
        return None
    body = s[1:].split("#", 1)[0].rstrip() if '"' not in s and "'" not in s else s[1:]
    end = body.rfind("]")
    return _split_keys(body[:end]) if end >= 0 else None


def _tables(lines: Sequence[str]) -> dict[tuple[str, ...], tuple[int, int]]:
    """Table path → (header line index, end index exclusive) for every ``[table]`` in the text."""
    spans: dict[tuple[str, ...], tuple[int, int]] = {}
    current: tuple[str, ...] | None = None
    start = 0
    for i, line in enumerate(lines):
        path = _header(line)
        if path is None:
            continue
        if current is not None:
            spans[current] = (start, i)
        current, start = (tuple(path), i) if path != ["[["] else (None, i)
    if current is not None:
        spans[current] = (start, len(lines))
    return spans


_KEY_LINE = re.compile(r"""^\s*(?:BinaryName|"BinaryName"|'BinaryName')\s*=""")
_OTHER_OPTION = re.compile(r"""^\s*["']?options["']?\s*[.=]""")


def _quote(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string for these paths


_ADDED_TYPE = f"  runtime_type = {_quote(DEFAULT_RUNTIME_TYPE)}\n"  # the line a runtime table we add has


@record
class ContainerdEdit:
    """What registering changed in one handler, enough to undo exactly that."""

    handler: str
    binary: str  # what BinaryName is now
    previous_line: str = ""  # the BinaryName line it replaced ("" = there was none)
    added_tables: tuple[tuple[str, ...], ...] = ()  # tables registering created (removed if left empty)

    def to_json(self) -> dict[str, Any]:
        return {
            "handler": self.handler,
            "binary": self.binary,
            "previous_line": self.previous_line,
            "added_tables": [list(t) for t in self.added_tables],
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> ContainerdEdit:
        return ContainerdEdit(
            handler=str(obj["handler"]),
            binary=str(obj["binary"]),
            previous_line=str(obj.get("previous_line", "")),
            added_tables=tuple(tuple(t) for t in obj.get("added_tables", ())),
        )


def _header_text(path: Sequence[str]) -> str:
    return "[" + ".".join(k if _BARE.fullmatch(k) else _quote(k) for k in path) + "]"


def register_containerd(
    text: str,
    source: str,
    binary_for: Mapping[str, str],
    default_binary: str,
    *,
    version: int | None = None,
    names: Sequence[str] | None = None,
    add_runc: bool | None = None,
) -> tuple[str, list[ContainerdEdit]]:
    """Point every runc-type handler's ``BinaryName`` at the wrapper; the new text and the edits.

    ``binary_for`` maps a handler whose BinaryName is not runc's default (e.g. ``nvidia``:
    nvidia-container-runtime) to the wrapper path that runs it; other handlers get
    ``default_binary``. A config without handlers gets a ``runc`` handler (containerd's implicit
    default made explicit). A layout this line editor cannot change safely is an error, and
    nothing is changed.

    In one file of several (containerd ``imports``; ``hook.tools.ctdconfig`` plans them): ``version``
    is the root's, ``names`` the handlers to edit here (their type may be set in another file),
    ``add_runc`` whether this file gets the ``runc`` handler when it defines none.
    """
    drop_in = version is not None
    version, found = handlers(text, source, version)
    prefix = _runtimes_path(version)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    if not text.strip() and not drop_in:
        lines = ["version = 2\n"]
    if names is not None:
        todo = [h for h in found if h.name in names]
    else:
        todo = [h for h in found if h.runtime_type in RUNC_TYPES]
    if not found and (add_runc if add_runc is not None else names is None):
        todo = [Handler("runc", DEFAULT_RUNTIME_TYPE, "", True)]
    if not todo and names is None:
        raise InputError(source, ".".join(prefix), "no runc-type runtime handler to register with")
    edits: list[ContainerdEdit] = []
    appended: list[str] = []
    for h in todo:
        want = binary_for.get(h.name, default_binary)
        if h.binary == want:
            continue
        spans = _tables(lines)
        runtime_path, options_path = (*prefix, h.name), (*prefix, h.name, "options")
        line = f"  BinaryName = {_quote(want)}\n"
        if options_path in spans:
            start, end = spans[options_path]
            hit = next((i for i in range(start + 1, end) if _KEY_LINE.match(lines[i])), None)
            if hit is None:
                indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())] + "  "
                lines.insert(start + 1, f"{indent}{line.lstrip()}")
                edits.append(ContainerdEdit(handler=h.name, binary=want))
            else:
                indent = lines[hit][: len(lines[hit]) - len(lines[hit].lstrip())]
                edits.append(ContainerdEdit(handler=h.name, binary=want, previous_line=lines[hit]))
                lines[hit] = f"{indent}BinaryName = {_quote(want)}\n"
            continue
        if runtime_path in spans:
            start, end = spans[runtime_path]
            if any(_OTHER_OPTION.match(lines[i]) for i in range(start + 1, end)):
                raise InputError(source, ".".join(options_path), "set inline; edit BinaryName by hand")
            appended += ["\n", _header_text(options_path) + "\n", line]
            edits.append(ContainerdEdit(handler=h.name, binary=want, added_tables=(options_path,)))
            continue
        if found:
            raise InputError(source, ".".join(runtime_path), "not a [table] of its own; edit it by hand")
        appended += [
            "\n",
            _header_text(runtime_path) + "\n",
            _ADDED_TYPE,
            "\n",
            _header_text(options_path) + "\n",
            line,
        ]
        edits.append(ContainerdEdit(handler=h.name, binary=want, added_tables=(runtime_path, options_path)))
    new = "".join(lines + appended)
    if not edits:
        return text, []
    _check(text, new, source, version, {e.handler: e.binary for e in edits}, edits, drop_in)
    return new, edits


def _check(
    old: str,
    new: str,
    source: str,
    version: int,
    binaries: Mapping[str, str],
    edits: Sequence[ContainerdEdit],
    drop_in: bool = False,
) -> None:
    """``new`` must read as ``old`` with exactly the intended BinaryName values (and no other change)."""
    expected = copy.deepcopy(parse(old, source))
    if not old.strip() and not drop_in:
        expected["version"] = 2
    for e in edits:
        node = expected
        for key in _runtimes_path(version):
            node = node.setdefault(key, {})
        handler = node.setdefault(e.handler, {})
        if (*_runtimes_path(version), e.handler) in e.added_tables:
            handler["runtime_type"] = DEFAULT_RUNTIME_TYPE
        handler.setdefault("options", {})["BinaryName"] = binaries[e.handler]
    got = parse(new, f"{source} (as edited)")
    if got != expected:
        raise InputError(source, "", "the edited config would not read as intended; nothing changed")


def unregister_containerd(
    text: str, source: str, edits: Sequence[ContainerdEdit], version: int | None = None
) -> str:
    """Undo ``edits`` in the current text, whatever else changed since: a BinaryName that still
    names our wrapper gets its previous line back (or goes), and a table we added goes when empty."""
    version, _ = handlers(text, source, version)
    prefix = _runtimes_path(version)
    lines = text.splitlines(keepends=True)
    for e in edits:
        spans = _tables(lines)
        options_path = (*prefix, e.handler, "options")
        if options_path in spans:
            start, end = spans[options_path]
            for i in range(start + 1, end):
                if _KEY_LINE.match(lines[i]) and e.binary in lines[i]:
                    lines[i : i + 1] = [e.previous_line] if e.previous_line else []
                    break
        for table in sorted(e.added_tables, key=len, reverse=True):
            spans = _tables(lines)
            if tuple(table) not in spans:
                continue
            start, end = spans[tuple(table)]
            body = lines[start + 1 : end]
            if all(not ln.strip() or ln.lstrip().startswith("#") or ln == _ADDED_TYPE for ln in body):
                while start > 0 and not lines[start - 1].strip():
                    start -= 1  # the blank line registering put before it
                del lines[start:end]
    new = "".join(lines)
    parse(new, f"{source} (as restored)")
    return new


# --- hooks.d -----------------------------------------------------------------------------------------


def hooks_file_name(names_present: Sequence[str]) -> str:
    """Our hooks.d file name: the contract's, unless an NVIDIA hook file would sort after it.

    Engines run the hooks of one stage in the order of their file names (lower-cased, across
    every hooks directory; containers/common oci-hooks(5)), and ours must run after NVIDIA's,
    which creates the nodes ours then narrows.
    """
    ours = HOOKS_NAME.lower()
    if any(n.lower() in NVIDIA_HOOKS_NAMES and n.lower() > ours for n in names_present):
        return LATE_HOOKS_NAME
    return HOOKS_NAME


def hooks_order(files: Mapping[str, Mapping[str, Any]], hook_paths: Sequence[str]) -> dict[str, list[str]]:
    """Stage → the hooks.d file names that run in it, in the engine's order (name, lower-cased).

    ``files`` maps a file name to its decoded JSON (the effective one: a later directory's file of
    the same name already replaced an earlier one). Only files naming our hook or an NVIDIA hook
    (``hook_paths`` plus any path containing ``nvidia``) are listed.
    """
    order: dict[str, list[str]] = {}
    for name in sorted(files, key=str.lower):
        doc = files[name]
        hook = doc.get("hook") if isinstance(doc, Mapping) else None
        path = hook.get("path", "") if isinstance(hook, Mapping) else ""
        if not isinstance(path, str) or not (path in hook_paths or "nvidia" in path):
            continue
        for stage in doc.get("stages") or ():
            order.setdefault(str(stage), []).append(name)
    return order


# --- OCI base runtime spec (containerd's base_runtime_spec) ------------------------------------------

# The stages our hook and NVIDIA's device hook run in, in the order runc runs them at create
# (each stage's entries in array order). Later stages (createContainer: nvidia-ctk's ldcache and
# symlink hooks) create no device nodes, so their order against ours does not matter.
SPEC_HOOK_STAGES = ("prestart", "createRuntime")


@record(kw_only=False)
class StageHooks:
    """Indexes, in one stage's hook array, of our hook's entries and of NVIDIA's."""

    ours: tuple[int, ...]
    nvidia: tuple[int, ...]


def _is_nvidia_hook(entry: Mapping[str, Any]) -> bool:
    """NVIDIA's hooks as its toolkit writes them: the legacy runtime hook binary, the toolkit's
    symlink to it, or an ``nvidia-ctk hook <name>`` (CDI-generated) entry."""
    path = entry.get("path")
    base = path.rsplit("/", 1)[-1] if isinstance(path, str) else ""
    if base in ("nvidia-container-runtime-hook", "nvidia-container-toolkit"):
        return True
    args = entry.get("args")
    return base == "nvidia-ctk" and isinstance(args, list) and "hook" in args[1:]


def base_spec_hooks(spec: Mapping[str, Any], hook_paths: Sequence[str]) -> dict[str, StageHooks]:
    """Stage → where our hook (``hook_paths``) and NVIDIA's sit in a base spec's ``hooks``.

    Only stages holding either are listed; malformed entries are skipped but keep their index.
    """
    hooks = spec.get("hooks") if isinstance(spec, Mapping) else None
    out: dict[str, StageHooks] = {}
    if not isinstance(hooks, Mapping):
        return out
    for stage in SPEC_HOOK_STAGES:
        entries = hooks.get(stage)
        if not isinstance(entries, list):
            continue
        ours, nvidia = [], []
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                continue
            if entry.get("path") in hook_paths:
                ours.append(i)
            elif _is_nvidia_hook(entry):
                nvidia.append(i)
        if ours or nvidia:
            out[stage] = StageHooks(tuple(ours), tuple(nvidia))
    return out


def runs_after_nvidia(found: Mapping[str, StageHooks]) -> bool | None:
    """Whether every entry of ours runs after every NVIDIA entry (stage order, then array order);
    ``None`` when the spec lacks one of the two, so there is no order to judge."""
    ours = [(SPEC_HOOK_STAGES.index(s), i) for s, h in found.items() for i in h.ours]
    theirs = [(SPEC_HOOK_STAGES.index(s), i) for s, h in found.items() for i in h.nvidia]
    if not ours or not theirs:
        return None
    return min(ours) > max(theirs)
