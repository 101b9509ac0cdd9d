"""Issue 21 item 6: the runtime wrapper fails closed on what it cannot parse.

Same kit as tests/test_runtime_wrapper.py (the wrapper beside a ``hook`` that is the real console
script, a fake "real runtime" that records its argv): every spelling of the bundle option is
decided where the runtime will read it (a privileged decoy config in the working directory must
stay untouched), ``restore`` is decided, and a config that cannot be found or read, a command line
no grammar reads for sure, a decision past its bound and a FIFO at the settings path all end
without the runtime running, or without hanging. Real runc and crun: tests/test_runtimeargs.py
(their own readings) and tests/live/test_spec_level.py (containers through the wrapper).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.marker import ANNOTATION
from hook.routes import act, wrapper
from tests.bundles import EXAMPLES
from tests.test_runtime_wrapper import IN_NS, kit, put, saw, wrap  # noqa: F401 - kit is a fixture

PRIVILEGED = (EXAMPLES / "slice-privileged" / "config.json").read_bytes()


@pytest.fixture
def decoy(kit: dict[str, Any]) -> Path:  # noqa: F811
    """A working directory holding a privileged config.json of its own: the fallback the old
    wrapper decided on when it did not understand the bundle option."""
    d = kit["tmp"] / "cwd"
    d.mkdir()
    (d / "config.json").write_bytes(PRIVILEGED)
    return d


def _decided(bundle: Path) -> bool:
    return (bundle / "config.json.orig").read_bytes() == PRIVILEGED and ANNOTATION in json.loads(
        (bundle / "config.json").read_text()
    ).get("annotations", {})


@pytest.mark.parametrize(
    "form",
    [
        ["create", "--b", "{b}", "id"],
        ["create", "--b={b}", "id"],
        ["create", "-b", "{b}", "--", "id"],
        ["--", "run", "-d", "--bundle={b}", "id"],
        ["--root", "/r", "--log=/l", "run", "--bundle", "{b}", "id"],
        ["--systemd-cgroup", "create", "--bundle", "{b}", "--pid-file", "/p", "id"],
        ["restore", "--image-path", "/img", "--bundle", "{b}", "id"],
    ],
    ids=lambda f: " ".join(f),
)
def test_every_spelling_all_runtimes_read_decides_the_config_they_read(
    kit: dict[str, Any],  # noqa: F811
    decoy: Path,
    form: list[str],
) -> None:
    put(kit, "slice-privileged")
    args = [a.replace("{b}", str(kit["bundle"])) for a in form]
    res = wrap(kit, *args, cwd=decoy)
    assert res.returncode == 0, res.stderr
    assert saw(kit)["argv"] == args  # the runtime got the engine's arguments unchanged
    assert _decided(kit["bundle"])
    assert (decoy / "config.json").read_bytes() == PRIVILEGED and not (decoy / "config.json.orig").exists()
    assert sorted(p.name for p in kit["bundle"].iterdir()) == ["config.json", "config.json.orig", "rootfs"]


@pytest.mark.parametrize(
    "form",
    [
        ["create", "-bundle", "{b}", "id"],
        ["create", "-bundle={b}", "id"],
        ["create", "-b{b}", "id"],
        ["create", "--bun={b}", "id"],
        ["create", "--bund", "{b}", "id"],
        ["create", "id", "--bundle", "{b}"],
        ["run", "-db{b}", "id"],
        ["-root", "/r", "-log=/l", "run", "-bundle", "{b}", "id"],
        ["restore", "-d", "-b={b}", "id"],
    ],
    ids=lambda f: " ".join(f),
)
def test_a_spelling_one_runtime_rejects_touches_no_config(
    kit: dict[str, Any],  # noqa: F811
    decoy: Path,
    form: list[str],
) -> None:
    """Issue 28 item 6: a line runc or crun rejects (``-bX`` is crun's; ``-bundle X`` runc's) may
    be the real runtime's, which would not run it: the wrapper refuses and writes nothing, in the
    bundle or in the working directory."""
    put(kit, "slice-privileged")
    res = wrap(kit, *[a.replace("{b}", str(kit["bundle"])) for a in form], cwd=decoy)
    _refused(kit, res, "cannot tell which config")
    for d in (kit["bundle"], decoy):
        assert (d / "config.json").read_bytes() == PRIVILEGED and not (d / "config.json.orig").exists()


@pytest.mark.parametrize(
    "form",
    [["--cgroup-manager=bogus", "create", "id"], ["--log-format=xml", "create", "id"],
     ["--log-level=loud", "run", "id"], ["create", "a/b"]],
    ids=lambda f: " ".join(f),
)  # fmt: skip
def test_a_line_both_runtimes_reject_leaves_the_working_directory_alone(
    kit: dict[str, Any],  # noqa: F811
    decoy: Path,
    form: list[str],
) -> None:
    """Issue 28 item 6: runc and crun both reject these (runc: an unknown flag, ``invalid
    log-format``, ``invalid id format``; crun: ``unknown cgroup manager specified``, ``unknown log
    format type``, ``unknown verbosity``), yet the wrapper read them as a create from the working
    directory and rewrote its config.json. Now: refused, nothing written, the runtime never runs."""
    res = wrap(kit, *form, cwd=decoy)
    _refused(kit, res, "cannot tell which config")
    assert (decoy / "config.json").read_bytes() == PRIVILEGED and not (decoy / "config.json.orig").exists()


def test_a_symlinked_config_is_followed_as_the_runtime_follows_it(kit: dict[str, Any]) -> None:  # noqa: F811
    real = kit["tmp"] / "elsewhere.json"
    real.write_bytes(PRIVILEGED)
    (kit["bundle"] / "config.json").symlink_to(real)
    assert wrap(kit, "create", "--bundle", str(kit["bundle"]), "id").returncode == 0
    assert (kit["bundle"] / "config.json.orig").is_symlink() and real.read_bytes() == PRIVILEGED
    assert ANNOTATION in json.loads((kit["bundle"] / "config.json").read_text())["annotations"]


def _refused(k: dict[str, Any], res: subprocess.CompletedProcess[str], why: str) -> None:
    assert res.returncode == 1, res.stderr
    assert len(res.stderr.splitlines()) == 1 and why in res.stderr, res.stderr
    assert res.stderr.startswith("oci-device-hook runtime: ") and res.stderr.rstrip().endswith("refused")
    assert not k["record"].exists()  # the runtime never ran


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda c: None, "No such file or directory"),
        (lambda c: os.mkfifo(c), "not a regular file"),
        (lambda c: c.mkdir(), "not a regular file"),
        (lambda c: c.symlink_to(c.parent / "nowhere"), "No such file or directory"),
    ],
    ids=["missing", "fifo", "directory", "dangling-symlink"],
)
def test_a_config_that_cannot_be_read_as_a_file_is_refused(
    kit: dict[str, Any],  # noqa: F811
    make: Any,
    why: str,
) -> None:
    make(kit["bundle"] / "config.json")
    start = time.monotonic()
    res = wrap(kit, "create", "--bundle", str(kit["bundle"]), "id")
    assert time.monotonic() - start < 30  # a FIFO is never opened for a blocking read
    _refused(kit, res, why)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["create", "--frobnicate", "-b", "{b}", "id"], "no runtime accepts it"),
        (["create", "-b", "{b}"], "no runtime accepts it"),
        (["create", "-f", "other.json", "-b", "{b}", "id"], "flag provided but not defined: -f"),
    ],
    ids=["unknown-option", "no-id", "crun-config"],
)
def test_a_command_line_no_grammar_reads_for_sure_is_refused(
    kit: dict[str, Any],  # noqa: F811
    args: list[str],
    why: str,
) -> None:
    put(kit, "slice-privileged")
    _refused(kit, wrap(kit, *[a.replace("{b}", str(kit["bundle"])) for a in args]), why)
    assert (kit["bundle"] / "config.json").read_bytes() == PRIVILEGED


def test_the_refusal_reaches_the_runtime_log(kit: dict[str, Any]) -> None:  # noqa: F811
    log = kit["tmp"] / "runc-log.json"
    args = ["--log", str(log), "--log-format", "json", "create", "--bundle", str(kit["bundle"]), "id"]
    _refused(kit, wrap(kit, *args), "No such file or directory")
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and "config.json: No such file or directory" in entry["msg"]


def _slow_hook(k: dict[str, Any], seconds: float) -> None:
    """``hook`` whose full decision sleeps first: what a decision stuck on a slow file looks like."""
    code = (
        "import sys, time\n"
        "import hook.routes.precreate as p\n"
        "real = p.decide_spec\n"
        f"p.decide_spec = lambda *a: (time.sleep({seconds}), real(*a))[1]\n"
        "from hook.entry import run\n"
        'sys.argv = ["hook", *sys.argv[1:]]\n'
        "run()\n"
    )
    hook = k["wrapper"].parent / "hook"
    hook.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{code}' \"$@\"\n")


def test_the_decision_has_a_bounded_time(kit: dict[str, Any]) -> None:  # noqa: F811
    _slow_hook(kit, 60)
    put(kit, "slice-privileged")
    start = time.monotonic()
    res = wrap(kit, "create", "--bundle", str(kit["bundle"]), "id", env={wrapper.TIMEOUT_ENV: "2"})
    assert time.monotonic() - start < 20
    _refused(kit, res, "no decision within 2 s")
    assert (kit["bundle"] / "config.json").read_bytes() == PRIVILEGED
    assert sorted(p.name for p in kit["bundle"].iterdir()) == ["config.json", "rootfs"]


def test_sigkill_at_any_moment_leaves_no_temp_file(kit: dict[str, Any]) -> None:  # noqa: F811
    """The engine kills a create it gave up on: whenever that happens, the bundle holds only the
    original, the decided config or no config at all, never a stray file, and no runtime starts."""
    _slow_hook(kit, 0.3)
    env = {**os.environ, "OCI_DEVICE_HOOK_CONFIG": str(kit["settings"])}
    saw_config = kit["tmp"] / "runtime-saw-config"
    kit["fake"].write_text(  # one process (exec): killed with the wrapper, never later
        f"#!/bin/sh\nexec cp {kit['bundle']}/config.json {saw_config}\n"
    )
    delays = [0.05 * i for i in range(24)]
    outcomes = set()
    for delay in delays:
        put(kit, "slice-privileged")
        (kit["bundle"] / "config.json.orig").unlink(missing_ok=True)
        saw_config.unlink(missing_ok=True)
        cmd = [*IN_NS, str(kit["wrapper"]), "create", "--bundle", str(kit["bundle"]), "id"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)  # unshare exec'd sh, sh exec'd the hook: one process
        proc.wait()
        names = sorted(p.name for p in kit["bundle"].iterdir())
        assert set(names) <= {"config.json", "config.json.orig", "rootfs"}, (delay, names)
        if "config.json" in names:
            data = (kit["bundle"] / "config.json").read_bytes()
            decided = data != PRIVILEGED
            if decided:
                assert ANNOTATION in json.loads(data)["annotations"], delay  # whole, never half
            outcomes.add("decided" if decided else "original")
        else:
            outcomes.add("none")
        if saw_config.exists():  # the runtime started: only ever on the decided config
            assert ANNOTATION in json.loads(saw_config.read_text())["annotations"], delay
    assert "original" in outcomes  # some kills landed before the decision was written


@pytest.mark.parametrize("step", range(6))
def test_replace_interrupted_at_each_step_leaves_no_stray_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    """``wrapper._replace`` stopped before its n-th file-system call (as a SIGKILL would stop it)."""
    cfg = tmp_path / "config.json"
    cfg.write_bytes(b'{"old": 1}\n')
    calls = {"n": 0}

    def stop(real: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            calls["n"] += 1
            if calls["n"] > step:
                raise KeyboardInterrupt  # stands in for the kill
            return real(*a, **kw)

        return call

    for name in ("link", "unlink", "write"):
        monkeypatch.setattr(os, name, stop(getattr(os, name)))  # _replace imports os itself
    with contextlib.suppress(KeyboardInterrupt):
        wrapper._replace(str(cfg), b'{"new": 2}\n')
    monkeypatch.undo()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert set(names) <= {"config.json", "config.json.orig"}, names
    if "config.json" in names:
        assert cfg.read_bytes() in (b'{"old": 1}\n', b'{"new": 2}\n')
    if "config.json.orig" in names:
        assert (tmp_path / "config.json.orig").read_bytes() == b'{"old": 1}\n'


@pytest.mark.parametrize("sub", ["state", "kill", "delete", "start"])
def test_a_fifo_at_the_settings_path_never_hangs_the_pass_through(kit: dict[str, Any], sub: str) -> None:  # noqa: F811
    kit["settings"].unlink()
    os.mkfifo(kit["settings"])
    start = time.monotonic()
    res = wrap(kit, sub, "id")
    assert time.monotonic() - start < 30
    assert res.returncode == 1 and "not a readable regular file" in res.stderr
    assert not kit["record"].exists()


def test_the_wrapper_names_precreates_environment() -> None:
    """hook.routes.wrapper keeps its own copy of the names the decision reads (``hook.routes.act``'s:
    precreate and the decider's request read them there)."""
    seen_and_id = (act.RUNTIME_SEEN_ENV, act.CONTAINER_ID_ENV)
    assert seen_and_id == (wrapper.RUNTIME_SEEN_ENV, wrapper.CONTAINER_ID_ENV)
    assert (wrapper.RUNTIME_LOG_ENV, wrapper.RUNTIME_LOG_FORMAT_ENV) == (
        act.RUNTIME_LOG_ENV,
        act.RUNTIME_LOG_FORMAT_ENV,
    )
