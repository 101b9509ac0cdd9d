"""cgroup v2 device filter: wrap each attached BPF_CGROUP_DEVICE program with our rules, swap, verify.

Rule: the new program is loaded before anything attached is touched, the original programs stay
open until rollback or close, and after the swap the attached ids are queried and compared; any
difference is an ``ApplyError`` after the original attachment is restored.

Choices (documented here because they are the contract):
- Several programs attached (BPF_F_ALLOW_MULTI runs them all; all must allow): each one is
  replaced by "our rules, then that program". A deny of ours then holds whatever the others say,
  and an allow of ours reaches every program; wrapping only one would let the others veto it.
- None attached: the kernel allows everything, so ours ends in an explicit allow and only our
  deny rules narrow; it is attached with BPF_F_ALLOW_MULTI so a later runtime program can join.
- Swap: BPF_F_REPLACE where the kernel has it (>= 5.6); otherwise attach ours, then detach the
  original, so for a moment both run (stricter), never neither. A program attached without
  ALLOW_MULTI is replaced by ALLOW_OVERRIDE re-attach, or detach + attach when exclusive.
- Idempotency: every program we build starts with a marker holding a digest of its rule blocks
  (``bpf.read_marker``). A program that already starts with our digest is left alone, so a
  second apply with the same rules changes nothing. Different rules wrap our earlier program,
  which is the OCI meaning of appending more rules.
"""

from __future__ import annotations

import errno
import os
import resource

from hook.adapters.apply import bpf, bpf_sys
from hook.adapters.apply.bpf_sys import BPF_F_ALLOW_MULTI, BPF_F_ALLOW_OVERRIDE
from hook.core.errors import ApplyError
from hook.core.record import record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from os import PathLike

    from hook.core.plainplan import PlainRule
    from hook.core.rules import Rule

__all__ = ["AppliedV2", "CgroupV2"]


@record(kw_only=False)
class AppliedV2:
    """What ``apply`` did: attached ids before and after, and whether anything changed."""

    path: str
    old_ids: tuple[int, ...]
    new_ids: tuple[int, ...]
    changed: bool


@record(kw_only=False)
class _Swap:
    """One replaced attachment; ``old_fd`` is None when nothing was attached before."""

    mode: int  # the attach flags of the original (0, ALLOW_OVERRIDE or ALLOW_MULTI)
    old_fd: int | None
    new_fd: int


def _is_einval(exc: ApplyError) -> bool:
    return isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EINVAL


def _swap_multi(cg: int, old: int, new: int) -> None:
    try:
        bpf_sys.attach(cg, new, BPF_F_ALLOW_MULTI, replace_fd=old)
    except ApplyError as exc:
        if not _is_einval(exc):  # EINVAL: no BPF_F_REPLACE on this kernel
            raise
        bpf_sys.attach(cg, new, BPF_F_ALLOW_MULTI)
        bpf_sys.detach(cg, old)


def _swap_override(cg: int, old: int, new: int) -> None:
    bpf_sys.attach(cg, new, BPF_F_ALLOW_OVERRIDE)  # replaces the single program atomically


def _swap_exclusive(cg: int, old: int, new: int) -> None:
    bpf_sys.detach(cg, old)  # an exclusive attachment refuses a second program
    bpf_sys.attach(cg, new, 0)


_SWAPS: dict[int, Callable[[int, int, int], None]] = {
    BPF_F_ALLOW_MULTI: _swap_multi,
    BPF_F_ALLOW_OVERRIDE: _swap_override,
    0: _swap_exclusive,
}


def _raise_memlock() -> None:
    """Kernels before 5.11 charge programs to RLIMIT_MEMLOCK; lift it, best effort."""
    try:  # noqa: SIM105 - contextlib would be one more import at start
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (OSError, ValueError):
        pass


