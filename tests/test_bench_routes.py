"""bench/run's route rows (issue 27): the round-robin, the decider's three states, the targets' arithmetic.

What the published speed table rests on: every variant of a workload sampled the same number of
times with warm-ups dropped and no variant always first; the decider's slot really holds its live
socket, a refusing one or nothing when a sample runs; a warm start counts as served only when the
hook's record says the decider answered; each target is the ratio of the medians it names.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import decider, routes
from bench.routes import Node, Result, Workload
from bench.timing import round_robin


def test_round_robin_samples_every_variant_each_round_drops_warmups_and_rotates() -> None:
    calls: list[str] = []

    def sample(key: str) -> Any:
        def run() -> float:
            calls.append(key)
            return float(len(calls))

        return run

    keys = ["a", "b", "c"]
    times = round_robin({k: sample(k) for k in keys}, rounds=4, warmup=2)
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert min(min(v) for v in times.values()) > 6  # the 6 warm-up samples are not in any median
    firsts = {calls[i] for i in range(0, len(calls), 3)}
    assert firsts == set(keys)  # no variant always runs first


def _node(tmp: Path) -> Node:
    return Node("n", tmp / "s.yaml", tmp / "hook.log")


def _result(tmp: Path, times: dict[str, tuple[float, ...]], served: dict[str, list[str]]) -> Result:
    w = Workload("cdi1", "one GPU", lambda r, c: {}, _node(tmp), "csd", ("wrapper",), nvidia=True)
    return Result(w, times, served)


def test_targets_are_ratios_of_medians_and_say_when_the_decider_did_not_answer(tmp_path: Path) -> None:
    times = {"bare": (0.050,), "nvidia": (0.060,), "wrapper/floor": (0.060, 0.062, 0.061),
             "wrapper/in-process": (0.120,), "wrapper/warm": (0.063, 0.066, 0.990),
             "wrapper/stopped": (0.130,)}
    r = _result(tmp_path, times, {"wrapper/warm": ["answered", "answered", "answered"]})
    got = {t.label.split(":")[-1].strip(): t for t in routes.targets({"cdi1": r}, ())}
    floor = got["x the route's floor"]
    assert floor.measured == pytest.approx(0.066 / 0.061) and floor.passed
    assert got["x NVIDIA's runtime (CDI mode)"].measured == pytest.approx(0.066 / 0.060)
    stopped = got["decider stopped x in-process"]
    assert stopped.measured == pytest.approx(0.130 / 0.120) and not stopped.passed
    assert "decided in-process" not in floor.detail
    r = _result(tmp_path, times, {"wrapper/warm": ["fallback", "answered", "answered"]})
    floor = next(t for t in routes.targets({"cdi1": r}, ()) if t.label.endswith("x the route's floor"))
    assert "2 of 3 answered by the decider" in floor.detail
    r = _result(tmp_path, times, {"wrapper/warm": ["declined", "declined"]})
    floor = next(t for t in routes.targets({"cdi1": r}, ()) if t.label.endswith("x the route's floor"))
    assert "not answered by the decider (declined): decided in-process" in floor.detail


def _connect(path: Path) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return "connected"
    except FileNotFoundError:
        return "absent"
    except ConnectionRefusedError:
        return "refused"
    finally:
        s.close()


def test_the_decider_slot_holds_the_live_socket_a_refusing_one_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SOCKET", "LIVE", "STALE"):
        monkeypatch.setattr(decider, name, tmp_path / getattr(decider, name).name)
    monkeypatch.setattr(decider, "_requests", lambda: 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(decider.SOCKET))
    listener.listen(8)
    decider._stale_socket()
    proc = subprocess.Popen(["sleep", "30"])
    try:
        d = decider.Decider(proc, tmp_path / "hook.log")
        seen = []
        for mode in ("stopped", "in-process", "warm", "in-process", "stopped", "warm", "warm"):
            d.set(mode)
            seen.append(_connect(decider.SOCKET))
        assert seen == ["refused", "absent", "connected", "absent", "refused", "connected", "connected"]
    finally:
        proc.kill()
        proc.wait()
        listener.close()


def test_a_warm_start_is_served_only_when_the_hook_record_says_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "hook.log"
    monkeypatch.setattr(decider, "_requests", lambda: -1)
    d = decider.Decider(subprocess.Popen(["true"]), log)
    d.proc.wait()
    for field in ("answered", "fallback", "untrusted"):
        with open(log, "a") as f:
            f.write(json.dumps({"verdict": "apply", "decider": field}) + "\n")
        d.judge("prestart/warm")
    with open(log, "a") as f:
        f.write(json.dumps({"verdict": "apply"}) + "\n")  # no field, and no decider to count: unknown
    d.judge("prestart/warm")
    assert d.served == {"prestart/warm": ["answered", "fallback", "untrusted", "unknown"]}


def _fake_runtime(tmp: Path) -> Path:
    """A runtime whose container is ``sh -c 'sleep 0.3; touch done'`` started by create (its pid in
    ``--pid-file``), and whose delete says whether that container had exited."""
    script = tmp / "runtime"
    script.write_text(
        "#!/bin/sh\n"
        'prev=; for a in "$@"; do [ "$prev" = --pid-file ] && pidfile=$a; prev=$a; done\n'
        f"cd {tmp}\n"
        'case " $* " in\n'
        "*' create '*) sh -c 'sleep 0.3; touch done' </dev/null >/dev/null 2>&1 & echo $! > \"$pidfile\" ;;\n"
        "*' delete '*) if [ -e done ]; then echo exited >> log; else echo running >> log; fi ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("reaper", [True, False], ids=["subreaper", "not-our-child"])
def test_create_start_delete_waits_for_the_containers_exit_before_delete(
    tmp_path: Path, reaper: bool
) -> None:
    """As containerd's shim: delete only after the container's init has exited (issue 35 item 4).
    As its subreaper the bench reaps it; a container that is not its child is watched in /proc."""
    kit = routes.Kit(
        tmp=tmp_path,
        rootfs=tmp_path,
        launcher=tmp_path / "hook",
        interp="python3",
        runc=str(_fake_runtime(tmp_path)),
        nvidia=None,
        nvidia_env={},
    )
    w = Workload("cdi1", "one GPU", lambda r, c: {}, _node(tmp_path), "csd", ())
    run = routes._sample(kit, w, "bare", {"PATH": "/usr/bin:/bin"})
    routes.subreaper(reaper)
    try:
        assert run() >= 0.25
    finally:
        routes.subreaper(False)
    assert (tmp_path / "log").read_text() == "exited\n"


def test_the_floor_client_speaks_the_wire_and_reads_the_answer(tmp_path: Path) -> None:
    """``install`` checks its MAC against the wire's; the answer's code and decided config are read
    as the decider writes them (``to_wire``), a record with its own "code" and "out" keys or not."""
    from bench import floorclient
    from hook.routes.decision import Spec, to_wire

    script = floorclient.install(tmp_path / "hook", "python3").read_text()
    scope: dict[str, Any] = {}
    exec(script.partition("\n\nargv = ")[0], scope)
    out = b'{"linux": {"devices": [], "x": "a \\"quoted\\" \\u00e9"}}\n'
    for record in ({"verdict": "apply"}, {"code": 9, "out": "not this", "nested": {"out": None}}):
        answer = to_wire(Spec(code=0, out=out, record=record)).decode()
        assert scope["field"](answer, "code") == 0
        assert scope["field"](answer, "out", last=True) == out.decode()
    assert scope["field"](to_wire(Spec(code=3)).decode(), "out", last=True) is None
    state = b'{"ociVersion":"1.0.2","id":"c","status":"creating","bundle":"/b/x y","annotations":{}}'
    assert scope["field"](state.decode(), "bundle") == "/b/x y"
