"""containerd's config edited as text, line by line: set one ``BinaryName`` per runc handler, and undo it.

Rule: pure functions of file contents. The text is never re-emitted: comments, order and every key
we do not own stay byte for byte, and a result is accepted only when ``tomllib`` reads it as the
original with exactly the intended ``BinaryName`` values changed (Python has no TOML writer, and
one is not needed for setting one string per runtime handler). Each edit is recorded
(``ContainerdEdit``) so that undoing it removes exactly that, whatever else changed since.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hook.core.errors import InputError
from hook.core.record import record
from hook.tools.engines import DEFAULT_RUNTIME_TYPE, RUNC_TYPES, Handler, handlers, parse, runtimes_path

__all__ = ["ContainerdEdit", "register_containerd", "unregister_containerd"]


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
    prefix = runtimes_path(version)
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
        for key in runtimes_path(version):
            node = node.setdefault(key, {})
        handler = node.setdefault(e.handler, {})
        if (*runtimes_path(version), e.handler) in e.added_tables:
            handler["runtime_type"] = DEFAULT_RUNTIME_TYPE
        handler.setdefault("options", {})["BinaryName"] = binaries[e.handler]
    got = parse(new, f"{source} (as edited)")
    if got != expected:
        raise InputError(source, "", "the edited config would not read as intended; nothing changed")


def unregister_containerd(
    text: str, source: str, edits: Sequence[ContainerdEdit], version: int | None = None
) -> str:
    """Undo ``edits`` in the current text, whatever else changed since: a BinaryName that still
    names our wrapper gets its previous line back (or goes), and a table we added goes when empty.
    Last edit first: a handler registered twice (the wrapper, then a shim) goes back in two steps."""
    version, _ = handlers(text, source, version)
    prefix = runtimes_path(version)
    lines = text.splitlines(keepends=True)
    for e in reversed(edits):
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