class CgroupV2:
    """One cgroup v2 directory; ``apply`` then either ``rollback`` or ``close``."""

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = os.fspath(path)  # str: pathlib would cost every applied start re and more
        self._fd: int | None = None
        self._swaps: list[_Swap] = []
        self._open: list[int] = []  # every bpf fd we hold, closed by close()

    def _cgroup_fd(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                raise ApplyError(self.path, "", f"cannot open the cgroup: {exc.strerror}") from exc
        return self._fd

    def _hold(self, fd: int) -> int:
        self._open.append(fd)
        return fd

    def _load(self, prog: bytes) -> int:
        return self._hold(bpf_sys.load_device_program(prog))

    def _plan(
        self, rules: Sequence[Rule | PlainRule], ids: tuple[int, ...], normalized: bool
    ) -> list[tuple[int | None, int]]:
        """(original fd or None, new fd) for every program to replace; everything loaded, nothing attached."""
        code = bpf.rule_code(rules, normalized)  # the rule blocks, built once for every program
        if not ids:
            return [(None, self._load(bpf.build_program(rules, None, True, normalized, code)))]
        pairs: list[tuple[int | None, int]] = []
        for prog_id in ids:
            old = self._hold(bpf_sys.get_fd_by_id(prog_id))
            original = bpf_sys.dump_xlated(old)
            if bpf.read_marker(original) == code.digest:
                continue  # already ours, with these very rules
            try:
                prog = bpf.build_program(rules, original, False, normalized, code)
            except ValueError as exc:
                raise ApplyError(self.path, f"bpf program id {prog_id}", str(exc)) from exc
            pairs.append((old, self._load(prog)))
        return pairs

    def apply(self, given: Sequence[Rule | PlainRule], normalized: bool = False) -> AppliedV2:
        """Make the cgroup's device filter "original, then ``rules``" (OCI order); verify; undo on failure.
        ``normalized``: the rules are ``normalize``'s output already (a served plan's ``normal``,
        plain values: built as they are, no ``enum``); other plain rules are read back into ``Rule``."""
        rules = list(given) if normalized else [_as_rule(r) for r in given]
        cg = self._cgroup_fd()
        before = bpf_sys.query_device_programs(cg)
        if not rules:
            return AppliedV2(self.path, before.ids, before.ids, changed=False)
        _raise_memlock()
        mode = before.flags & (BPF_F_ALLOW_MULTI | BPF_F_ALLOW_OVERRIDE) if before.ids else BPF_F_ALLOW_MULTI
        pairs = self._plan(rules, before.ids, normalized)
        if not pairs:
            return AppliedV2(self.path, before.ids, before.ids, changed=False)
        try:
            for old, new in pairs:
                if old is None:
                    bpf_sys.attach(cg, new, BPF_F_ALLOW_MULTI)
                else:
                    _SWAPS[mode](cg, old, new)
                self._swaps.append(_Swap(mode, old, new))
            after = self._verify(before.ids, pairs)
        except ApplyError as exc:
            self._undo(exc)
            raise
        return AppliedV2(self.path, before.ids, after, changed=True)

    def _verify(self, before: tuple[int, ...], pairs: list[tuple[int | None, int]]) -> tuple[int, ...]:
        """Re-query: exactly the untouched originals plus our new programs must be attached."""
        replaced = {bpf_sys.prog_id(old) for old, _ in pairs if old is not None}
        expected = (set(before) - replaced) | {bpf_sys.prog_id(new) for _, new in pairs}
        after = bpf_sys.query_device_programs(self._cgroup_fd()).ids
        if set(after) != expected or len(after) != len(expected):
            raise ApplyError(
                self.path,
                "BPF_CGROUP_DEVICE",
                f"attached ids {sorted(after)}, expected {sorted(expected)}",
            )
        return after

    def _undo(self, cause: ApplyError) -> None:
        """Roll back after a failed apply; a failing rollback is noted on the original error."""
        try:
            self.rollback()
        except ApplyError as exc:
            cause.add_note(f"rollback failed too: {exc}")

    def rollback(self) -> None:
        """Put every original program back where ours is, newest swap first; then close."""
        cg = self._cgroup_fd()
        errors: list[str] = []
        for swap in reversed(self._swaps):
            try:
                if swap.old_fd is None:
                    bpf_sys.detach(cg, swap.new_fd)
                else:
                    _SWAPS[swap.mode](cg, swap.new_fd, swap.old_fd)
            except ApplyError as exc:
                errors.append(str(exc))
        self._swaps.clear()
        self.close()
        if errors:
            raise ApplyError(self.path, "rollback", "; ".join(errors))

    def close(self) -> None:
        """Release the fds; attached programs stay attached (the cgroup holds them)."""
        bpf_sys.close_all(self._open)
        self._open.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _as_rule(rule: Rule | PlainRule) -> Rule:
    from hook.core.rules import Access, DeviceType, Rule

    if isinstance(rule, Rule):
        return rule
    kind, access = DeviceType(rule.type), Access.parse(rule.access)
    return Rule(allow=rule.allow, type=kind, major=rule.major, minor=rule.minor, access=access)
