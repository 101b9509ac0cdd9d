"""Which files make containerd's config, and what containerd makes of them: imports and merge rules.

Rule: pure functions over file texts, with the reading injected (``hook.tools.install`` reads inside
``--root``, ``hook.tools.doctor`` reads the host). containerd's own rules (containerd
``services/server/config/config.go`` in 1.6/1.7, ``cmd/containerd/server/config/config.go`` in
2.x: ``LoadConfig``, ``resolveImports``, ``mergeConfig``):

- files load breadth first from the root config; each file's ``imports`` are appended to the
  queue after it is merged; a path already loaded (compared as a string) is skipped;
- a non-glob import is cleaned and, when relative, joined to the importing file's directory; a
  glob (any ``*``) is expanded with Go's ``filepath.Glob`` (sorted) — in 1.x as written (so a
  relative glob is relative to containerd's working directory), in 2.x after the same join; a
  missing import stops containerd;
- 1.x merges each ``plugins.<id>`` table by replacing it whole with the later file's; 2.x merges
  the tables key by key (mergo with override). A drop-in's version may not exceed the root's.

Where the versions differ (a relative glob; a handler whose binary one rule takes from a file the
other drops) this module refuses with one line rather than guess which containerd runs; an edit
is planned so that both rules read every runc-type handler as registered.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hook.core.errors import InputError
from hook.core.record import record
from hook.tools import ctdedit, engines

__all__ = [
    "ConfigFile",
    "RULES",
    "load",
    "effective",
    "effective_handlers",
    "plan_register",
]

RULES = ("replace", "merge")  # containerd 1.x, containerd 2.x
_GLOB_SPECIAL = re.compile(r"[?\[\\]")


@record(kw_only=False)
class ConfigFile:
    """One file containerd reads, in load order (``exists`` False only for an absent root config)."""

    path: str
    text: str
    exists: bool = True


def go_clean(path: str) -> str:
    """Go's ``filepath.Clean`` (``posixpath.normpath`` keeps a leading ``//``; Go does not)."""
    out = posixpath.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


def _glob(pattern: str, listdir: Callable[[str], list[str]], source: str) -> list[str]:
    directory, name = posixpath.split(pattern)
    if "*" in directory or _GLOB_SPECIAL.search(pattern):
        raise InputError(source, "imports", f"{pattern!r}: only '*' in the last component is followed here")
    regex = re.compile("[^/]*".join(re.escape(part) for part in name.split("*")), re.S)
    return [posixpath.join(directory, n) for n in sorted(listdir(directory)) if regex.fullmatch(n)]


def resolve_imports(parent: str, imports: Sequence[Any], listdir: Callable[[str], list[str]]) -> list[str]:
    """The files ``parent``'s ``imports`` name, in order (containerd's ``resolveImports``)."""
    out: list[str] = []
    for item in imports:
        if not isinstance(item, str):
            raise InputError(parent, "imports", f"{item!r} is not a string")
        if "*" in item:
            if not item.startswith("/"):
                why = "a relative glob names other files to containerd 1.x and 2.x"
                raise InputError(parent, "imports", f"{item!r}: {why}")
            out += _glob(go_clean(item), listdir, parent)
            continue
        path = go_clean(item)
        if not path.startswith("/"):
            path = go_clean(posixpath.join(posixpath.dirname(parent), path))
        out.append(path)
    return out


def load(
    root_config: str, read: Callable[[str], str | None], listdir: Callable[[str], list[str]]
) -> tuple[tuple[ConfigFile, ...], int]:
    """Every file containerd reads for ``root_config``, in load order, and the root's version.

    ``read`` gives a file's text or None where it is absent; ``listdir`` a directory's names
    (``[]`` where it is absent)."""
    text = read(root_config)
    files = [ConfigFile(root_config, text or "", text is not None)]
    if text is None:
        return tuple(files), 2
    version, _ = engines.handlers(text, root_config)
    loaded = {root_config}
    pending = resolve_imports(root_config, _imports(text, root_config), listdir)
    while pending:
        path, pending = pending[0], pending[1:]
        if path in loaded:
            continue
        body = read(path)
        if body is None:
            raise InputError(path, "", "imported but absent: containerd would not start")
        doc = engines.parse(body, path)
        own = doc.get("version", 0)
        if not isinstance(own, int) or own > version:
            raise InputError(path, "version", f"{own!r} is above the root config's {version}")
        files.append(ConfigFile(path, body))
        loaded.add(path)
        pending += resolve_imports(path, _imports(body, path), listdir)
    return tuple(files), version


