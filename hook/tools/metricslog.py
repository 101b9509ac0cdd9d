"""``hook metrics``: the decision log's counts, printed or kept in a node_exporter textfile.

Rule: off the start path. The hook only appends its log line; this reads the log afterwards (run
from a timer, the DaemonSet, or by hand) and never writes anything but the textfile.

The textfile is its own state: besides the counts it holds, as a comment line, where in the log
they end (the file's device and inode, the byte offset after the last line counted, a digest of
the bytes before it, and the newest record's time). The next run reads the counts back and adds
only what the log gained since, so the counters only grow while the log rotates (the hook's own
rotation renames: the file is found again as ``.1``; logrotate's ``delaycompress`` likewise). Where
that file is gone (compressed, deleted, rewritten), the records newer than the saved time are
counted instead. Counts and position change together, in one ``rename(2)`` of a file written
beside it: a run that dies leaves the previous textfile, never half of one.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hook.core.errors import InputError
from hook.core.record import record
from hook.tools.metrics import Gauges, Tally, parse, render, tally

__all__ = ["FILENAME", "Position", "textfile_path", "collect", "cmd_metrics", "node_gauges"]

FILENAME = "oci-device-hook.prom"  # in a directory given as the textfile
SIGNATURE = "# oci-device-hook metrics"  # how a textfile this command wrote begins (any version)
HEADER = SIGNATURE + " (hook metrics --textfile): counters over the decision log\n"
MARK = "# oci-device-hook position: "
CHECK_BYTES = 256
MAX_TEXTFILE = 1 << 20


@record
class Position:
    """Where the counted part of the log ends."""

    dev: int
    ino: int
    offset: int
    check: str  # sha256 of the (up to) CHECK_BYTES bytes before ``offset``
    time: str  # the newest counted record's ``time`` ("" when none had one)

    def to_line(self) -> str:
        fields = {
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "check": self.check,
            "time": self.time,
        }
        return MARK + json.dumps(fields, sort_keys=True) + "\n"


def textfile_path(value: Path) -> Path:
    """A name ending in ``.prom`` is the file; anything else is node_exporter's directory. A name
    with another suffix that is no directory (``foo.txt``) is refused for its suffix, the fact to
    fix: node_exporter reads ``*.prom`` files only."""
    if value.name.endswith(".prom"):
        return value
    if not value.is_dir() and (value.suffix or value.exists()):
        why = (
            f"not a directory, and its suffix {value.suffix or '(none)'!r} is not .prom: node_exporter reads "
            "only *.prom files (name a file ending .prom, or its textfile directory)"
        )
        raise InputError(str(value), "textfile", why)
    return value / FILENAME


def _open_regular(path: Path, what: str) -> int | None:
    """A read fd on ``path``, never through a symlink and never blocking (a FIFO is refused);
    ``None`` when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(str(path), what, "a symlink: never followed (name the file itself)") from None
        raise InputError(str(path), what, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(str(path), what, "not a regular file")
    return fd


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _previous(path: Path) -> tuple[Tally | None, Position | None]:
    """The counts and position a previous run left in the textfile; (None, None) when there is none."""
    fd = _open_regular(path, "textfile")
    if fd is None:
        return None, None
    try:
        data = os.read(fd, MAX_TEXTFILE + 1)  # ours is a few KiB: a planted giant is not read whole
    finally:
        os.close(fd)
    if len(data) > MAX_TEXTFILE:
        raise InputError(
            str(path), "textfile", f"larger than {MAX_TEXTFILE} bytes: not written by hook metrics"
        )
    text = data.decode("utf-8", "replace")
    if not text.startswith(SIGNATURE):
        raise InputError(str(path), "textfile", "not written by hook metrics: not replaced")
    position = None
    for line in text.splitlines():
        if line.startswith(MARK):
            try:
                raw = json.loads(line[len(MARK) :])
                position = Position(
                    dev=int(raw["dev"]), ino=int(raw["ino"]), offset=int(raw["offset"]),
                    check=str(raw["check"]), time=str(raw["time"]),
                )  # fmt: skip
            except (ValueError, KeyError, TypeError):
                position = None
    try:
        return parse(text), position
    except ValueError:
        return None, None  # another version's layout: counted afresh from the log


def _files(log: Path) -> list[Path]:
    """The log and its rotations, oldest first (``hook log``'s order)."""
    from hook.tools.logread import log_files

    return log_files(log)


def _lines(data: bytes) -> Iterator[dict[str, Any] | None]:
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            yield None
            continue
        yield obj if isinstance(obj, dict) else None


def _digest(data: bytes, offset: int) -> str:
    return hashlib.sha256(data[max(0, offset - CHECK_BYTES) : offset]).hexdigest()


def _read(path: Path) -> tuple[bytes, os.stat_result] | None:
    if path.name.endswith(".gz"):
        fd = _open_regular(path, "log")
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            with gzip.open(os.fdopen(os.dup(fd), "rb")) as f:
                return f.read(), st
        except (OSError, EOFError) as exc:
            raise InputError(str(path), "log", f"cannot read: {exc}") from None
        finally:
            os.close(fd)
    fd = _open_regular(path, "log")
    if fd is None:
        return None
    try:
        return _read_all(fd), os.fstat(fd)
    finally:
        os.close(fd)


def _newest_time(records: list[dict[str, Any] | None], time: str) -> str:
    for rec in records:
        t = rec.get("time") if rec is not None else None
        if isinstance(t, str) and t > time:
            time = t
    return time


def _after(records: list[dict[str, Any] | None], time: str) -> list[dict[str, Any] | None]:
    """The records stamped after ``time``: where the counted file is gone, time tells what is new
    (a line without a time, or one that is not a record, may have been counted: it is left out)."""
    return [r for r in records if r is not None and isinstance(r.get("time"), str) and r["time"] > time]


def collect(log: Path, start: Tally | None, position: Position | None) -> tuple[Tally, Position | None]:
    """``start`` plus what the log holds after ``position`` (everything when there is none), and
    where the counted part now ends."""
    files = [(p, got) for p in _files(log) if (got := _read(p)) is not None]
    found = None
    if position is not None:
        found = next(
            (
                i
                for i, (p, (data, st)) in enumerate(files)
                if not p.name.endswith(".gz")
                and (st.st_dev, st.st_ino) == (position.dev, position.ino)
                and len(data) >= position.offset
                and _digest(data, position.offset) == position.check
            ),
            None,
        )
    counts = start or Tally()
    time = position.time if position is not None else ""
    end = position
    for i, (p, (data, st)) in enumerate(files):
        if found is not None and i < found:
            continue
        begin = position.offset if position is not None and i == found else 0
        # the live file: complete lines only (the hook's one write(2) per line may be under way)
        stop = max(data.rfind(b"\n") + 1 if i == len(files) - 1 else len(data), begin)
        records = list(_lines(data[begin:stop]))
        if position is not None and found is None:
            records = _after(records, position.time)
        counts = tally(records, counts)
        time = _newest_time(records, time)
        if not p.name.endswith(".gz"):
            end = Position(dev=st.st_dev, ino=st.st_ino, offset=stop, check=_digest(data, stop), time=time)
    if end is not None and end.time != time:
        end = Position(dev=end.dev, ino=end.ino, offset=end.offset, check=end.check, time=time)
    return counts, end


def write_textfile(path: Path, text: str) -> None:
    """``text`` at ``path`` by one rename of a new file beside it: node_exporter reads the old
    file or the new one, never a part; never through a symlink; the directory must exist."""
    directory = path.parent
    if not directory.is_dir():
        raise InputError(str(directory), "textfile", "no such directory (node_exporter's textfile directory)")
    tmp = directory / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"  # not *.prom: never read
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InputError(str(path), "textfile", f"cannot write: {exc.strerror or exc}") from None


REGISTRATION_MAX = 64 << 10
HANDLER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # a handler's name, as the installer takes it


def node_gauges(settings: Path, registration: Path | None) -> Gauges:
    """What the node says now: whether ``settings`` loads (a missing default file is the defaults:
    valid), and per (engine, handler) whether the engine runs the hook, from the file ``installer
    status --check --write`` keeps (none given or unreadable: no ``registered`` series)."""
    from hook.sources.settingsfile import lenient

    try:
        valid = lenient(settings, ())[1] is None
    except InputError:
        valid = False
    return Gauges(settings_valid=valid, registered=_registered(registration) if registration else {})


def _registered(path: Path) -> dict[tuple[str, str], bool]:
    """``{"registered": {ENGINE: {HANDLER: true|false}}}``; names outside the closed shapes are left out."""
    try:
        fd = _open_regular(path, "registration")
    except InputError:  # a symlink, a FIFO: not the installer's file
        return {}
    if fd is None:
        return {}
    try:
        doc = json.loads(os.read(fd, REGISTRATION_MAX))
    except ValueError:
        return {}
    finally:
        os.close(fd)
    out: dict[tuple[str, str], bool] = {}
    engines = doc.get("registered") if isinstance(doc, dict) else None
    for engine, handlers in (engines or {}).items() if isinstance(engines, dict) else ():
        if engine in ("containerd", "hooks.d") and isinstance(handlers, dict):
            for handler, ok in list(handlers.items())[:64]:
                if isinstance(handler, str) and HANDLER.fullmatch(handler) and isinstance(ok, bool):
                    out[(engine, handler)] = ok
    return out


def cmd_metrics(
    log: Path, textfile: Path | None, *, write: bool, must_exist: bool = False, since: str = "",
    gauges: Gauges | None = None,
) -> tuple[str, int]:  # fmt: skip
    """The text; with ``write``, the textfile is replaced by it instead. With a textfile, its
    counts are continued (printing shows what the next write would hold, and writes nothing).
    ``since`` (``hook log``'s spellings) prints a window instead: the records stamped then or
    later, no position, no textfile (whose counters must only grow)."""
    if must_exist and not _files(log):
        raise InputError(str(log), "", "no such log file (nor rotated copies of it)")
    if since:
        from hook.tools.logread import parse_since, read_records

        first = parse_since(since)
        records = [r for r in read_records(log) if r is None or str(r.get("time", "")) >= first]
        return HEADER + render(tally(records), gauges), 0
    start, position = _previous(textfile) if textfile is not None else (None, None)
    counts, end = collect(log, start, position)
    text = HEADER + render(counts, gauges) + (end.to_line() if end is not None else "")
    if write and textfile is not None:
        write_textfile(textfile, text)
        return "", 0
    return text, 0
