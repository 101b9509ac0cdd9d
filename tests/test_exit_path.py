"""The live run ends in ``os._exit`` (``hook.entry.run``): same exit code, output and log as a normal exit.

Differential: every case runs twice in a real subprocess, once through ``python -m hook`` (the
launcher's ``run()``: flush, then ``os._exit``) and once through ``sys.exit(main(...))`` (normal
interpreter teardown); exit status, stdout, stderr and the log must be identical. Each run is in
its own ``unshare -m`` with a tmpfs over /run and /var/log, so the host's /run/oci-device-hook and
default log are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
NO_SUCH_PID = 2**22 + 12345

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a private /run"
)

NORMAL = "import sys; from hook.entry import main; sys.exit(main(sys.argv[1:]))"
# a private /run (the fast-path cache) and /var/log: the "missing settings file" case logs to the
# default log, which must never be the host's
IN_NS = (
    'mount -t tmpfs -o mode=0755 tmpfs /run && mkdir /run/oci-device-hook && mount -t tmpfs tmpfs /var/log'
    ' && exec "$@"'
)


def _run(how: str, args: list[str], stdin: bytes, log: Path) -> tuple[int, str, str, str]:
    log.unlink(missing_ok=True)
    py = [sys.executable, "-I", "-m", "hook"] if how == "exit" else [sys.executable, "-I", "-c", NORMAL]
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", IN_NS, "sh", *py, *args]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, input=stdin, capture_output=True, env=env, cwd=REPO, timeout=60)
    text = log.read_text() if log.exists() else ""
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode(), _stable(text)


def _stable(log: str) -> str:
    """Log lines without what differs between two runs (time, duration, pid)."""
    out = []
    for line in log.splitlines():
        record = json.loads(line)
        for key in ("time", "ts", "timestamp", "duration_ms", "elapsed_ms", "hook_pid"):
            record.pop(key, None)
        out.append(json.dumps(record, sort_keys=True))
    return "\n".join(out)


def _state(bundle: Path, pid: int | None = NO_SUCH_PID) -> bytes:
    state: dict[str, object] = {"ociVersion": "1.1.0", "id": "exit-path", "status": "created"}
    state["bundle"] = str(bundle)
    if pid is not None:
        state["pid"] = pid
    return json.dumps(state).encode()


CASES = {
    "fast path, nothing to do": ("cpu", [], None),
    "full path, nothing to do": ("privileged-no-allocation", ["--config", "{settings}"], None),
    "full path, apply fails (no such pid)": ("slice-privileged", ["--config", "{settings}"], None),
    "bad state on stdin": ("cpu", ["--config", "{settings}"], b"{not json"),
    "unknown stage": ("cpu", ["someday"], None),
    "missing settings file": ("slice-privileged", ["--config", "{missing}"], None),
}


@pytest.mark.parametrize("name", CASES)
def test_os_exit_run_matches_a_normal_exit(name: str, tmp_path: Path) -> None:
    example, extra, stdin = CASES[name]
    log = tmp_path / "hook.log"
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"log_file: {log}\ncache_dir: {tmp_path / 'cache'}\n")
    args = [a.format(settings=settings, missing=tmp_path / "nope.yaml") for a in extra]
    args += ["--inventory", str(EXAMPLES / "node" / "inventory.json")]
    args += ["--cdi-spec-dir", str(EXAMPLES / "node" / "cdi"), "--driver-root", str(tmp_path / "root")]
    data = stdin if stdin is not None else _state(EXAMPLES / example)
    fast = _run("exit", args, data, log)
    normal = _run("normal", args, data, log)
    assert fast == normal
    assert fast[0] != 0 or name.endswith("nothing to do") or name == "unknown stage"


def test_the_cases_reach_stderr_and_the_log() -> None:
    """The table is not vacuous: some cases fail with a message, some write the log (checked live)."""
    assert any(stdin is not None for _e, _a, stdin in CASES.values())
    assert any("{settings}" in a for _e, args, _s in CASES.values() for a in args)


def test_run_falls_back_to_a_normal_exit_when_a_flush_fails(tmp_path: Path) -> None:
    """A flush that fails: ``run`` leaves it to ``sys.exit``, which reports it as any Python does (120)."""
    code = (
        "import sys, os\n"
        "import hook.entry as e\n"
        "e.main = lambda argv=None: 7\n"
        "class Broken:\n"
        "    def flush(self): raise OSError('EPIPE')\n"
        "    def write(self, s): return len(s)\n"
        "sys.stdout = Broken()\n"
        "os._exit = lambda c: (_ for _ in ()).throw(AssertionError('os._exit reached'))\n"
        "e.run()\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-I", "-c", code, "prestart"]
    proc = subprocess.run(cmd, capture_output=True, env=env, timeout=30)
    assert proc.returncode == 120, proc.stderr  # what sys.exit(7) gives when stdout cannot be flushed
    assert b"os._exit reached" not in proc.stderr


def test_a_live_run_skips_interpreter_teardown_and_the_cli_does_not() -> None:
    """``run`` ends a live run with os._exit (atexit handlers never run); the CLI exits normally."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stdout.write('torn down\\n'))\n"
        "from hook.entry import run\n"
        "run()\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    py = [sys.executable, "-I", "-c", code]
    live = subprocess.run([*py, "poststop"], capture_output=True, env=env, timeout=30)
    cli = subprocess.run([*py, "--help"], capture_output=True, env=env, timeout=30)
    assert (live.returncode, live.stdout) == (0, b"")
    assert cli.returncode == 0 and cli.stdout.endswith(b"torn down\n")
