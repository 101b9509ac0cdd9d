"""``hook serve``: the warm decider. Each node runs one; the per-start hook hands it containers.

Rule: the decider decides and applies by running ``hook.routes.live.run_live`` itself (the in-process
path, same report, same log line), with a ``Session`` that sends the stderr text back, asks the
client for "go" before any side effect and checks the client's pidfd around the apply. What
makes it fast is only that it is already running: imports done, and the views it loads
(settings, CDI registry, inventory, kubelet checkpoint) kept by ``hook.sources.warm`` and revalidated by
file identity before every decision.

Trust: the socket is in a root-only directory (0700, ours, not a symlink) and is itself 0600;
every connection's peer must be uid 0 (``SO_PEERCRED``), and a request names its container by
a pidfd the client opened, whose pid (read back from ``/proc/self/fdinfo``) must be the state's
``pid``; a pid that is not that process is declined, never decided. One request per container
at a time (a lock per container id), any number of containers at once (a thread each, up to
``MAX_WORKERS``; past that a request is declined and the hook decides in-process).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextlib import suppress as _suppress

from hook.core.errors import InputError
from hook.core.version import VERSION
from hook.routes import client
from hook.routes.fastpath import MAX_STATE, loads
from hook.routes.live import STDIN, Abandoned, Session, run_live

__all__ = ["Decider", "serve"]

MAX_WORKERS = 64
GO_TIMEOUT = 2.0  # the client says "go" (or leaves) at once; silence this long abandons
LIVE_OPTIONS = frozenset({"--config", "--driver-root", "--cdi-spec-dir", "--inventory", "--format", "--log"})


class _Stop(Exception):
    pass


class _Reader:
    """Frames from a connection whose first bytes came with the pidfd (``recvmsg``)."""

    def __init__(self, conn: socket.socket, first: bytes) -> None:
        self.conn, self.buf = conn, first

    def recv(self, n: int) -> bytes:
        if self.buf:
            chunk, self.buf = self.buf[:n], self.buf[n:]
            return chunk
        return self.conn.recv(n)


class _Served(Session):
    """One request's session: output back to the client, "go" before side effects, pidfd checks."""

    def __init__(self, conn: socket.socket, reader: _Reader, pidfd: int) -> None:
        super().__init__()
        self.conn, self.reader, self.pidfd = conn, reader, pidfd
        self.text: list[str] = []
        self.committed = False

    def err(self, text: str) -> None:
        self.text.append(text)

    def by_hand(self) -> bool:
        return False  # the client only hands over a runtime's run (the state in a pipe)

    def commit(self) -> None:
        if self.committed:
            return
        try:
            self.conn.sendall(client.frame(client.READY, b""))
            self.conn.settimeout(GO_TIMEOUT)
            kind, _ = client.read_frame(self.reader, 0)
        except (OSError, ValueError):
            raise Abandoned from None
        if kind != client.GO:
            raise Abandoned
        self.committed = True

    def check_pid(self, pid: int) -> None:
        """Alive now (``pidfd_send_signal(0)``) means never reaped since the client opened the pidfd,
        so ``pid`` has named that process all along: checked before and after the apply."""
        try:
            signal.pidfd_send_signal(self.pidfd, 0)
        except ProcessLookupError:
            raise InputError(STDIN, "pid", f"{pid}: the container's process has exited") from None
        except OSError as exc:
            raise InputError(STDIN, "pid", f"{pid}: pidfd: {exc.strerror or exc}") from None


