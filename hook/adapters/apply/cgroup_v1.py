"""cgroup v1 device controller writer: save ``devices.list``, write, re-read, verify, restore.

Rule: one rule per ``write(2)`` (the kernel parses exactly one rule per write), the exception
list is saved before the first write, and after the last write ``devices.list`` is re-read and
every rule's effect is checked there; a rule the kernel silently ignored (a deny inside an
allowed wildcard, the hole v1 cannot punch) is an ``ApplyError``, so the caller rolls back.
Rules are read by their plain facts (type letter, numbers, access bits, ``v1_line``), so the core's
``Rule`` and the wire's ``PlainRule`` (``hook.core.plainplan``) are written alike, and a served
start that applies a plan loads no ``enum``; ``devices.list`` is parsed into plain values too.

Kernel facts this relies on (security/device_cgroup.c): with default-allow behaviour
``devices.list`` shows only ``a *:* rwm`` and hides the deny exceptions, so deny rules there
cannot be read back; ``allow``/``deny`` of a non-wildcard line edits only the exception with
exactly the same type/major/minor; ``a`` written to ``devices.allow`` (``devices.deny``) clears
every exception and switches to default allow (deny).
"""

from __future__ import annotations

import os

from hook.core.errors import ApplyError
from hook.core.plainplan import access_bits
from hook.core.record import record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from os import PathLike

    from hook.core.plainplan import PlainRule
    from hook.core.rules import Access, DeviceType, Rule

    AnyRule = Rule | PlainRule

__all__ = ["AppliedV1", "CgroupV1", "ListEntry", "check_effect", "parse_list"]

ALLOW_ALL_LINE = "a *:* rwm"


@record(kw_only=False)
class ListEntry:
    """One ``devices.list`` line; ``None`` is ``*``. ``parse_list`` gives the type as its letter and
    the access as its bits; ``DeviceType``/``Access`` values are read the same way."""

    type: DeviceType | str
    major: int | None
    minor: int | None
    access: Access | int

    def covers(self, rule: AnyRule) -> bool:
        """Every device the rule names is matched by this entry (type, major, minor)."""
        return (
            str(self.type) in (_ALL, str(rule.type))
            and self.major in (None, rule.major)
            and self.minor in (None, rule.minor)
        )

    def overlaps(self, rule: AnyRule) -> bool:
        """Some device the rule names is matched by this entry."""
        return (_ALL in (str(self.type), str(rule.type)) or str(self.type) == str(rule.type)) and all(
            a is None or b is None or a == b for a, b in ((self.major, rule.major), (self.minor, rule.minor))
        )


def _bits(access: Access | int) -> int:
    return access if isinstance(access, int) else access.value


def _num(text: str) -> int | None:
    return None if text == "*" else int(text)


def parse_list(text: str, source: str) -> tuple[ListEntry, ...]:
    """Parse ``devices.list`` text (``c 195:* rw`` per line)."""
    entries = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            kind, numbers, acc = line.split()
            major, minor = numbers.split(":")
            if kind not in ("a", "c", "b"):
                raise ValueError(f"{kind!r} is not a valid DeviceType")
            entries.append(ListEntry(kind, _num(major), _num(minor), access_bits(acc)))
        except ValueError as exc:
            raise ApplyError(source, f"line {no}", f"cannot parse {line!r}: {exc}") from exc
    return tuple(entries)


_ALL = "a"
_Key = tuple[str, int | None, int | None]


def _wider(type: str, major: int | None, minor: int | None) -> list[_Key]:
    """Every (type, major, minor) key that names all the devices this one names (itself included),
    each once."""
    types = (_ALL,) if type == _ALL else (_ALL, type)
    majors = (None,) if major is None else (None, major)
    minors = (None,) if minor is None else (None, minor)
    return [(t, a, b) for t in types for a in majors for b in minors]


class _OverlapIndex:
    """OR of the entries' access bits by each projection a rule query takes, built per projection
    on first use (rules that name type, major and minor, the usual ones, need only one).

    A key is (type, major, minor) with the fields the querying rule leaves as a wildcard set to
    ``...``: any entry value overlaps them.
    """

    def __init__(self, entries: Sequence[ListEntry]) -> None:
        self.entries = entries
        self.by_mask: dict[int, dict[tuple[object, ...], int]] = {}

    def table(self, mask: int) -> dict[tuple[object, ...], int]:
        table = self.by_mask.get(mask)
        if table is None:
            table = {}
            for e in self.entries:
                t, a, b = str(e.type), e.major, e.minor
                key = (t if mask & 1 else ..., a if mask & 2 else ..., b if mask & 4 else ...)
                table[key] = table.get(key, 0) | _bits(e.access)
            self.by_mask[mask] = table
        return table

    def bits(self, rule: AnyRule) -> int:
        """OR of the access bits of every entry that overlaps some device the rule names."""
        kind = str(rule.type)
        named = (kind != _ALL, rule.major is not None, rule.minor is not None)
        table = self.table(named[0] | named[1] << 1 | named[2] << 2)
        types = (kind, _ALL) if named[0] else (...,)
        majors = (rule.major, None) if named[1] else (...,)
        minors = (rule.minor, None) if named[2] else (...,)
        bits = 0
        for t in types:
            for a in majors:
                for b in minors:
                    bits |= table.get((t, a, b), 0)
        return bits


