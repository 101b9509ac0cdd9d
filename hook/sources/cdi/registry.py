"""The CDI registry: every spec in the spec dirs, indexed by qualified device name.

Rule: dirs are given lowest priority first (default ``/etc/cdi`` then ``/var/run/cdi``); each
is scanned non-recursively, in lexical order, for ``*.json`` and ``*.yaml`` only. A broken file
is skipped and reported under its path, never blocking the others. Per device, a higher
priority dir wins; the same device twice at the same priority is a conflict reported against
both files, and (as in the reference cache) that name then resolves nowhere, not even from a
higher-priority dir. ``resolve`` is all or nothing: every unresolvable name is listed in
one InputError before any edits are merged (spec edits once per spec, then device edits).
Devices are built lazily, only for the specs a caller looks at.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from hook.core.errors import InputError
from hook.sources.cdi import cache, schema
from hook.sources.cdi.edits import ContainerEdits, merge
from hook.sources.cdi.spec import Device, Spec, device_from_raw, spec_from_raw, spec_problems

__all__ = ["DEFAULT_SPEC_DIRS", "Registry"]

DEFAULT_SPEC_DIRS: Final = (Path("/etc/cdi"), Path("/var/run/cdi"))
_SUFFIXES: Final = (".json", ".yaml")


def spec_files(dirs: Sequence[Path]) -> list[tuple[str, int]]:
    """(path, priority) of every candidate spec file, in load order."""
    found: list[tuple[str, int]] = []
    for priority, directory in enumerate(dirs):
        try:
            with os.scandir(directory) as it:
                names = sorted(e.name for e in it if e.name.endswith(_SUFFIXES) and not e.is_dir())
        except OSError:
            continue  # a missing or unreadable dir holds no specs
        found.extend((os.path.join(directory, n), priority) for n in names)
    return found


def _parse_file(path: str) -> tuple[cache.Entry, bytes | None]:
    """Read and validate one file; the entry's key comes from the same open file."""
    try:
        with open(path, "rb") as fh:
            key = cache.file_key(os.fstat(fh.fileno()))
            data = fh.read()
    except OSError as exc:
        return cache.Entry(key=(0, 0, 0, 0), error=f"{path}: cannot read: {exc.strerror}"), None
    raw, problems = spec_problems(data, path)
    if raw is None:
        return cache.Entry(key=key, error="\n".join(str(p) for p in problems)), None
    names = tuple(d["name"] for d in raw["devices"])
    body = json.dumps(raw, separators=(",", ":")).encode()
    return cache.Entry(key=key, kind=raw["kind"], names=names, body=raw), body


def _names(raw: dict[str, Any]) -> tuple[str, ...] | None:
    try:
        return tuple(d["name"] for d in raw["devices"])
    except (KeyError, TypeError):
        return None


class _Devices(Mapping[str, Device]):
    """Qualified name → Device, building a spec's devices only when one of them is looked up."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, name: str) -> Device:
        _priority, path = self._registry._index[name]
        return self._registry.spec(path).device(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._registry._index))

    def __len__(self) -> int:
        return len(self._registry._index)

    def __contains__(self, name: object) -> bool:
        return name in self._registry._index


class _LoadedSpec:
    """A valid spec's raw body; Devices are built one by one, when first asked for."""

    __slots__ = ("_built", "_positions", "priority", "raw", "source", "spec_edits")

    def __init__(self, raw: dict[str, Any], source: str, priority: int) -> None:
        self.raw, self.source, self.priority = raw, source, priority
        self.spec_edits = schema.edits_from_raw(raw.get("containerEdits"), source, "containerEdits")
        prefix = raw["kind"] + "="
        self._positions = {prefix + d["name"]: i for i, d in enumerate(raw["devices"])}
        self._built: dict[str, Device] = {}

    def device(self, qualified: str) -> Device:
        found = self._built.get(qualified)
        if found is None:
            found = device_from_raw(self.raw, self._positions[qualified], self.source, self.priority,
                                    self.spec_edits)
            self._built[qualified] = found
        return found

    def full(self) -> Spec:
        return spec_from_raw(self.raw, self.source, self.priority)


