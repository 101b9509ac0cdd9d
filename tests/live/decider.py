"""Live-test kit for the warm decider: run a container with ``hook serve`` up in the same private view.

Rule: the decider runs inside the private mount namespace ``livekit.private_host`` builds, so its
socket is under that namespace's throwaway ``/run`` (never the host's), and it is stopped (and
its status read through ``hook.routes.client``) before the namespace goes. ``serve_wrap`` may put a
command (``strace``) before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.live.livekit import RUNC, Bundle, RunResult, _quote, private_host, runc_command

SOCKET = "/run/oci-device-hook/decider.sock"
WAIT = f"i=0; while [ ! -S {SOCKET} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done"
STATUS = (
    "import json, sys; from hook.routes import client; s = client.status(); "
    "print(json.dumps(s if isinstance(s, dict) else {'error': s}))"
)


def with_decider(
    cmd: Sequence[str],
    out: Path,
    *,
    serve_wrap: Sequence[str] = (),
    extra: Sequence[str] = (),
    serve_args: Sequence[str] = (),
) -> list[str]:
    """``cmd`` run while a decider serves (with ``serve_args``: the options of the hooks it is to
    serve); its status JSON goes to ``out`` (``out``.err: its stderr)."""
    serve = " ".join(map(_quote, [*serve_wrap, sys.executable, "-I", "-m", "hook", "serve", *serve_args]))
    status = " ".join(map(_quote, [sys.executable, "-I", "-c", STATUS]))
    script = (
        f"{serve} >/dev/null 2>{_quote(str(out))}.err & d=$!\n"
        f"{WAIT}\n"
        + "".join(f"{line}\n" for line in extra)
        + '"$@" </dev/null; rc=$?\n'
        f"{status} > {_quote(str(out))}\n"
        # the decider itself too: under strace, $d is strace, which leaves it running when it goes
        f"p=$(sed -n 's/.*\"pid\": \\([0-9]*\\).*/\\1/p' {_quote(str(out))})\n"
        "kill $d $p 2>/dev/null; wait $d\n"
        "exit $rc\n"
    )
    return ["sh", "-c", script, "with-decider", *cmd]


SERVED_OPTIONS = ("--config", "--driver-root", "--cdi-spec-dir", "--inventory")


def serve_args_of(bundle: Bundle) -> list[str]:
    """The options of the bundle's (first) prestart hook: a decider serves only hooks with its own."""
    hooks = bundle.config.get("hooks", {}).get("prestart", [])
    args = list(hooks[0]["args"]) if hooks else []
    out = []
    for i, arg in enumerate(args):
        name = arg.partition("=")[0]
        if name in SERVED_OPTIONS:
            out += [arg] if "=" in arg else [arg, args[i + 1]]
    return out


def run_served(
    bundle: Bundle, out: Path, *, cgroup2: bool = False, serve_wrap: Sequence[str] = (), timeout: float = 90
) -> tuple[RunResult, dict[str, object]]:
    """``runc run`` the bundle with a decider up; the result and the decider's status afterwards.

    The hooks get the client's longest answer wait: on a loaded machine a first decision can take
    longer than the default, and a silent in-process fallback would make the served start unproven.
    """
    state_root = bundle.path / "runc-state"
    for hook in bundle.config.get("hooks", {}).get("prestart", []):
        env = hook.setdefault("env", [])
        if not any(e.startswith("OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS=") for e in env):
            env.append("OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS=5000")
    bundle.write()
    served = with_decider(
        runc_command(bundle, state_root), out, serve_wrap=serve_wrap, serve_args=serve_args_of(bundle)
    )
    cmd = private_host(served, cgroup2=cgroup2)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        res = RunResult(proc.returncode, proc.stdout, proc.stderr)
    finally:
        delete = [RUNC, "--root", str(state_root), "delete", "-f", bundle.id]
        subprocess.run(private_host(delete, cgroup2=cgroup2), capture_output=True, timeout=30)
    try:
        status = json.loads(out.read_text())
    except (OSError, ValueError):
        status = {"error": "no status"}
    return res, status
