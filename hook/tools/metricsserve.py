"""``hook metrics --serve ADDR:PORT``: the decision log's counters over HTTP, for a Prometheus scrape.

Rule: the same counts as ``hook metrics`` prints, made from the log when a scrape asks, off every
container's start path. The process keeps where its counts end in memory (a restart counts the
log, with its rotations, from the start again: a counter reset, which ``rate()`` handles).

Who can reach it: whoever reaches ADDR:PORT. In the DaemonSet that is the pod's address on the
cluster network, so any pod, unless a NetworkPolicy says otherwise. What they get is counts:
every label value comes from a fixed set (``hook.tools.metrics``), no container string reaches the
page. It answers ``GET /metrics`` and nothing else, reads only the log, writes nothing; a client
that sends nothing is dropped after ``TIMEOUT`` seconds, and at most ``MAX_CLIENTS`` are served at
once (others are closed at once), so idle connections cannot hold up a scrape or pile up threads.
"""

from __future__ import annotations

import re
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hook.core.errors import HookError, InputError

if TYPE_CHECKING:
    from hook.tools.metrics import Gauges

__all__ = ["parse_listen", "serve", "serve_metrics"]

TIMEOUT = 5.0
MAX_CLIENTS = 8
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]*)):(?P<port>[0-9]{1,5})")


def parse_listen(value: str) -> tuple[str, int, socket.AddressFamily]:
    """``ADDR:PORT``, ``:PORT`` (every IPv4 address) or ``[V6]:PORT``; one-line error otherwise."""
    m = _LISTEN.fullmatch(value)
    if m is None or int(m["port"]) > 65535:
        shapes = "127.0.0.1:9402, :9402, [::1]:9402"
        raise InputError("--serve", "", f"expected ADDR:PORT ({shapes}), not {value!r}")
    if m["v6"] is not None:
        return m["v6"], int(m["port"]), socket.AF_INET6
    return m["host"] or "0.0.0.0", int(m["port"]), socket.AF_INET


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    produce: Callable[[], str]
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # busy: the scraper retries on its next interval
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    timeout = TIMEOUT
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, "only /metrics is served here\n")
            return
        try:
            body = self.server.produce()
        except HookError as exc:
            print(f"hook metrics --serve: {exc}", file=sys.stderr, flush=True)
            self._answer(500, f"{exc}\n")
            return
        self._answer(200, body, CONTENT_TYPE)

    def _answer(self, code: int, text: str, kind: str = "text/plain; charset=utf-8") -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape: a scrape every 15 s would fill the container's log."""


def serve(listen: str, produce: Callable[[], str]) -> tuple[str, int]:
    """Serve ``produce()`` at ``GET /metrics`` on ``listen`` until SIGTERM or ^C."""
    host, port, family = parse_listen(listen)

    class Server(_Server):
        address_family = family

    try:
        server = Server((host, port), _Handler)
    except OSError as exc:
        raise InputError("--serve", "", f"cannot listen on {listen}: {exc.strerror or exc}") from None
    server.produce = produce
    server.slots = threading.BoundedSemaphore(MAX_CLIENTS)
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    where = f"{shown}:{server.server_address[1]}"
    print(f"hook metrics: serving /metrics on {where}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return "", 0


def serve_metrics(
    listen: str, log: Path, *, alone: bool = True, gauges: Callable[[], Gauges] | None = None
) -> tuple[str, int]:
    """``hook metrics --serve``: each scrape adds what the log gained since the last one. Not
    ``alone`` (with ``--textfile`` or ``--since``): an error, since a server keeps no textfile and
    a window has no counters that only grow."""
    if not alone:
        raise InputError("--serve", "", "not with --textfile or --since")
    from hook.tools.metrics import render
    from hook.tools.metricslog import HEADER, collect

    lock = threading.Lock()
    state: dict[str, Any] = {"counts": None, "position": None}

    def produce() -> str:
        with lock:
            state["counts"], state["position"] = collect(log, state["counts"], state["position"])
            return HEADER + render(state["counts"], gauges() if gauges is not None else None)

    produce()  # a log that cannot be read fails here, with its one line, before anything listens
    return serve(listen, produce)