class Registry:
    """Specs found in ``dirs``; use ``Registry.load``."""

    def __init__(self, dirs: Sequence[Path], entries: dict[str, tuple[int, cache.Entry]],
                 cached: cache.Cache | None) -> None:
        self.dirs = tuple(dirs)
        self._entries = entries
        self._cached = cached
        self._specs: dict[str, _LoadedSpec] = {}
        self._errors: dict[str, list[str]] = {}
        self._index: dict[str, tuple[int, str]] = {}
        self._build_index()
        self.devices: Mapping[str, Device] = _Devices(self)

    @classmethod
    def load(cls, dirs: Sequence[Path] = DEFAULT_SPEC_DIRS, cache_dir: Path | None = None) -> Registry:
        """Scan ``dirs``; with ``cache_dir``, reuse and refresh ``cache_dir/cdi-cache.json``."""
        cache_path = None if cache_dir is None else cache_dir / cache.CACHE_NAME
        cached = None if cache_path is None else cache.read(cache_path)
        entries: dict[str, tuple[int, cache.Entry]] = {}
        fresh: dict[str, bytes] = {}
        for path, priority in spec_files(dirs):
            entry = None
            if cached is not None:
                try:
                    entry = cached.lookup(path, cache.file_key(os.stat(path)))
                except OSError:
                    entry = None
            if entry is None:
                entry, body = _parse_file(path)
                if body is not None:
                    fresh[path] = body
            entries[path] = (priority, entry)
        registry = cls(dirs, entries, cached)
        if cache_path is not None and (cached is None or fresh or cached.paths() != set(entries)):
            registry._write_cache(cache_path, fresh)
        return registry

    def _write_cache(self, cache_path: Path, fresh: dict[str, bytes]) -> None:
        bodies: dict[str, bytes] = {}
        keep: dict[str, cache.Entry] = {}
        for path, (_priority, entry) in self._entries.items():
            if entry.key == (0, 0, 0, 0):
                continue  # unreadable: nothing worth remembering
            if entry.error is None:
                body = fresh.get(path) or self._cached_body_bytes(path)
                if body is None:
                    continue
                bodies[path] = body
            keep[path] = entry
        cache.write(cache_path, keep, bodies)

    def _cached_body_bytes(self, path: str) -> bytes | None:
        raw = None if self._cached is None else self._cached.body(path)
        return None if raw is None else json.dumps(raw, separators=(",", ":")).encode()

    def _build_index(self) -> None:
        conflicts: dict[str, int] = {}
        for path, (priority, entry) in self._entries.items():
            if entry.error is not None:
                self._errors.setdefault(path, []).extend(entry.error.split("\n"))
                continue
            prefix = entry.kind + "="
            qualified_names = [prefix + name for name in entry.names]
            for qualified in sorted(self._index.keys() & qualified_names):  # usually none: stay in C
                old = self._index[qualified]
                if old[0] == priority:
                    line = f"conflicting device {qualified!r} (specs {old[1]!r}, {path!r})"
                    self._errors.setdefault(old[1], []).append(line)
                    self._errors.setdefault(path, []).append(line)
                    conflicts[qualified] = priority
            self._index.update(dict.fromkeys(qualified_names, (priority, path)))
        for qualified in conflicts:  # the reference drops a conflicted name whatever later dirs say
            self._index.pop(qualified, None)

    @property
    def errors(self) -> Mapping[str, tuple[str, ...]]:
        """Spec path → one-line problems (broken files and conflicts)."""
        return {path: tuple(lines) for path, lines in sorted(self._errors.items())}

    def spec_paths(self) -> tuple[str, ...]:
        """Every file that loaded as a valid spec, in load order."""
        return tuple(p for p, (_prio, e) in self._entries.items() if e.error is None)

    def spec(self, path: str) -> _LoadedSpec:
        """The parsed spec of a valid file (from the fresh parse, the cache, or a re-read)."""
        loaded = self._specs.get(path)
        if loaded is None:
            priority, entry = self._entries[path]
            loaded = _LoadedSpec(self._raw_body(path, entry), path, priority)
            self._specs[path] = loaded
        return loaded

    def _raw_body(self, path: str, entry: cache.Entry) -> dict[str, Any]:
        if entry.body is not None:
            return entry.body
        raw = None if self._cached is None else self._cached.body(path)  # CRC-checked
        if raw is not None and raw.get("kind") == entry.kind and _names(raw) == entry.names:
            return raw
        fresh, _body = _parse_file(path)  # cache body unusable: parse the file itself
        if fresh.body is None or fresh.kind != entry.kind or fresh.names != entry.names:
            raise InputError(path, "", "spec changed while loading; run again")
        return fresh.body

    def resolve_devices(self, names: Sequence[str]) -> tuple[Device, ...]:
        """The devices for ``names`` (first occurrence kept); one InputError lists every unknown name."""
        wanted = list(dict.fromkeys(names))
        unresolved = [n for n in wanted if n not in self._index]
        if unresolved:
            dirs = ":".join(str(d) for d in self.dirs)
            raise InputError(f"CDI spec dirs {dirs}", "devices",
                             "unresolvable CDI devices " + ", ".join(unresolved) + self._broken())
        return tuple(self.devices[n] for n in wanted)

    def _broken(self) -> str:
        """The spec files that did not load, each with its first problem: the device asked for may
        be in one of them (the fact an operator needs to fix it), '' when every file loaded."""
        broken = [(p, lines[0][:160]) for p, lines in sorted(self._errors.items()) if lines]
        if not broken:
            return ""
        named = "; ".join(why if why.startswith(p) else f"{p}: {why}" for p, why in broken[:3])
        more = f" (and {len(broken) - 3} more)" if len(broken) > 3 else ""
        return f"; spec file(s) that did not load: {named}{more}"

    def resolve(self, names: Sequence[str]) -> ContainerEdits:
        """Merged edits for ``names``: each spec's own edits once (first use), then device edits."""
        parts: list[ContainerEdits] = []
        seen_specs: set[str] = set()
        for device in self.resolve_devices(names):
            if device.source not in seen_specs:
                seen_specs.add(device.source)
                parts.append(device.spec_edits)
            parts.append(device.edits)
        return merge(*parts)
