"""The node's key, and the proof every record the hook keeps carries: one secret per node, outside ``/run``.

Rule: a file the hook wrote is believed because it proves the node's key, never because of its
owner or its path: a container without a user namespace is uid 0, and one with a hostPath of
``/run`` can rewrite whatever lies there. The key (32 random bytes) lives in ``KEY_DIR``, root's
0700 and not under ``/run``; the file is root's 0600, never read through a symlink or a FIFO. It
is made by whichever comes first (``hook serve`` at start, a hook that writes a record, the
installer); until it exists no record is trusted or written: the hook decides without caches. A
record is sealed with keyed BLAKE2b (RFC 7693's keyed mode, from ``_blake2``: no OpenSSL on the
start path) over its file name and bytes; one that fails is a miss the caller rebuilds.

This module imports only ``posix`` at load time (not ``os``, which the fast path does without:
hook.sources.privatefile says why): the fast path, the per-start client and the decider share it.
Only a writer (``make_key``) imports ``os``. The key is read once per process (``node_key``).
"""

import posix

TYPE_CHECKING = False  # typing is not imported at run time: the fast path cannot afford it
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "KEY_BYTES", "KEY_DIR", "KEY_NAME", "PRIVATE_DIR", "SEAL", "digest", "found", "mac", "make_key",
    "node_key", "read_key",
    "same", "seal", "unseal",
]  # fmt: skip

KEY_DIR = "/var/lib/oci-device-hook"  # not under /run: a hostPath of /run must not reach it
KEY_NAME = "decider.key"
KEY_BYTES = 32
SEAL = b"oci-device-hook/sealed/1 "  # a sealed record's first line: this, then the MAC in hex
_PERSON = b"odh-record-v1"  # keyed BLAKE2b's personalisation: no record MAC is a decider MAC
_known: dict[str, bytes] = {}  # directory -> its key, once read by this process


def _blake2b(data: bytes = b"", **kw: "Any") -> "Any":
    try:
        from _blake2 import blake2b
    except ImportError:  # a Python built without the builtin module: hashlib's (OpenSSL-free) one
        from hashlib import blake2b
    return blake2b(data, **kw)


def mac(key: bytes, person: bytes, *parts: bytes) -> bytes:
    """Keyed BLAKE2b-256 over ``parts``, each length-prefixed (no two part lists collide)."""
    h = _blake2b(key=key, digest_size=32, person=person)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()  # type: ignore[no-any-return]


def digest(data: bytes) -> str:
    """BLAKE2b-256 of ``data`` in hex: what ties a record to a file's bytes (inside a sealed record)."""
    return _blake2b(data=data, digest_size=32).hexdigest()  # type: ignore[no-any-return]


def same(a: bytes, b: bytes) -> bool:
    """Constant-time equality (``hmac.compare_digest`` is this function)."""
    from _operator import _compare_digest

    return bool(_compare_digest(a, b))


def _own_private_dir(fd: int) -> bool:
    st = posix.fstat(fd)
    return st.st_uid == posix.geteuid() and not st.st_mode & 0o077 and st.st_mode & 0o170000 == 0o040000


def read_key(directory: "str | None" = None) -> "bytes | None":
    """The node's key, or None when there is none this process may trust: the directory and the
    file are ours (root's), open to no one else, not symlinks, and the file holds exactly
    ``KEY_BYTES`` bytes. Never blocks (``O_NONBLOCK``: a FIFO planted there is refused)."""
    try:
        flags = posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC
        dfd = posix.open(directory or KEY_DIR, flags)
    except (OSError, ValueError):
        return None
    try:
        if not _own_private_dir(dfd):
            return None
        flags = posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK | posix.O_CLOEXEC
        fd = posix.open(KEY_NAME, flags, dir_fd=dfd)
    except OSError:
        return None
    finally:
        posix.close(dfd)
    try:
        st = posix.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or st.st_uid != posix.geteuid() or st.st_mode & 0o077:
            return None
        data = posix.read(fd, KEY_BYTES + 1)
    except OSError:
        return None
    finally:
        posix.close(fd)
    return data if len(data) == KEY_BYTES else None


PRIVATE_DIR = "must be this user's directory, mode 0700, not a symlink"


def found(st: "posix.stat_result") -> str:
    """What a private directory's check found instead (its mode and owner): the one fact an
    operator needs to fix it (``chmod 0700``, ``chown``) without a second look."""
    if st.st_mode & 0o170000 == 0o120000:
        return "found a symlink"
    kind = "" if st.st_mode & 0o170000 == 0o040000 else "not a directory, "
    mode = st.st_mode & 0o7777
    return f"found {kind}mode {mode:04o}, owner uid {st.st_uid} (this process is uid {posix.geteuid()})"


def make_key(directory: "str | None" = None) -> bytes:
    """The node's key, created when there is none.

    The directory is made 0700 and must then be ours; one that is ours but open (a fresh node's
    hostPath ``DirectoryOrCreate`` makes it 0755) is narrowed to 0700 through its fd, never through
    the path, and a symlink there or another user's directory is refused as it is. A new key is
    written to a private name opened ``O_EXCL|O_NOFOLLOW`` and linked (or, over a file that cannot
    be a key, renamed: a rename replaces the name, never what a symlink there points at) into
    place, so two makers at once agree on one key. ``OSError`` says why there is no key.
    """
    import os  # a writer only: the readers above do without it

    directory = directory or KEY_DIR
    os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        import errno

        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise PermissionError(f"{directory}: {PRIVATE_DIR}; {found(os.lstat(directory))}") from None
    try:
        st = os.fstat(dfd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(dfd, 0o700)
        if not _own_private_dir(dfd):
            raise PermissionError(f"{directory}: {PRIVATE_DIR}; {found(os.fstat(dfd))}")
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
        except FileExistsError:  # another maker won, or a file that is no key sits there
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


def node_key(*, create: bool = False) -> "bytes | None":
    """The node's key, read once per process; with ``create`` (a writer), made when there is none.
    None: no key this process may use (no record is then trusted or written)."""
    directory = KEY_DIR
    key = _known.get(directory)
    if key is None:
        try:
            key = make_key(directory) if create else read_key(directory)
        except (OSError, ValueError):
            key = None
        if key is not None:
            _known[directory] = key
    return key


def seal(name: str, data: bytes) -> "bytes | None":
    """``data`` as the record ``name`` (a file name), with the node key's proof as its first line;
    None when there is no key (the record is then not written)."""
    key = node_key(create=True)
    if key is None:
        return None
    return SEAL + mac(key, _PERSON, name.encode(), data).hex().encode() + b"\n" + data


def unseal(name: str, blob: "bytes | None") -> "bytes | None":
    """The record's bytes if ``blob`` is ``name`` as this node's key sealed it, else None (a miss)."""
    if blob is None or not blob.startswith(SEAL):
        return None
    proof, sep, data = blob[len(SEAL) :].partition(b"\n")
    key = node_key()
    if not sep or key is None:
        return None
    return data if same(proof, mac(key, _PERSON, name.encode(), data).hex().encode()) else None