def pidfd_pid(fd: int) -> int | None:
    """The pid (in this pid namespace) of the process pidfd ``fd`` refers to; None if not a pidfd
    or the process is gone (the kernel then shows -1)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError, IndexError):
        return None
    return None


def _peer_uid(conn: socket.socket) -> int:
    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[4:8], sys.byteorder)


def parse_request(payload: bytes) -> tuple[str, dict[str, list[str]]] | str:
    """``(stage, live opts)`` from a ``Q`` frame, or why it is declined."""
    fields = payload.split(b"\0")
    if len(fields) < 4 or fields[0] != client.MAGIC:
        return "not a hook request"
    if fields[1] != VERSION.encode() or fields[2] != client.PROTOCOL:
        hook = fields[1].decode("ascii", "replace")[:40]
        return f"decider is version {VERSION}, the hook {hook} (protocol {fields[2][:8]!r})"
    stage = fields[3].decode("utf-8", "replace")
    if stage not in ("prestart", "createRuntime"):
        return f"stage {stage[:40]!r} is not served"
    opts: dict[str, list[str]] = {}
    for item in fields[4:]:
        name, _, value = item.decode("utf-8", "surrogateescape").partition("=")
        if name not in LIVE_OPTIONS:
            return f"option {name[:40]!r} is not served"
        opts.setdefault(name, []).append(value)
    return stage, opts


class Decider:
    """The listening socket, the workers and the counters ``hook doctor`` shows."""

    def __init__(self, directory: str = client.SOCKET_DIR, name: str = client.SOCKET_NAME) -> None:
        self.directory, self.name = directory, name
        self.started = time.monotonic()
        self.requests = 0  # answered
        self.declined = 0
        self.abandoned = 0
        self._lock = threading.Lock()
        self._containers: dict[str, list[object]] = {}  # id -> [lock, users]
        self._slots = threading.BoundedSemaphore(MAX_WORKERS)
        self._sock: socket.socket | None = None
        self._ino = 0

    # --- socket ---------------------------------------------------------------------------

    def listen(self) -> None:
        """Bind a fresh socket and rename it over the old name, so a starting decider takes over
        (an upgrade) and a client never sees a socket that is not listening yet."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        st = os.lstat(self.directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise InputError(self.directory, "", "must be this user's directory, mode 0700, not a symlink")
        path = os.path.join(self.directory, self.name)
        temp = f"{path}.{os.getpid()}.tmp"
        with _suppress(FileNotFoundError):
            os.unlink(temp)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(temp)
        finally:
            os.umask(old)
        os.chmod(temp, 0o600)
        sock.listen(128)
        os.rename(temp, path)
        self._ino = os.lstat(path).st_ino
        self._sock = sock

    def close(self) -> None:
        """Stop listening; the name goes only if it is still ours (a newer decider may own it)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        path = os.path.join(self.directory, self.name)
        try:
            if os.lstat(path).st_ino == self._ino:
                os.unlink(path)
        except OSError:
            pass

    def run(self) -> None:
        assert self._sock is not None
        sock = self._sock
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                if sock.fileno() < 0:
                    return  # closed: stopping
                raise
            if not self._slots.acquire(blocking=False):
                self._decline(conn, "busy")
                conn.close()
                continue
            threading.Thread(target=self._worker, args=(conn,), daemon=True).start()

    def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the requests in flight."""
        end = time.monotonic() + timeout
        for _ in range(MAX_WORKERS):
            if not self._slots.acquire(timeout=max(end - time.monotonic(), 0)):
                return

    # --- one request ----------------------------------------------------------------------

    def _worker(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._handle(conn)
        except (OSError, ValueError):
            pass  # the client left or sent garbage: it decides in-process, nothing to do here
        except Exception as exc:  # a worker never takes the decider down
            sys.stderr.write(f"oci-device-hook serve: request failed: {type(exc).__name__}: {exc}\n")
        finally:
            self._slots.release()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(client.DECIDE_TIMEOUT * 2)
        if _peer_uid(conn) != 0:
            return  # only root may ask; anyone else gets nothing
        pidfd = -1
        try:
            data, anc, _flags, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * 4))
            fds = [
                int.from_bytes(d[i : i + 4], sys.byteorder)
                for level, kind, d in anc
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                for i in range(0, len(d) - len(d) % 4, 4)
            ]
            pidfd, extra = (fds[0], fds[1:]) if fds else (-1, [])
            for fd in extra:
                os.close(fd)
            reader = _Reader(conn, data)
            kind, payload = client.read_frame(reader)
            if kind == client.STATUS:
                conn.sendall(client.frame(client.ANSWER, json.dumps(self.status()).encode()))
                return
            request = parse_request(payload) if kind == client.REQUEST else "not a request"
            if isinstance(request, str):
                self._decline(conn, request)
                return
            kind, stdin = client.read_frame(reader, 2 * MAX_STATE)
            if kind != client.STATE:
                self._decline(conn, "no state")
                return
            why, container = self._container(stdin, pidfd)
            if why:
                self._decline(conn, why)
                return
            _stage, opts = request
            with self._one_at_a_time(container):
                self._decide(conn, reader, pidfd, opts, stdin)
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def _container(self, stdin: bytes, pidfd: int) -> tuple[str, str]:
        """(why to decline, container id): the pidfd must be the state's pid, seen from here."""
        try:
            state = loads(stdin)
            pid, cid = state.get("pid"), state.get("id")
        except Exception:  # the in-process path reports a broken state with its file and field
            return "state does not parse", ""
        cid = cid if isinstance(cid, str) else ""
        if pid is None and pidfd < 0:
            return "", cid
        if pidfd < 0:
            return "no pidfd for the state's pid", cid
        seen = pidfd_pid(pidfd)
        if seen is None or seen != pid:
            return f"the pidfd is process {seen}, the state says pid {pid!r} (another pid namespace?)", cid
        return "", cid

    def _decide(
        self, conn: socket.socket, reader: _Reader, pidfd: int, opts: dict[str, list[str]], stdin: bytes
    ) -> None:
        session = _Served(conn, reader, pidfd)
        try:
            code = run_live(opts, stdin, session)
        except Abandoned:
            with self._lock:
                self.abandoned += 1
            return
        except Exception as exc:  # as hook.entry: one line, never a traceback
            from hook.core.escape import clean

            session.text.append(f"oci-device-hook: internal error: {type(exc).__name__}: {clean(exc)}\n")
            code = 1
        with self._lock:
            self.requests += 1
        answer = f"{code}\0{''.join(session.text)}".encode("utf-8", "surrogateescape")
        with _suppress(OSError):
            conn.sendall(client.frame(client.ANSWER, answer))

    def _decline(self, conn: socket.socket, why: str) -> None:
        with self._lock:
            self.declined += 1
        with _suppress(OSError):
            conn.sendall(client.frame(client.DECLINE, why.encode("utf-8", "replace")))

    @contextmanager
    def _one_at_a_time(self, container: str) -> Iterator[None]:
        with self._lock:
            slot = self._containers.setdefault(container, [threading.Lock(), 0])
            slot[1] = int(slot[1]) + 1  # type: ignore[call-overload]
        lock: threading.Lock = slot[0]  # type: ignore[assignment]
        try:
            with lock:
                yield
        finally:
            with self._lock:
                slot[1] = int(slot[1]) - 1  # type: ignore[call-overload]
                if not slot[1]:
                    del self._containers[container]

    def status(self) -> dict[str, object]:
        with self._lock:
            return {
                "version": VERSION,
                "pid": os.getpid(),
                "uptime_s": round(time.monotonic() - self.started, 3),
                "requests": self.requests,
                "declined": self.declined,
                "abandoned": self.abandoned,
            }


