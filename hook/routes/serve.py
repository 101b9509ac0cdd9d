"""``hook serve``: the warm decider. Each node runs one; per-start hooks offer it their containers.

Rule: the decider decides and never acts (``hook.routes.answer``): a hook asks, proves the node's
key, and gets the decision the in-process path would compute, which it then applies and logs
itself. What makes it fast is only that it is already running: imports done, and the views it
loads (settings, CDI registry, inventory, kubelet checkpoint) kept by ``hook.sources.warm`` and
revalidated by file identity before every decision. What it needs: read access to the driver's
``/proc``, the CDI dirs, the kubelet's files and the settings; its socket directory and its key
(``hook.routes.wire``). It writes no cgroup, no ``/dev`` and no log, and reads no ``/proc/<pid>``.

The socket is in a root-only directory (0700, ours, not a symlink) and is itself 0600; but a
container without a user namespace is root too, so the key, not the socket's mode, is the trust.
Any number of requests at once (a thread each, up to ``MAX_WORKERS``; past that a connection is
closed unanswered and the hook decides in-process).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import threading
import time
from contextlib import suppress as _suppress

from hook.core.errors import InputError
from hook.core.version import VERSION
from hook.routes import wire
from hook.routes.answer import Answerer

__all__ = ["Decider", "serve"]

MAX_WORKERS = 64
READ_TIMEOUT = 5.0  # a request not read whole within this is dropped (one deadline, every read)


class _Stop(Exception):
    pass


class Decider:
    """The listening socket, the workers and the counters ``hook doctor`` shows."""

    def __init__(
        self,
        directory: str = wire.SOCKET_DIR,
        name: str = wire.SOCKET_NAME,
        *,
        key: bytes,
        opts: dict[str, list[str]] | None = None,
        settings_path: str = "",
    ) -> None:
        from hook.sources.settingsfile import DEFAULT_PATH

        opts = dict(opts or {})
        self.directory, self.name = directory, name
        self.started = time.monotonic()
        self.answerer = Answerer(key, opts, settings_path or str(DEFAULT_PATH), self.status)
        self._slots = threading.BoundedSemaphore(MAX_WORKERS)
        self._sock: socket.socket | None = None
        self._ino = 0

    def listen(self) -> None:
        """Bind a fresh socket and rename it over the old name, so a starting decider takes over
        (an upgrade) and a client never sees a socket that is not listening yet."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        st = os.lstat(self.directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            from hook.sources.nodekey import PRIVATE_DIR, found

            raise InputError(self.directory, "", f"{PRIVATE_DIR}; {found(st)}")
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
                conn.close()  # busy: the hook decides in-process
                continue
            threading.Thread(target=self._worker, args=(conn,), daemon=True).start()

    def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the requests in flight."""
        end = time.monotonic() + timeout
        for _ in range(MAX_WORKERS):
            if not self._slots.acquire(timeout=max(end - time.monotonic(), 0)):
                return

    def _worker(self, conn: socket.socket) -> None:
        try:
            with conn:
                self.answerer.handle(conn, time.monotonic() + READ_TIMEOUT)
        except (OSError, ValueError):
            pass  # the client left or sent garbage: it decides in-process, nothing to do here
        except Exception as exc:  # a worker never takes the decider down
            from hook.core.escape import clean

            sys.stderr.write(f"oci-device-hook serve: request failed: {type(exc).__name__}: {clean(exc)}\n")
        finally:
            self._slots.release()

    def status(self) -> dict[str, object]:
        c = self.answerer.counters
        with c.lock:
            return {
                "version": VERSION,
                "pid": os.getpid(),
                "uptime_s": round(time.monotonic() - self.started, 3),
                "requests": c.answered,
                "declined": c.declined,
                "unauthenticated": c.unauthenticated,
            }


PRELOAD = (
    "hook.routes.live",
    "hook.routes.precreate",
    "hook.routes.gather",
    "hook.core.decide",
    "hook.core.report",
    "hook.routes.decision",
    "hook.adapters.marker",
    "hook.adapters.specwriter",
    "hook.sources.cdi.registry",
    "hook.sources.cdi.edits",
    "hook.sources.cdi.hostnodes",
    "hook.sources.nvidia.inventory",
    "hook.sources.nvidia.ids",
    "hook.sources.nvidia.nodes",
    "hook.sources.nvidia.dri",
    "hook.sources.cachefile",
    "hook.core.escape",
    "hook.sources.kubelet.checkpoint",
    "hook.sources.kubelet.dra",
)


def _preload() -> None:
    """Import every module a decision may need now, so the first request is as warm as the
    thousandth (the per-start hook imports them lazily, only when needed)."""
    import importlib

    for name in PRELOAD:
        with _suppress(ImportError):  # an optional part missing here: the request that needs it says so
            importlib.import_module(name)


def serve(opts: dict[str, list[str]], directory: str = wire.SOCKET_DIR) -> int:
    """Run the decider until SIGTERM/SIGINT; then finish the requests in flight (up to 10 s).

    ``opts`` are the live options it decides with (``--config``, ``--driver-root``,
    ``--cdi-spec-dir``, ``--inventory``): it serves exactly the hooks run with the same ones.
    ``decider: off`` in the settings makes it exit at once (and every hook decides in-process).
    """
    from pathlib import Path

    from hook.core.escape import clean
    from hook.sources import warm
    from hook.sources.settingsfile import DEFAULT_PATH, DeciderMode, load_settings

    config = opts["--config"][-1] if opts.get("--config") else None
    path = Path(config) if config else Path(DEFAULT_PATH)
    try:
        off = load_settings(path, required=config is not None).decider is DeciderMode.OFF
    except InputError as exc:
        sys.stderr.write(f"oci-device-hook serve: {clean(exc)}\n")
        return 1
    if off:
        sys.stderr.write(f"oci-device-hook serve: decider: off in {path}; not serving\n")
        return 0
    try:
        key = wire.make_key()
    except OSError as exc:
        sys.stderr.write(f"oci-device-hook serve: no key in {wire.KEY_DIR}: {clean(exc)}\n")
        return 1
    warm.enable()
    _preload()
    decider = Decider(directory, key=key, opts=opts, settings_path=str(path))

    def stop(_sig: int, _frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        decider.listen()
    except (OSError, InputError) as exc:
        sys.stderr.write(f"oci-device-hook serve: cannot listen in {directory}: {exc}\n")
        return 1
    sys.stderr.write(f"oci-device-hook serve: {VERSION} listening on {directory}/{wire.SOCKET_NAME}\n")
    sys.stderr.flush()
    try:
        decider.run()
    except _Stop:
        pass
    finally:
        decider.close()
    decider.drain(10.0)
    sys.stderr.write(f"oci-device-hook serve: stopped after {decider.status()['requests']} request(s)\n")
    return 0