def check_effect(entries: Sequence[ListEntry], rules: Sequence[AnyRule]) -> list[str]:
    """Rules whose effect is not visible in ``entries`` (a default-deny list), as v1 lines.

    An allow needs one entry covering all its devices and bits; a deny needs no entry that
    overlaps its devices to grant any denied bit. With a default-allow list denies are hidden
    and only a wildcard deny (which flips the behaviour) can be checked. Only the bits of a
    rule that no later rule covering it re-decides are checked (later rules win).

    Linear in rules and entries: the later rules' bits are gathered newest first by exact key,
    and a rule looks up only the at most eight keys that can cover or overlap it.
    """
    allow_all = any(
        str(e.type) == _ALL and e.major is None and e.minor is None and _bits(e.access) == 7 for e in entries
    )
    if allow_all:
        return _check_allow_all(rules)
    exact: dict[_Key, list[int]] = {}
    for e in entries:
        exact.setdefault((str(e.type), e.major, e.minor), []).append(_bits(e.access))
    overlap = _OverlapIndex(entries)
    later: dict[_Key, int] = {}  # bits named by rules after the current one, by exact key
    failed = []
    for rule in reversed(rules):
        key = (str(rule.type), rule.major, rule.minor)
        wider = _wider(*key)
        redecided = 0
        for k in wider:
            redecided |= later.get(k, 0)
        acc = rule.bits & ~redecided
        later[key] = later.get(key, 0) | rule.bits
        if not acc:
            continue
        if rule.allow:
            ok = any((bits & acc) == acc for k in wider for bits in exact.get(k, ()))
        else:
            ok = not (overlap.bits(rule) & acc)
        if not ok:
            failed.append(("allow " if rule.allow else "deny ") + rule.v1_line())
    failed.reverse()
    return failed


def _check_allow_all(rules: Sequence[AnyRule]) -> list[str]:
    """``check_effect`` on a list showing ``a *:* rwm``: the denies are hidden, so only a deny of
    ``a`` (which flips the behaviour, and would show) can be seen to fail. Only ``a`` rules can
    re-decide its bits (no other key is as wide), so the rest are not looked at."""
    failed = []
    later = 0  # bits named by the ``a *:*`` rules after the current one
    for rule in reversed(rules):
        if str(rule.type) != _ALL or rule.major is not None or rule.minor is not None:
            continue
        acc = rule.bits & ~later
        later |= rule.bits
        if acc and not rule.allow and rule.v1_line() == "a":
            failed.append("deny " + rule.v1_line())
    failed.reverse()
    return failed


@record
class AppliedV1:
    """What ``CgroupV1.apply`` did: the list before and after, and the lines written."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    written: tuple[str, ...]


class CgroupV1:
    """One container's v1 device cgroup directory (``/sys/fs/cgroup/devices/<path>``)."""

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = os.fspath(path)  # str: pathlib would cost every applied start re and more
        self._saved: tuple[str, ...] | None = None
        self._rules: tuple[AnyRule, ...] = ()

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def read_list(self) -> tuple[str, ...]:
        from hook.adapters.apply.locate import read_text

        try:
            text = read_text(self._file("devices.list"))
        except OSError as exc:
            raise ApplyError(self._file("devices.list"), "", exc.strerror or str(exc)) from exc
        return tuple(line for line in text.splitlines() if line.strip())

    def _write(self, name: str, line: str) -> None:
        """Exactly one rule per write; O_APPEND so a plain-file fake records the sequence."""
        self._write_all([(name, line)])

    def _write_all(self, lines: Iterable[tuple[str, str]]) -> None:
        """Each (file name, rule line) in order, one ``write(2)`` per rule, each file opened once:
        the kernel parses every write on its own, so a big plan costs a write per rule, not an
        open, a write and a close."""
        fds: dict[str, int] = {}
        name = line = ""
        try:
            for name, line in lines:
                fd = fds.get(name)
                if fd is None:
                    fd = fds[name] = os.open(self._file(name), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                os.write(fd, line.encode() + b"\n")
        except OSError as exc:
            raise ApplyError(self._file(name), f"write {line}", exc.strerror or str(exc)) from exc
        finally:
            for fd in fds.values():
                os.close(fd)

    def apply(self, rules: Iterable[AnyRule], normalized: bool = False) -> AppliedV1:
        """Write ``rules`` in order after saving the list; raise ApplyError if any has no effect.
        (``normalized`` is the v2 writer's: v1 writes the rules as they are, in any case.)"""
        rules = tuple(rules)
        before = self.read_list()
        self._saved, self._rules = before, rules
        lines = [("devices.allow" if rule.allow else "devices.deny", rule.v1_line()) for rule in rules]
        self._write_all(lines)
        written = tuple(("allow " if name == "devices.allow" else "deny ") + line for name, line in lines)
        after = self.read_list()
        failed = check_effect(parse_list("\n".join(after), self._file("devices.list")), rules)
        if failed:
            raise ApplyError(
                self._file("devices.list"),
                "",
                "rules without effect after writing: " + ", ".join(failed),
            )
        return AppliedV1(before=before, after=after, written=written)

    def rollback(self) -> None:
        """Put the exception list back as it was before ``apply``.

        Default deny: the list was fully visible, so deny everything and re-allow each saved
        line. Default allow (saved ``a *:* rwm``): the list hid any earlier denies, so undo only
        our own writes — ``a`` to ``devices.allow`` if we switched the behaviour, else each deny
        we added is allowed again, last first. No-op before ``apply``.
        """
        if self._saved is None:
            return
        saved, rules = self._saved, self._rules
        if saved == (ALLOW_ALL_LINE,):
            if any(r.v1_line() == "a" for r in rules):
                self._write("devices.allow", "a")
            else:
                self._write_all(("devices.allow", r.v1_line()) for r in reversed(rules) if not r.allow)
        else:
            self._write_all([("devices.deny", "a"), *(("devices.allow", line) for line in saved)])
        self._saved = None
