"""Run a runc container (or the hook alone) in a private mount namespace that hides the host's
``/run``, log directory and node key directory behind tmpfs, after shell ``setup`` lines of the test's own.

Rule: whatever the hook writes outside the bundle lands in a tmpfs that vanishes with the
namespace; a test that must look at such a tree afterwards prints it from ``after`` lines
(they run in the namespace once runc is done, whatever its exit status).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.live.livekit import RUNC, Bundle, RunResult, _quote

PRIVATE = ("/run", "/var/log", "/var/lib/oci-device-hook")  # the last: the node key's dir


def isolated_script(
    setup: Sequence[str], command: str, after: Sequence[str] = (), cgroup2: bool = False
) -> str:
    lines = [f"mount -t tmpfs -o mode=755 tmpfs {d}" for d in PRIVATE]
    if cgroup2:
        lines.append("mount -t cgroup2 none /sys/fs/cgroup")
    lines += list(setup)
    body = " && ".join(lines) + f" && {{ {command}; }}; rc=$?"
    for line in after:
        body += f"; {line}"
    return body + "; exit $rc"


def run_isolated(
    bundle: Bundle,
    *,
    setup: Sequence[str] = (),
    after: Sequence[str] = (),
    cgroup2: bool = False,
    timeout: float = 60,
) -> RunResult:
    """``runc run`` the bundle inside ``unshare -m`` with private tmpfs over /run and /var/log."""
    state = bundle.path / "runc-state"
    run = " ".join(map(_quote, [RUNC, "--root", str(state), "run", "--bundle", str(bundle.path), bundle.id]))
    delete = " ".join(map(_quote, [RUNC, "--root", str(state), "delete", "-f", bundle.id]))
    script = isolated_script(setup, f"{run} </dev/null", [f"{delete} >/dev/null 2>&1", *after], cgroup2)
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return RunResult(proc.returncode, proc.stdout, proc.stderr)
    except subprocess.TimeoutExpired as exc:
        subprocess.run(
            [RUNC, "--root", str(state), "delete", "-f", bundle.id], capture_output=True, timeout=30
        )
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return RunResult(124, out, "[timed out]")


def listing(directory: Path | str, out: Path) -> str:
    """A shell line writing every entry below ``directory`` (type, device numbers, mode, owner) to ``out``."""
    d = _quote(str(directory))
    return f"find {d} -exec stat -c '%n %F %t:%T %a %u:%g' {{}} + | sort > {_quote(str(out))}"
