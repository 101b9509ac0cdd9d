"""Issue 27's "same bundles, same results" on the spec-level routes: ``hook precreate`` and the
runtime wrapper decide a config with and without a warm decider, and give the same exit status,
stderr, decided config and log record (but the record's ``decider`` field).

Each case runs in one private mount namespace (tmpfs ``/run``, ``/var/log`` and key dir): first
with no decider, then with ``hook serve`` (given the hooks' own options) up; the decider's status
proves it answered. The live route (runc, cgroup v1 and v2) is tests/live/test_decider_live.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import EXAMPLES, NODE_CDI, NODE_INVENTORY, PRIVATE_RUN, settings_file
from tests.hosttree import make_host_tree

pytestmark = pytest.mark.skipif(not PRIVATE_RUN, reason="needs root and unshare (a private /run)")

HOOK = [sys.executable, "-I", "-m", "hook"]
STATUS = (
    "import json; from hook.routes import client; s = client.status(); "
    "print(json.dumps(s if isinstance(s, dict) else {'error': s}))"
)
VOLATILE = ("time", "duration_ms", "decider")

# name: (example, settings, extra hook options)
CASES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "slice": ("slice-privileged", {}, []),
    "mig": ("mig-privileged", {}, []),
    "dra": ("dra-claim-privileged", {}, []),
    "cdi": ("k8s-allocated", {}, []),
    "plain": ("privileged-no-allocation", {}, []),
    "deny": ("slice-privileged", {"privileged_allocation": "reject"}, []),
    "refused": ("mig-privileged", {}, ["--cdi-spec-dir", "/nonexistent-cdi"]),
}


def _q(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def _served(lines: list[str], serve_args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    """``lines`` (shell) in one private view: the first half alone, then with a decider up."""
    sock = "/run/oci-device-hook/decider.sock"
    script = "\n".join(
        [
            "set -u",
            lines[0],
            " ".join(map(_q, [*HOOK, "serve", *serve_args])) + f" 2>{_q(str(out))}.err & d=$!",
            f"i=0; while [ ! -S {sock} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
            lines[1],
            " ".join(map(_q, [sys.executable, "-I", "-c", STATUS])) + f" > {_q(str(out))}",
            "kill $d; wait $d",
        ]
    )
    return subprocess.run([*PRIVATE_RUN, "sh", "-c", script], capture_output=True, text=True, timeout=180)


def _records(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if k not in VOLATILE})
    return out


@pytest.fixture
def node(tmp_path: Path) -> Path:
    root = tmp_path / "driver-root"
    make_host_tree(root, "8x-mig", mknod=False)
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_precreate_decides_the_same_with_the_decider(tmp_path: Path, node: Path, case: str) -> None:
    example, values, extra = CASES[case]
    settings = settings_file(tmp_path, **values)
    args = ["--driver-root", str(node), "--inventory", str(NODE_INVENTORY), "--config", str(settings)]
    args += extra or ["--cdi-spec-dir", str(NODE_CDI)]
    config = EXAMPLES / example / "config.json"

    def run(tag: str) -> str:
        where = _q(str(tmp_path / tag))
        cmd = " ".join(map(_q, [*HOOK, "precreate", *args]))
        return f"{cmd} < {_q(str(config))} > {where}.out 2> {where}.err; echo $? > {where}.rc"

    proc = _served([run("alone"), run("served")], args, tmp_path / "status.json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads((tmp_path / "status.json").read_text())
    assert status.get("requests") == 1, (status, Path(f"{tmp_path}/status.json.err").read_text())
    for part in ("rc", "out", "err"):
        assert (tmp_path / f"alone.{part}").read_text() == (tmp_path / f"served.{part}").read_text(), part
    alone, served = _records(tmp_path / "hook.log")
    assert alone == served
    raw = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert "decider" not in raw[0] and raw[1]["decider"] == "answered"
    assert raw[0]["route"] == raw[1]["route"] == "precreate"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_runtime_wrapper_decides_the_same_with_the_decider(tmp_path: Path, node: Path, case: str) -> None:
    """containerd's route: ``hook runtime-wrapper --config S -- RUNTIME create --bundle B ID`` (the
    runtime here is ``true``: what is compared is what the wrapper leaves in the bundle)."""
    example, values, extra = CASES[case]
    specs = extra[1] if extra else str(NODE_CDI)  # the refused case's missing spec dir
    settings = settings_file(tmp_path, driver_root=str(node), cdi_spec_dirs=[specs], runtime="true", **values)
    args = ["--config", str(settings)]
    bundles = {tag: tmp_path / tag for tag in ("alone", "served")}
    for b in bundles.values():
        (b / "rootfs").mkdir(parents=True)
        shutil.copy2(EXAMPLES / example / "config.json", b / "config.json")

    def run(tag: str) -> str:
        cmd = [*HOOK, "runtime-wrapper", *args, "--", "true", "create", "--bundle", str(bundles[tag]), tag]
        where = _q(str(tmp_path / tag))
        return " ".join(map(_q, cmd)) + f" > {where}.out 2> {where}.err; echo $? > {where}.rc"

    proc = _served([run("alone"), run("served")], args, tmp_path / "status.json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads((tmp_path / "status.json").read_text())
    assert status.get("requests") == 1, (status, Path(f"{tmp_path}/status.json.err").read_text())
    for part in ("rc", "out", "err"):
        assert (tmp_path / f"alone.{part}").read_text() == (tmp_path / f"served.{part}").read_text(), part
    alone, served = (json.loads((b / "config.json").read_bytes()) for b in bundles.values())
    marks = [c.get("annotations", {}).pop("oci-device-hook/decided", "") for c in (alone, served)]
    assert alone == served  # the markers differ: each binds its own container id (alone, served)
    assert len({m[:3] for m in marks}) == 1 and (marks[0] == "" or marks[0] != marks[1]), marks
    records = _records(tmp_path / "hook.log")
    assert len(records) == 2
    for rec in records:  # the container ids differ (alone/served): they are the command line's
        rec.pop("container", None)
    assert records[0] == records[1] and records[0]["route"] == "wrapper"


def test_a_served_spec_level_start_is_the_fast_path_and_the_client(tmp_path: Path, node: Path) -> None:
    """Issue 27 item 4: the wrapper's (and hooks.d precreate's) per-start process stays thin when the
    decider answers: the fast path, the client and the log step; no decision module, no yaml, and
    none of ``json``, ``re``, ``enum``, ``pathlib`` (run as the launcher runs it: ``python3 -ISB``)."""
    import yaml

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "hook").symlink_to(Path(__file__).resolve().parents[1] / "hook")
    (lib / "yaml").symlink_to(Path(yaml.__file__).resolve().parent)
    settings = settings_file(tmp_path)
    args = ["--driver-root", str(node), "--inventory", str(NODE_INVENTORY), "--cdi-spec-dir", str(NODE_CDI)]
    args += ["--config", str(settings)]
    out = tmp_path / "modules.jsonl"
    proc_py = Path(__file__).resolve().parents[1] / "bench" / "hookproc.py"
    run = [sys.executable, "-ISB", str(proc_py), str(lib), str(out), "--", "precreate", *args]
    config = EXAMPLES / "slice-privileged" / "config.json"
    line = " ".join(map(_q, run)) + f" < {_q(str(config))} > /dev/null"
    proc = _served([line, line], args, tmp_path / "status.json")
    assert proc.returncode == 0, proc.stderr
    alone, served = (json.loads(x) for x in out.read_text().splitlines())
    assert alone["rc"] == served["rc"] == 0
    records = [json.loads(x) for x in (tmp_path / "hook.log").read_text().splitlines()]
    assert [r.get("decider") for r in records] == [None, "answered"]
    loaded = set(served["loaded"])
    ours = {m for m in loaded if m.startswith("hook.")}
    assert ours <= {
        "hook.entry", "hook.routes", "hook.routes.fastpath", "hook.sources", "hook.sources.privatefile",
        "hook.sources.nodekey",
        "hook.core", "hook.core.version", "hook.routes.wire", "hook.routes.client", "hook.routes.act",
        "hook.routes.offer", "hook.core.record", "hook.routes.decision", "hook.adapters", "hook.adapters.log",
        "hook.core.escape", "hook.sources.kubelet", "hook.core.kubelet", "hook.sources.kubelet.podid",
        "hook.routes.logrecord",
    }, ours  # fmt: skip
    assert not loaded & {"json", "re", "enum", "pathlib", "yaml", "hashlib", "socket", "typing"}
    assert {"hook.routes.gather", "hook.core.decide"} <= set(alone["loaded"])  # the control
