"""The warm decider (``hook serve``) for the bench's route rows: start it, switch it, prove it served.

Rule: only public commands and files. The decider is ``<launcher> serve --config S`` with the same
settings file every hook of the workload is given (driver root, CDI dirs, log and caches live in
that file, so the hook's options and the decider's are equal by construction: one decider per
settings file). It runs in the bench's private ``/run`` and over a private tmpfs on its key dir.
One decider serves all three states of a round-robin, switched between samples by renames in the
socket dir (untimed, microseconds): *warm* (its socket in place), *stopped* (a socket file nobody
listens on, what a decider that died leaves: the hook's connect is refused) and *in-process* (no
socket at all). A sample is judged served from the hook's own log record (``"decider":
"answered"``) or, for a hook whose records carry no such field, from the decider's request count.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SOCKET_DIR", "KEY_DIR", "Decider", "running", "last_record", "status"]

SOCKET_DIR = Path("/run/oci-device-hook")
SOCKET = SOCKET_DIR / "decider.sock"
LIVE = SOCKET_DIR / "decider.sock.bench-live"
STALE = SOCKET_DIR / "decider.sock.bench-stale"
KEY_DIR = Path("/var/lib/oci-device-hook")
MODES = ("in-process", "warm", "stopped")


def status() -> dict[str, Any] | str:
    """The decider's own account (``client.status()``; either module path), or why there is none."""
    for name in ("hook.routes.client", "hook.client"):
        try:
            client = importlib.import_module(name)
        except ImportError:
            continue
        got = client.status()
        return got if isinstance(got, dict) else str(got)
    return "no hook client module"


def _requests() -> int:
    got = status()
    return int(got.get("requests", -1)) if isinstance(got, dict) else -1


def last_record(log: Path) -> dict[str, Any] | None:
    """The hook log's last JSON line (read from the end: the log grows through the whole run)."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict):
                return rec
    return None


@dataclass
class Decider:
    """A running decider and the state its socket slot is in."""

    proc: subprocess.Popen[bytes]
    log: Path
    mode: str = "warm"
    served: dict[str, list[str]] = field(default_factory=dict)  # variant -> per-sample verdicts
    _count: int = -1

    def set(self, mode: str) -> None:
        """Put the slot into ``mode`` (renames only; the decider keeps listening on its inode)."""
        if mode == self.mode:
            return
        for name, parked in (("warm", LIVE), ("stopped", STALE)):
            if self.mode == name:
                SOCKET.rename(parked)
        if mode == "warm":
            LIVE.rename(SOCKET)
        elif mode == "stopped":
            STALE.rename(SOCKET)
        self.mode = mode
        if mode == "warm":
            self._count = _requests()

    def judge(self, variant: str) -> None:
        """After a warm sample: did the decider answer it? (the record's field, else the count)."""
        rec = last_record(self.log) or {}
        if "decider" in rec:
            verdict = str(rec["decider"])
        else:
            now = _requests()
            verdict = "answered" if now > self._count >= 0 else ("unknown" if now < 0 else "in-process")
            self._count = now
        self.served.setdefault(variant, []).append(verdict)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return -1


def _stale_socket() -> None:
    with contextlib.suppress(FileNotFoundError):
        STALE.unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(STALE))
    s.close()


@contextlib.contextmanager
def running(launcher: Path, settings: Path, log: Path) -> Iterator[Decider]:
    """``<launcher> serve --config settings`` until the block ends, its slot left empty after."""
    SOCKET_DIR.mkdir(exist_ok=True)
    os.chmod(SOCKET_DIR, 0o700)
    for path in (SOCKET, LIVE, STALE):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    proc = subprocess.Popen([str(launcher), "serve", "--config", str(settings)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(800):
            if SOCKET.is_socket() or proc.poll() is not None:
                break
            time.sleep(0.025)
        if not SOCKET.is_socket():
            ended = proc.poll() is not None and proc.stderr is not None
            err = proc.stderr.read().decode(errors="replace") if ended and proc.stderr else ""
            raise RuntimeError(f"the decider did not start: {err.strip() or 'no socket in 20 s'}")
        time.sleep(0.2)  # let it finish its preload before the first timed request
        _stale_socket()
        yield Decider(proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
        for path in (SOCKET, LIVE, STALE):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