def _preload() -> None:
    """Import every module a decision or an apply may need now, so the first request is as warm
    as the thousandth (the per-start hook imports them lazily, only when needed)."""
    import importlib

    for name in (
        "hook.routes.gather", "hook.core.decide", "hook.core.report", "hook.adapters.log",
        "hook.routes.logrecord", "hook.adapters.marker",
        "hook.sources.cdi.registry", "hook.sources.cdi.edits", "hook.sources.cdi.hostnodes",
        "hook.sources.nvidia.inventory",
        "hook.sources.nvidia.ids", "hook.sources.nvidia.nodes", "hook.sources.nvidia.dri",
        "hook.adapters.apply.locate",
        "hook.adapters.apply.transaction", "hook.adapters.apply.cgroup_v1",
        "hook.adapters.apply.cgroup_v2", "hook.adapters.apply.devnodes",
        "hook.adapters.apply.bpf", "hook.sources.cachefile", "hook.core.escape",
        "hook.sources.kubelet.checkpoint", "hook.sources.kubelet.dra",
    ):  # fmt: skip
        with _suppress(ImportError):  # an optional part missing here: the request that needs it says so
            importlib.import_module(name)


def serve(directory: str = client.SOCKET_DIR, config: str | None = None) -> int:
    """Run the decider until SIGTERM/SIGINT; then finish the requests in flight (up to 10 s).

    ``decider: off`` in the settings (``config``, else the default file) makes it exit at once:
    with no socket every hook decides in-process, silently, which is what "off" asks for.
    """
    from pathlib import Path

    from hook.sources import warm
    from hook.sources.settingsfile import DEFAULT_PATH, DeciderMode, load_settings

    path = Path(config) if config else Path(DEFAULT_PATH)
    try:
        off = load_settings(path, required=config is not None).decider is DeciderMode.OFF
    except InputError as exc:
        from hook.core.escape import clean

        sys.stderr.write(f"oci-device-hook serve: {clean(exc)}\n")
        return 1
    if off:
        sys.stderr.write(f"oci-device-hook serve: decider: off in {path}; not serving\n")
        return 0

    warm.enable()
    _preload()
    decider = Decider(directory)

    def stop(_sig: int, _frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        decider.listen()
    except (OSError, InputError) as exc:
        sys.stderr.write(f"oci-device-hook serve: cannot listen in {directory}: {exc}\n")
        return 1
    sys.stderr.write(f"oci-device-hook serve: {VERSION} listening on {directory}/{client.SOCKET_NAME}\n")
    sys.stderr.flush()
    try:
        decider.run()
    except _Stop:
        pass
    finally:
        decider.close()
    decider.drain(10.0)
    sys.stderr.write(f"oci-device-hook serve: stopped after {decider.requests} request(s)\n")
    return 0
