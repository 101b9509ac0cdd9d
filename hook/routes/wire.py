"""The decider's wire: frames, the node key, and the MAC that binds each answer to its request.

Rule: the hook trusts the decider because both hold the node's key, never because of a uid or a
path: a container without a user namespace is uid 0, and one with the host's ``/run`` can connect
to (or plant) the socket. The key lives where no pod mounts by convention (``KEY_DIR``, root's
0700; the file root's 0600, 32 bytes, never read through a symlink). A request is MACed with it
(the decider answers nothing else, so a container that connects learns nothing), and so is each
answer, over the request's MAC (which covers the hook's fresh nonce): a listener without the key
can neither answer nor replay an answer. The MAC is keyed BLAKE2b (RFC 7693's keyed mode), from
``_blake2``: loading ``hashlib`` would cost the per-start hook its OpenSSL (~4 ms).

This module imports only ``os`` at load time: the per-start client and the decider share it.
"""

from __future__ import annotations

import os

__all__ = [
    "KEY_DIR", "KEY_NAME", "MAX_ANSWER", "MAX_DECLINE", "MAX_PROOF", "SOCKET_DIR", "SOCKET_NAME",
    "fingerprint", "frame", "left_for", "mac", "make_key", "read_frame", "read_key", "same",
]  # fmt: skip

SOCKET_DIR = "/run/oci-device-hook"
SOCKET_NAME = "decider.sock"
KEY_DIR = "/var/lib/oci-device-hook"  # not under /run: a hostPath of /run must not reach it
KEY_NAME = "decider.key"
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
    try:
        from _blake2 import blake2b
    except ImportError:  # a Python built without the builtin module: hashlib's (OpenSSL-free) one
        from hashlib import blake2b
    h = blake2b(key=key, digest_size=32, person=b"odh-decider-v2")
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def same(a: bytes, b: bytes) -> bool:
    """Constant-time equality (``hmac.compare_digest`` is this function)."""
    from _operator import _compare_digest

    return bool(_compare_digest(a, b))


def _own_private_dir(fd: int) -> bool:
    st = os.fstat(fd)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o077 and st.st_mode & 0o170000 == 0o040000


def read_key(directory: str | None = None) -> bytes | None:
    """The node's decider key, or None when there is none this process may trust: the directory
    and the file are ours (root's), open to no one else, not symlinks, and the file holds exactly
    ``KEY_BYTES`` bytes. Never blocks (``O_NONBLOCK``: a FIFO planted there is refused)."""
    try:
        dfd = os.open(directory or KEY_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not _own_private_dir(dfd):
            return None
        fd = os.open(KEY_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        data = os.read(fd, KEY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == KEY_BYTES else None


def make_key(directory: str | None = None) -> bytes:
    """The node's key, created when there is none (``hook serve`` at start; the installer may too).

    The directory is made 0700 and must then be ours; one that is ours but open (a fresh node's
    hostPath ``DirectoryOrCreate`` makes it 0755) is narrowed to 0700 through its fd, never through
    the path, and a symlink there or another user's directory is refused as it is. A new
    key is written to a private name opened ``O_EXCL|O_NOFOLLOW`` and linked (or, over a file that
    cannot be a key, renamed: a rename replaces the name, never what a symlink there points at)
    into place. ``OSError`` says why there is no key.
    """
    directory = directory or KEY_DIR
    os.makedirs(directory, mode=0o700, exist_ok=True)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(dfd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(dfd, 0o700)
        if not _own_private_dir(dfd):
            raise PermissionError(f"{directory}: must be this user's directory, mode 0700, not a symlink")
        key = read_key(directory)
        if key is not None:
            return key
        tmp = f".{KEY_NAME}.{os.getpid()}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
        )
        try:
            os.write(fd, os.urandom(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, KEY_NAME, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:  # another decider won, or a file that is no key sits there
            if read_key(directory) is None:
                os.rename(tmp, KEY_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
        finally:
            try:  # noqa: SIM105 - contextlib is one more import
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
        os.fsync(dfd)
    finally:
        os.close(dfd)
    key = read_key(directory)
    if key is None:
        raise PermissionError(f"{directory}/{KEY_NAME}: not a usable key")
    return key


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
