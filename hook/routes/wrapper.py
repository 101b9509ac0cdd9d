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
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # not signal: its IntEnum wrappers load enum
import errno
import os
import stat
import sys

from hook.core.escape import clean
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
    from hook.routes.act import runtime_log

    sys.stderr.write(PREFIX + clean(message) + "\n")
    sys.stderr.flush()
    runtime_log(PREFIX + message)


def _bound() -> int:
    value = os.environ.get(TIMEOUT_ENV, "")
    return int(value) if value.isdigit() and 1 <= int(value) <= 300 else DECISION_SECONDS


def _expired(signum: int, frame: FrameType | None) -> None:
    _say(f"no decision within {_bound()} s: refused")
    os._exit(1)


def _read_config(path: str) -> bytes:
    """The config's bytes, opened as the runtime opens it (symlinks followed) but never blocking:
    a FIFO, a device or a directory is refused before a byte is read."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_CONFIG:
            raise ValueError(f"larger than {MAX_CONFIG} bytes")
        chunks = []
        size = 0
        while size <= MAX_CONFIG:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_CONFIG:
        raise ValueError(f"larger than {MAX_CONFIG} bytes")
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
    os.fsync(fd)


def _replace(path: str, data: bytes) -> None:
    """``path`` ← ``data``, the original kept as ``path.orig``; no named temp file at any moment."""
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
        target = creates(args, os.path.isdir)
    except ArgsError as exc:
        _say(f"cannot tell which config this command line creates a container from ({exc}): refused")
        return 1
    if target is None:
        return 0
    os.environ[CONTAINER_ID_ENV] = target.ident
    os.environ[RUNTIME_LOG_ENV] = target.log
    os.environ[RUNTIME_LOG_FORMAT_ENV] = target.log_format
    os.environ[CGROUP_MANAGER_ENV] = target.cgroup_manager
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


def _loader_variables_back() -> None:
    """The engine's LD_* and GLIBC_TUNABLES, which the bundled launcher moved aside so that its own
    loader would not act on them (packaging/launcher.sh.in), are the real runtime's again."""
    for name in [n for n in os.environ if n.startswith(LOADER_PREFIX)]:
        value = os.environ.pop(name)
        os.environ[name[len(LOADER_PREFIX) :]] = value


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
    os.environ[RUNTIME_EXEC_ENV] = real
    _signal.signal(_signal.SIGALRM, _expired)
    _signal.alarm(_bound())
    code = decide(opts, args)
    _signal.alarm(0)  # a pending alarm would survive the exec
    if code != 0:
        return code
    for name in _HOOK_ONLY:
        os.environ.pop(name, None)
    _loader_variables_back()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(real, [real, *args])
    except OSError as exc:
        sys.stderr.write(f"{PREFIX}{clean(real)}: {exc.strerror or exc}\n")
    return 127
