"""The decider's wire: frames, the node key, and the MAC that binds each answer to its request.

Rule: the hook trusts the decider because both hold the node's key, never because of a uid or a
path: a container without a user namespace is uid 0, and one with the host's ``/run`` can connect
to (or plant) the socket. The key lives where no pod mounts by convention (``KEY_DIR``, root's
0700; the file root's 0600, 32 bytes, never read through a symlink). A request is MACed with it
(the decider answers nothing else, so a container that connects learns nothing), and so is each
answer, over the request's MAC (which covers the hook's fresh nonce): a listener without the key
can neither answer nor replay an answer. The MAC is keyed BLAKE2b (RFC 7693's keyed mode), from
``_blake2``: loading ``hashlib`` would cost the per-start hook its OpenSSL (~4 ms).

This module imports only ``os`` (and ``hook.sources.nodekey``, the key's one home) at load time:
the per-start client and the decider share it.
"""

from __future__ import annotations

import os

from hook.sources import nodekey
from hook.sources.nodekey import same as same

__all__ = [
    "KEY_DIR", "KEY_NAME", "MAX_ANSWER", "MAX_DECLINE", "MAX_PROOF", "SOCKET_DIR", "SOCKET_NAME",
    "fingerprint", "frame", "left_for", "mac", "make_key", "read_frame", "read_key", "same",
]  # fmt: skip

SOCKET_DIR = "/run/oci-device-hook"
SOCKET_NAME = "decider.sock"
KEY_DIR = nodekey.KEY_DIR  # not under /run: a hostPath of /run must not reach it
KEY_NAME = nodekey.KEY_NAME
KEY_BYTES = 32
MAGIC = b"oci-device-hook"
PROTOCOL = b"2"
MAX_FRAME = 24 << 20  # a config.json (16 MiB at most) and its state fit
# What an answer can be, checked before its body is read: a decision (a decided config.json of 16 MiB
# at most, as a JSON string, with its record; the decider declines a larger one), a decline's one
# line, the proof's MAC.
MAX_ANSWER = 24 << 20
MAX_DECLINE = 4096
MAX_PROOF = 64
REQUEST, STATE, CONFIG, FACTS, MAC = b"Q", b"S", b"C", b"F", b"M"
ANSWER, DECLINE = b"A", b"D"
ROUTES = (b"live", b"precreate", b"status")


def frame(kind: bytes, payload: bytes) -> bytes:
    """``kind`` (one byte), the payload's length (4 bytes, big-endian), the payload."""
    return kind + len(payload).to_bytes(4, "big") + payload


def read_frame(
    sock: object, limit: int | dict[bytes, int] = MAX_FRAME, deadline: float | None = None
) -> tuple[bytes, bytes]:
    """One frame from ``sock`` (anything with ``recv``); ``ValueError`` on EOF or a frame over
    ``limit`` (a number, or one per kind: a kind not named there is refused before its payload).
    With a ``deadline`` (``time.monotonic()``), each read waits only for the time left (``settimeout``
    before every ``recv``) and ``TimeoutError`` is raised once it has passed: a peer that sends one
    byte at a time cannot stretch the exchange past it."""
    head = _exactly(sock, 5, deadline)
    size = int.from_bytes(head[1:], "big")
    if size > (limit if isinstance(limit, int) else limit.get(head[:1], -1)):
        raise ValueError(f"frame of {size} bytes")
    return head[:1], _exactly(sock, size, deadline)


def _exactly(sock: object, n: int, deadline: float | None = None) -> bytes:
    chunks: list[bytes] = []
    while n:
        if deadline is not None:
            left_for(sock, deadline)
        chunk = sock.recv(min(n, 1 << 20))  # type: ignore[attr-defined]
        if not chunk:
            raise ValueError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def left_for(sock: object, deadline: float) -> None:
    """The socket's timeout set to the time left before ``deadline``; ``TimeoutError`` when none is."""
    from time import monotonic

    left = deadline - monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    sock.settimeout(left)  # type: ignore[attr-defined]


def mac(key: bytes, *parts: bytes) -> bytes:
    """Keyed BLAKE2b-256 over ``parts``, each length-prefixed (no two part lists collide)."""
    return nodekey.mac(key, b"odh-decider-v2", *parts)


def read_key(directory: str | None = None) -> bytes | None:
    """The node's key (``hook.sources.nodekey.read_key``) from ``KEY_DIR`` unless told."""
    return nodekey.read_key(directory or KEY_DIR)


def make_key(directory: str | None = None) -> bytes:
    """The node's key, made when there is none (``hook serve`` at start; ``hook.sources.nodekey``)."""
    return nodekey.make_key(directory or KEY_DIR)


def _identity(path: str, full: bool) -> str:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return "-"
    parts = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) if full else st[1:3]
    return ":".join(map(str, parts))


def fingerprint(opts: dict[str, list[str]], settings_path: str) -> bytes:
    """What the hook's decision depends on besides the container: the settings file (its path and
    identity: an edit changes it) and every option that names where the node is read (each path
    and the identity of what it names, so a decider that sees another file system under the same
    names differs). Equal fingerprints: the decider decides as this hook would; else it declines."""
    given = "--config" in opts  # an explicit file must exist; the default may be absent
    lines = [os.path.abspath(settings_path), _identity(settings_path, True), str(given)]
    for name in ("--driver-root", "--cdi-spec-dir", "--inventory"):
        for value in opts.get(name, ()):
            lines += [name, value, _identity(value, name == "--inventory")]
    return mac(b"", *(line.encode("utf-8", "surrogateescape") for line in lines))
