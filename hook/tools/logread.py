"""``hook log``: read the decision log back, filtered, oldest first.

Rule: a reader, never a writer; a line it cannot parse, or a record whose fields have the wrong
types (a ``verdict`` that is not a string ...), is counted and skipped, not fatal (the log may hold
lines of an older version, a line cut by a full disk, or a line someone wrote by hand). Rotated
files (``.1`` ..., ``.N.gz`` from logrotate) are read oldest first so the output is in time order.
Warnings are part of what a person reads: the text shows each under its record.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hook.core.errors import InputError, UsageError
from hook.core.escape import clean

__all__ = ["parse_since", "log_files", "read_records", "select", "render", "cmd_log"]

_AGO = re.compile(r"(\d+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> str:
    """``today`` | ``yesterday`` | ``2h`` / ``30m`` / ``7d`` | a date or RFC 3339 time → RFC 3339 (UTC)."""
    now_dt = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    midnight = now_dt.replace(hour=0, minute=0, second=0, microsecond=0)
    if text == "today":
        start = midnight
    elif text == "yesterday":
        start = midnight - timedelta(days=1)
    elif m := _AGO.fullmatch(text):
        start = now_dt - timedelta(seconds=int(m.group(1)) * _UNIT[m.group(2)])
    else:
        try:
            start = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(
                "--since", "since", f"{text!r}: expected today, yesterday, 2h/30m/7d, or a date/time"
            ) from None
        if start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
    return start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{start.microsecond // 1000:03d}Z"


def log_files(path: Path) -> list[Path]:
    """The log and its rotations, oldest first."""
    rotated: list[tuple[int, Path]] = []
    for p in path.parent.glob(path.name + ".*"):
        suffix = p.name[len(path.name) + 1 :].removesuffix(".gz")
        if suffix.isdigit():
            rotated.append((int(suffix), p))
    return [p for _, p in sorted(rotated, reverse=True)] + ([path] if path.exists() else [])


def read_records(path: Path) -> Iterator[dict[str, Any] | None]:
    """Every line of the log and its rotations as a dict (``None`` for a line that is not one)."""
    for p in log_files(path):
        opener = gzip.open if p.name.endswith(".gz") else open
        try:
            with opener(p, "rt", encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        yield None
                        continue
                    yield obj if isinstance(obj, dict) else None
        except OSError as exc:
            raise InputError(str(p), "", f"cannot read: {exc.strerror or exc}") from None


# The fields the reader filters and prints on, with the JSON type each must have when present.
_SHAPE: dict[str, type | tuple[type, ...]] = {
    "verdict": str,
    "time": str,
    "reason": str,
    "error": str,
    "denied": list,
    "warnings": list,
    "pod": (dict, type(None)),
    "container": dict,
}


def _well_shaped(rec: dict[str, Any]) -> bool:
    """A record this reader can filter and print: a string verdict, and every known field of its type."""
    if not isinstance(rec.get("verdict"), str):
        return False
    return all(not (k in rec and not isinstance(rec[k], t)) for k, t in _SHAPE.items())


def _warnings(rec: dict[str, Any]) -> list[str]:
    return [str(w) for w in rec.get("warnings") or ()]


def _pod(rec: dict[str, Any]) -> dict[str, Any]:
    pod = rec.get("pod")
    return pod if isinstance(pod, dict) else {}


def select(
    records: Iterator[dict[str, Any] | None],
    *,
    since: str = "",
    verdicts: Sequence[str] = (),
    narrowed: bool = False,
    namespace: str = "",
    pod: str = "",
    warnings: bool = False,
) -> tuple[list[dict[str, Any]], int]:
    """The matching records and how many lines were not records (or not records of this shape)."""
    out, bad = [], 0
    for rec in records:
        if rec is None or not _well_shaped(rec):
            bad += 1
            continue
        if since and str(rec.get("time", "")) < since:
            continue
        if verdicts and rec.get("verdict") not in verdicts:
            continue
        if narrowed and not (rec.get("verdict") == "apply" and rec.get("denied")):
            continue
        if namespace and _pod(rec).get("namespace") != namespace:
            continue
        if pod and _pod(rec).get("name") != pod:
            continue
        if warnings and not _warnings(rec):
            continue
        out.append(rec)
    return out, bad


def _line(rec: dict[str, Any]) -> str:
    p = _pod(rec)
    who = "/".join(str(p.get(k, "-")) for k in ("namespace", "name", "container")) if p else "-"
    cid = (
        str((rec.get("container") or {}).get("id", ""))[:12] if isinstance(rec.get("container"), dict) else ""
    )
    denied = rec.get("denied") or []
    tail = f" denied={','.join(map(str, denied))}" if denied else ""
    why = rec.get("reason") or rec.get("error") or ""
    line = f"{rec.get('time', '-')}  {rec.get('verdict', '?'):<5}  {who}  {cid}  {why}{tail}"
    # pod names, ids, reasons and warnings are the containers' words: escaped, one line each
    return "\n".join([clean(line, 4096), *(f"    warning: {clean(w, 4096)}" for w in _warnings(rec))])


def render(records: list[dict[str, Any]], bad: int, fmt: str) -> str:
    if fmt == "json":
        return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    lines = [_line(r) for r in records]
    if bad:
        lines.append(f"({bad} line(s) were not log records and were skipped)")
    if not records:
        lines.append("no matching log records")
    return "\n".join(lines) + "\n"


def cmd_log(
    path: Path,
    fmt: str,
    *,
    since: str = "",
    verdicts: Sequence[str] = (),
    narrowed: bool = False,
    namespace: str = "",
    pod: str = "",
    warnings: bool = False,
    must_exist: bool = False,
) -> tuple[str, int]:
    """``must_exist``: the file was named (``--file``), so a missing one is an error; the settings'
    log that does not exist yet (no container decided here) is only said so."""
    start = parse_since(since) if since else ""
    if not log_files(path):
        if must_exist:
            raise InputError(str(path), "", "no such log file (nor rotated copies of it)")
        if fmt == "text":
            return f"no matching log records ({path} does not exist yet)\n", 0
    records, bad = select(
        read_records(path),
        since=start,
        verdicts=verdicts,
        narrowed=narrowed,
        namespace=namespace,
        pod=pod,
        warnings=warnings,
    )
    return render(records, bad, fmt), 0