def _imports(text: str, source: str) -> list[Any]:
    value = engines.parse(text, source).get("imports", [])
    if not isinstance(value, list):
        raise InputError(source, "imports", "not a list")
    return value


def _deep_merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def effective(files: Sequence[ConfigFile], version: int, rule: str) -> dict[str, Any]:
    """The CRI plugin's table as containerd builds it from ``files`` under ``rule``."""
    plugin = engines.cri_plugin(version)
    out: dict[str, Any] = {}
    for f in files:
        table = engines.parse(f.text, f.path).get("plugins", {})
        table = table.get(plugin) if isinstance(table, Mapping) else None
        if not isinstance(table, Mapping):
            continue
        if rule == "replace":
            out = copy.deepcopy(dict(table))
        else:
            _deep_merge(out, table)
    return out


def effective_handlers(files: Sequence[ConfigFile], version: int, rule: str) -> list[engines.Handler]:
    """The runtime handlers containerd runs with, under ``rule``."""
    doc = {"plugins": {engines.cri_plugin(version): effective(files, version, rule)}}
    return engines.handlers_in(doc, version)


def _has_cri(f: ConfigFile, version: int) -> bool:
    plugins = engines.parse(f.text, f.path).get("plugins", {})
    return isinstance(plugins, Mapping) and engines.cri_plugin(version) in plugins


def binaries(files: Sequence[ConfigFile], version: int) -> dict[str, engines.Handler]:
    """Handler name → the handler as both rules read it; a handler whose type or binary the two
    rules read differently is refused (which containerd runs is not known here)."""
    views = {rule: {h.name: h for h in effective_handlers(files, version, rule)} for rule in RULES}
    replace, merge = views["replace"], views["merge"]
    for name, h in replace.items():
        m = merge[name]
        if (h.runtime_type, h.binary) != (m.runtime_type, m.binary):
            raise InputError(
                files[0].path,
                f"runtimes.{name}",
                "containerd 1.x and 2.x read this handler differently across imports; "
                "set its runtime_type and BinaryName in one file",
            )
    return merge


def plan_register(
    files: Sequence[ConfigFile], version: int, binary_for: Mapping[str, str], default_binary: str
) -> list[tuple[ConfigFile, str, list[ctdedit.ContainerdEdit]]]:
    """Each file's new text and edits, such that every runc-type handler runs the wrapper under
    either merge rule: a runc-type handler is edited in every file that defines it, and the
    file whose CRI table 1.x keeps (the last that has one) gets containerd's implicit ``runc``
    handler where it defines none."""
    merged = binaries(files, version)
    runc = {n for n, h in merged.items() if h.runtime_type in engines.RUNC_TYPES}
    if merged and not runc:
        raise InputError(files[0].path, "runtimes", "no runc-type runtime handler to register with")
    winner = next((f for f in reversed(files) if _has_cri(f, version)), files[0])
    out = []
    for f in files:
        new, edits = ctdedit.register_containerd(
            f.text,
            f.path,
            binary_for,
            default_binary,
            version=version if f is not files[0] else None,
            names=sorted(runc),
            add_runc=f is winner,
        )
        out.append((f, new, edits))
    after = [ConfigFile(f.path, new, f.exists or bool(edits)) for f, new, edits in out]
    for rule in RULES:
        found = [h for h in effective_handlers(after, version, rule) if h.runtime_type in engines.RUNC_TYPES]
        wrong = [h.name for h in found if h.binary != binary_for.get(h.name, default_binary)]
        if wrong or not found:
            why = f"handler(s) {', '.join(wrong)} would not run the wrapper" if wrong else "no runc handler"
            raise InputError(winner.path, "runtimes", f"{why} (containerd {rule} rule): nothing changed")
    return out
