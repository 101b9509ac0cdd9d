"""Views a resident decider keeps between decisions, each tied to its files' identity.

Rule: off in the per-start hook (every call computes, exactly as before); ``hook serve`` turns it
on. A view is reused only while the identity it was computed from, ``(st_dev, st_ino, st_size,
st_mtime_ns, st_ctime_ns)`` of each file it read (taken *before* reading, so a change during the read makes
the next call recompute, never keeps a stale view), is unchanged: the rule the on-disk caches
already follow. A failed computation is never kept. One slot per file set (settings path, spec
dirs, checkpoint and pod): a new identity replaces the old view, so memory stays bounded by
the number of distinct inputs, and a cap clears everything past ``MAX_SLOTS``.
"""

from __future__ import annotations

import os
from _thread import allocate_lock  # not threading: the per-start hook imports this module too

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import TypeVar

    T = TypeVar("T")
    Identity = tuple[int, int, int, int, int]  # dev, inode, size, mtime_ns, ctime_ns

__all__ = ["enable", "enabled", "forget", "identity", "identities", "remembered"]

MAX_SLOTS = 8192  # a 64-GPU + 224-MIG node keeps ~600 (one per GPU information and capability file)

_on = False
_slots: dict[object, tuple[object, object]] = {}
_lock = allocate_lock()


def enable(on: bool = True) -> None:
    global _on
    _on = on
    if not on:
        with _lock:
            _slots.clear()


def enabled() -> bool:
    return _on


def identity(path: str | os.PathLike[str]) -> Identity | None:
    """``(dev, inode, size, mtime_ns, ctime_ns)`` of ``path`` (followed), or None when it cannot be
    stat'ed (always None while off: the per-start hook makes no extra syscall for a key it never
    uses). ``ctime`` is what a rewrite in place cannot hide: the same size with the old mtime put
    back (``touch -r``, ``os.utime``) still moves it, and so does a file made again at the same path."""
    if not _on:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def identities(paths: Iterable[str]) -> tuple[tuple[str, Identity | None], ...]:
    return tuple((p, identity(p)) for p in paths)


def remembered(
    slot: object, key: object, compute: Callable[[], T], keep: Callable[[T], bool] | None = None
) -> T:
    """``compute()``, or the value this slot holds for exactly this ``key`` (only when enabled);
    a value ``keep`` refuses (one not decided by the files the key names) is never held."""
    if not _on:
        return compute()
    with _lock:
        held = _slots.get(slot)
    if held is not None and held[0] == key:
        return held[1]  # type: ignore[return-value]
    value = compute()
    if keep is not None and not keep(value):
        with _lock:
            _slots.pop(slot, None)
        return value
    with _lock:
        if len(_slots) >= MAX_SLOTS and slot not in _slots:
            _slots.clear()
        _slots[slot] = (key, value)
    return value


def forget(match: Callable[[object], bool]) -> int:
    """Drop every slot whose key ``match`` accepts; how many. A long-lived caller forgets what will
    not be asked again (``hook nri``: a removed container's pod view), so its memory stays flat
    instead of growing to ``MAX_SLOTS``."""
    with _lock:
        gone = [slot for slot in _slots if match(slot)]
        for slot in gone:
            del _slots[slot]
    return len(gone)
