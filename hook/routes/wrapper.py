"""The runtime wrapper's decision for ``create``, ``run`` and ``restore`` (packaging/runtime execs it).

Rule: the imperative shell around ``hook.routes.runtimeargs`` (which config the runtime will read) and
``hook.routes.offer`` (the decision: the warm decider's, else ``hook.routes.precreate``'s in this
process; when the decider answers, the per-start process imports the fast path, the client and
the log step only). One process from the engine's call to the runtime: the sh
wrapper execs this, and this execs the real runtime with the engine's arguments unchanged, so a
wrapper killed by the engine (SIGKILL included) takes the decision with it and never starts a
runtime later. Fail closed: a command line no grammar reads for sure, a config that cannot be
found, opened as a regular file or read, and a decision that takes longer than its bound, all
refuse the create with one line; the runtime never runs.

The decided config replaces ``config.json`` without a named temp file: it is written into an
anonymous ``O_TMPFILE`` inode in the bundle, the original is hard-linked to ``config.json.orig``,
``config.json`` is unlinked and the new inode linked in its place. Killed at any point, the
bundle holds the original, or no ``config.json`` (the runtime refuses to start), or the decided
one, and never a stray file. Where the filesystem has no ``O_TMPFILE`` the new file is written
in place of the unlinked one; a partial JSON object is one no runtime parses.

A container that needs no decision (``precreate_fast``) costs its floor and little more: until
the full path runs, this module uses ``posix`` (built in, loaded by every interpreter) and not
``os`` (issue 35: importing it was a quarter of the interpreter's own start-up). The environment
is ``posix.environ``, the very dict ``os.environ`` wraps once ``os`` is loaded, and the runtime is
started with ``execve`` and that dict, searched for on ``PATH`` as ``os.execvp`` searches.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # not signal: its IntEnum wrappers load enum
import posix
import sys

from hook.routes.fastpath import MAX_CONFIG, precreate_fast
from hook.routes.runtimeargs import ArgsError, creates

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["main", "DECISION_SECONDS", "TIMEOUT_ENV"]

PREFIX = "oci-device-hook runtime: "
DECISION_SECONDS = 10  # as a hooks.d hook's timeout: an engine waits no longer for a prestart hook
TIMEOUT_ENV = "OCI_DEVICE_HOOK_DECISION_TIMEOUT"  # the engine's environment (tests: a short bound)
# hook.routes.precreate's names (not imported from there: it loads the whole decision; a test pins them)
RUNTIME_SEEN_ENV = "OCI_DEVICE_HOOK_RUNTIME"
CONTAINER_ID_ENV = "OCI_DEVICE_HOOK_CONTAINER_ID"
RUNTIME_LOG_ENV = "OCI_DEVICE_HOOK_RUNTIME_LOG"
RUNTIME_LOG_FORMAT_ENV = "OCI_DEVICE_HOOK_RUNTIME_LOG_FORMAT"
LOADER_PREFIX = "OCI_DEVICE_HOOK_LOADER_"  # packaging/launcher.sh.in: the engine's loader variables
# hook.routes.crunguard's names: the cgroup manager the command line names, the binary execed after
CGROUP_MANAGER_ENV = "OCI_DEVICE_HOOK_CGROUP_MANAGER"
RUNTIME_EXEC_ENV = "OCI_DEVICE_HOOK_RUNTIME_EXEC"
_HOOK_ONLY = (RUNTIME_SEEN_ENV, CONTAINER_ID_ENV, RUNTIME_LOG_ENV, RUNTIME_LOG_FORMAT_ENV, CGROUP_MANAGER_ENV,
              RUNTIME_EXEC_ENV)


def _say(message: str) -> None:
    """One line on stderr, and where the engine reads the runtime's error (its ``--log``)."""
    from hook.core.escape import clean
    from hook.routes.act import runtime_log

    sys.stderr.write(PREFIX + clean(message) + "\n")
    sys.stderr.flush()
    runtime_log(PREFIX + message)


def _getenv(name: str) -> str:
    """``os.environ.get(name, "")`` without ``os``, decoded as it decodes (the file system
    encoding, surrogateescape: bytes that are no text come back as they were)."""
    return posix.environ.get(name.encode(), b"").decode(sys.getfilesystemencoding(), "surrogateescape")


def _setenv(name: str, value: str) -> None:
    """``os.environ[name] = value`` without ``os``, encoded as it encodes: the runtime execed gets
    it (``_exec``), and so does the full path (``os.environ`` wraps this same dict)."""
    posix.environ[name.encode()] = value.encode(sys.getfilesystemencoding(), "surrogateescape")


def _is_regular(path: str) -> bool:
    return posix.stat(path).st_mode & 0o170000 == 0o100000  # stat.S_ISREG without stat


def _is_dir(path: str) -> bool:
    """``os.path.isdir`` without ``os``."""
    try:
        return posix.stat(path).st_mode & 0o170000 == 0o040000
    except (OSError, ValueError):
        return False


def _bound() -> int:
    value = _getenv(TIMEOUT_ENV)
    return int(value) if value.isdigit() and 1 <= int(value) <= 300 else DECISION_SECONDS


def _expired(signum: int, frame: FrameType | None) -> None:
    _say(f"no decision within {_bound()} s: refused")
    posix._exit(1)


