"""cgroup v1 device controller writer: save ``devices.list``, write, re-read, verify, restore.

Rule: one rule per ``write(2)`` (the kernel parses exactly one rule per write), the exception
list is saved before the first write, and after the last write ``devices.list`` is re-read and
every rule's effect is checked there; a rule the kernel silently ignored (a deny inside an
allowed wildcard, the hole v1 cannot punch) is an ``ApplyError``, so the caller rolls back.

Kernel facts this relies on (security/device_cgroup.c): with default-allow behaviour
``devices.list`` shows only ``a *:* rwm`` and hides the deny exceptions, so deny rules there
cannot be read back; ``allow``/``deny`` of a non-wildcard line edits only the exception with
exactly the same type/major/minor; ``a`` written to ``devices.allow`` (``devices.deny``) clears
every exception and switches to default allow (deny).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from hook.errors import ApplyError
from hook.record import record
from hook.rules import Access, DeviceType, Rule

__all__ = ["AppliedV1", "CgroupV1", "ListEntry", "check_effect", "parse_list"]

ALLOW_ALL_LINE = "a *:* rwm"


@record(kw_only=False)
class ListEntry:
    """One ``devices.list`` line; ``None`` is ``*``."""

    type: DeviceType
    major: int | None
    minor: int | None
    access: Access

    def covers(self, rule: Rule) -> bool:
        """Every device the rule names is matched by this entry (type, major, minor)."""
        return (
            self.type in (DeviceType.ALL, rule.type)
            and self.major in (None, rule.major)
            and self.minor in (None, rule.minor)
        )

    def overlaps(self, rule: Rule) -> bool:
        """Some device the rule names is matched by this entry."""
        return (DeviceType.ALL in (self.type, rule.type) or self.type == rule.type) and all(
            a is None or b is None or a == b for a, b in ((self.major, rule.major), (self.minor, rule.minor))
        )


def _num(text: str) -> int | None:
    return None if text == "*" else int(text)


def parse_list(text: str, source: str) -> tuple[ListEntry, ...]:
    """Parse ``devices.list`` text (``c 195:* rwm`` per line)."""
    entries = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            kind, numbers, acc = line.split()
            major, minor = numbers.split(":")
            entries.append(ListEntry(DeviceType(kind), _num(major), _num(minor), Access.parse(acc)))
        except ValueError as exc:
            raise ApplyError(source, f"line {no}", f"cannot parse {line!r}: {exc}") from exc
    return tuple(entries)


def _pending(rules: Sequence[Rule], i: int) -> Access:
    """Access bits of rule ``i`` that no later rule covering it re-decides (later rules win)."""
    acc = rules[i].access
    probe = rules[i]
    for later in rules[i + 1 :]:
        entry = ListEntry(later.type, later.major, later.minor, later.access)
        if entry.covers(probe):
            acc &= ~later.access
    return acc


def check_effect(entries: Sequence[ListEntry], rules: Sequence[Rule]) -> list[str]:
    """Rules whose effect is not visible in ``entries`` (a default-deny list), as v1 lines.

    An allow needs one entry covering all its devices and bits; a deny needs no entry that
    overlaps its devices to grant any denied bit. With a default-allow list denies are hidden
    and only a wildcard deny (which flips the behaviour) can be checked.
    """
    allow_all = [e for e in entries if e == ListEntry(DeviceType.ALL, None, None, Access.RWM)]
    failed = []
    for i, rule in enumerate(rules):
        acc = _pending(rules, i)
        if not acc:
            continue
        if allow_all:
            ok = rule.allow or rule.v1_line() != "a"
        elif rule.allow:
            ok = any(e.covers(rule) and (e.access & acc) == acc for e in entries)
        else:
            ok = not any(e.overlaps(rule) and (e.access & acc) for e in entries)
        if not ok:
            failed.append(("allow " if rule.allow else "deny ") + rule.v1_line())
    return failed


@record
class AppliedV1:
    """What ``CgroupV1.apply`` did: the list before and after, and the lines written."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    written: tuple[str, ...]


class CgroupV1:
    """One container's v1 device cgroup directory (``/sys/fs/cgroup/devices/<path>``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved: tuple[str, ...] | None = None
        self._rules: tuple[Rule, ...] = ()

    def read_list(self) -> tuple[str, ...]:
        try:
            text = (self.path / "devices.list").read_text()
        except OSError as exc:
            raise ApplyError(str(self.path / "devices.list"), "", exc.strerror or str(exc)) from exc
        return tuple(line for line in text.splitlines() if line.strip())

    def _write(self, name: str, line: str) -> None:
        """Exactly one rule per write; O_APPEND so a plain-file fake records the sequence."""
        target = self.path / name
        try:
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                os.write(fd, line.encode() + b"\n")
            finally:
                os.close(fd)
        except OSError as exc:
            raise ApplyError(str(target), f"write {line}", exc.strerror or str(exc)) from exc

    def apply(self, rules: Iterable[Rule]) -> AppliedV1:
        """Write ``rules`` in order after saving the list; raise ApplyError if any has no effect."""
        rules = tuple(rules)
        before = self.read_list()
        self._saved, self._rules = before, rules
        written = []
        for rule in rules:
            line = rule.v1_line()
            self._write("devices.allow" if rule.allow else "devices.deny", line)
            written.append(("allow " if rule.allow else "deny ") + line)
        after = self.read_list()
        failed = check_effect(parse_list("\n".join(after), str(self.path / "devices.list")), rules)
        if failed:
            raise ApplyError(
                str(self.path / "devices.list"),
                "",
                "rules without effect after writing: " + ", ".join(failed),
            )
        return AppliedV1(before=before, after=after, written=tuple(written))

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
                for rule in reversed(rules):
                    if not rule.allow:
                        self._write("devices.allow", rule.v1_line())
        else:
            self._write("devices.deny", "a")
            for line in saved:
                self._write("devices.allow", line)
        self._saved = None