def _read_config(path: str) -> bytes:
    """The config's bytes, opened as the runtime opens it (symlinks followed) but never blocking:
    a FIFO, a device or a directory is refused before a byte is read."""
    if not _is_regular(path):
        raise ValueError("not a regular file")
    fd = posix.open(path, posix.O_RDONLY | posix.O_NONBLOCK | posix.O_CLOEXEC)
    try:
        st = posix.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            raise ValueError("not a regular file")
        if st.st_size > MAX_CONFIG:
            raise ValueError(f"larger than {MAX_CONFIG} bytes")
        chunks = []
        size = 0
        while size <= MAX_CONFIG:
            chunk = posix.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        posix.close(fd)
    if size > MAX_CONFIG:
        raise ValueError(f"larger than {MAX_CONFIG} bytes")
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    import errno
    import os

    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
    os.fsync(fd)


def _replace(path: str, data: bytes) -> None:
    """``path`` ← ``data``, the original kept as ``path.orig``; no named temp file at any moment."""
    import os  # only where a decision changed the config: the full path has loaded it

    directory, name = os.path.split(path)
    dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = -1
    try:
        try:
            fd = os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except OSError:
            fd = -1  # no O_TMPFILE on this filesystem
        if fd >= 0:
            _write_all(fd, data)  # complete before the original is touched
        orig = f"{name}.orig"
        try:  # noqa: SIM105 - contextlib is not imported on a create's path
            os.unlink(orig, dir_fd=dfd)
        except FileNotFoundError:
            pass
        os.link(name, orig, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        os.unlink(name, dir_fd=dfd)
        if fd >= 0:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, 0o600, dir_fd=dfd)
            _write_all(fd, data)
        os.fsync(dfd)
    finally:
        if fd >= 0:
            os.close(fd)
        os.close(dfd)


def decide(opts: dict[str, list[str]], args: list[str]) -> int:
    """0 when the runtime may run with ``args`` (the config decided in place where needed)."""
    try:
        target = creates(args, _is_dir)
    except ArgsError as exc:
        _say(f"cannot tell which config this command line creates a container from ({exc}): refused")
        return 1
    if target is None:
        return 0
    _setenv(CONTAINER_ID_ENV, target.ident)
    _setenv(RUNTIME_LOG_ENV, target.log)
    _setenv(RUNTIME_LOG_FORMAT_ENV, target.log_format)
    _setenv(CGROUP_MANAGER_ENV, target.cgroup_manager)
    path = target.config_path
    try:
        data = _read_config(path)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _say(f"{path}: {why}: refused")
        return 1
    if precreate_fast(opts, data):
        return 0
    from hook.routes.offer import spec_level

    code, out = spec_level("wrapper", opts, data)
    if code != 0:
        return code
    if out != data:
        try:
            _replace(path, out)
        except OSError as exc:
            _say(f"{path}: could not replace the config ({exc.strerror or exc}): refused")
            return 1
    return 0


def _loader_variables_back(env: dict[bytes, bytes]) -> None:
    """The engine's LD_* and GLIBC_TUNABLES, which the bundled launcher moved aside so that its own
    loader would not act on them (packaging/launcher.sh.in), are the real runtime's again."""
    prefix = LOADER_PREFIX.encode()
    for name in [n for n in env if n.startswith(prefix)]:
        env[name[len(prefix) :]] = env.pop(name)


def _exec(file: str, args: list[str], env: dict[bytes, bytes]) -> None:
    """``os.execvp(file, args)`` with ``env`` as the environment, without ``os``: a name with a
    slash is run as it is; a bare name is looked for in each ``PATH`` entry of ``env`` (none:
    ``/bin:/usr/bin``, ``os.defpath``), in order; the error raised is the first that is not
    "no such file" along the way, else the last, as ``os.execvp`` raises."""
    if "/" in file:
        posix.execve(file, args, env)
    path = env.get(b"PATH")
    found = path.decode(sys.getfilesystemencoding(), "surrogateescape") if path is not None else None
    dirs = found.split(":") if found is not None else ["/bin", "/usr/bin"]
    first: OSError | None = None
    last: OSError | None = None
    for directory in dirs:
        full = directory + file if not directory or directory.endswith("/") else directory + "/" + file
        try:
            posix.execve(full, args, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:
            last = exc
            first = first or exc
    raise first or last or FileNotFoundError(file)


def main(argv: list[str]) -> int:
    """``hook runtime-wrapper [--config FILE] -- REAL ARGS...``: decide, then exec ``REAL ARGS``."""
    opts: dict[str, list[str]] = {}
    if argv[:1] == ["--config"] and len(argv) > 1:
        opts["--config"] = [argv[1]]
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        sys.stderr.write(PREFIX + "usage: hook runtime-wrapper [--config FILE] -- RUNTIME ARGS...\n")
        return 2
    real, args = argv[1], argv[2:]
    _setenv(RUNTIME_EXEC_ENV, real)
    _signal.signal(_signal.SIGALRM, _expired)
    _signal.alarm(_bound())
    code = decide(opts, args)
    _signal.alarm(0)  # a pending alarm would survive the exec
    if code != 0:
        return code
    env = posix.environ  # os.environ's own dict, where the full path loaded os
    for name in _HOOK_ONLY:
        env.pop(name.encode(), None)
    _loader_variables_back(env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        _exec(real, [real, *args], env)
    except (OSError, ValueError) as exc:
        from hook.core.escape import clean

        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        sys.stderr.write(f"{PREFIX}{clean(real)}: {why}\n")
    return 127
