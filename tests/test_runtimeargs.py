"""Issue 21 item 6: the runtime wrapper reads a command line as runc and crun read it.

The readers are pure (hook/routes/runtimeargs.py). The differential tests run the real runc and crun
installed here under ``strace`` on the same command lines, with bundles whose config.json is not
valid JSON (so nothing is ever created), and compare the config file each one opened with what
the reader for that runtime says; ``creates`` must name that file or refuse.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hook.routes import runtimeargs
from hook.routes.runtimeargs import (
    ArgsError,
    Creates,
    creates,
    read_crun,
    read_crun_1_8,
    read_runc_1_1,
    read_runc_1_2,
    readings,
)


def cfg(args: list[str], dirs: tuple[str, ...] = ("A", "B", ".")) -> str | None:
    found = creates(args, lambda d: d in dirs)
    return found.config_path if found else None


RUNC_SPELLINGS = [
    ["create", "--bundle", "A", "id"], ["create", "-bundle", "A", "id"], ["create", "-bundle=A", "id"],
    ["create", "--bundle=A", "id"], ["create", "--b", "A", "id"], ["create", "-b", "A", "id"],
    ["create", "-b=A", "id"], ["create", "--b=A", "id"], ["create", "id", "--bundle", "A"],
    ["create", "id", "-b=A"], ["run", "-d", "-b", "A", "id"], ["run", "--detach", "--bundle=A", "id"],
    ["restore", "--detach", "--image-path", "/i", "-bundle", "A", "id"],
    ["--root", "/r", "--log", "/l", "--log-format", "json", "--systemd-cgroup",
     "create", "--bundle", "A", "id"],
    ["-root=/r", "-log", "/l", "create", "-b", "A", "id"], ["--", "create", "-b", "A", "id"],
    ["create", "--bundle", "B", "--bundle", "A", "id"], ["create", "-b", "A", "--", "id"],
]  # fmt: skip
CRUN_SPELLINGS = [
    ["create", "-bA", "id"], ["create", "--bun=A", "id"], ["create", "--bund", "A", "id"],
    ["create", "--bu=A", "id"], ["run", "-dbA", "id"], ["run", "-d", "-bA", "id"],
    ["--ro", "/r", "create", "--bundle", "A", "id"],
    ["--root=/r", "--cgroup-manager", "cgroupfs", "run", "-bA", "id"],
    ["create", "-f", "config.json", "-b", "A", "id"], ["create", "--no-piv", "-b", "A", "id"],
]  # fmt: skip


def _reads(reader: Callable[[list[str]], Creates | None], args: list[str]) -> str | None:
    try:
        found = reader(args)
    except ArgsError:
        return None
    return found.config_path if found else None


def _every_runtime_reads(args: list[str]) -> bool:
    return all(_reads(reader, args) == "A/config.json" for _, reader in runtimeargs.READERS)


AGREED = [a for a in RUNC_SPELLINGS + CRUN_SPELLINGS if _every_runtime_reads(a)]
ONE_RUNTIME = [a for a in RUNC_SPELLINGS + CRUN_SPELLINGS if not _every_runtime_reads(a)]


@pytest.mark.parametrize("args", AGREED, ids=" ".join)
def test_every_spelling_all_runtimes_read_names_its_config(args: list[str]) -> None:
    assert cfg(args) == "A/config.json"


@pytest.mark.parametrize("args", ONE_RUNTIME, ids=" ".join)
def test_a_spelling_only_some_runtimes_read_is_refused(args: list[str]) -> None:
    """Issue 28 item 6: the wrapper cannot know which runtime it fronts, so a line one of them
    rejects (``-bA`` is crun's, ``-bundle=A`` runc's) is one it cannot decide for sure: refused,
    and nothing is written. Each reader still reads its own runtime's spelling."""
    assert any(_reads(reader, args) == "A/config.json" for _, reader in runtimeargs.READERS)
    with pytest.raises(ArgsError, match="not every runtime would create a container from it"):
        cfg(args)


def test_engines_command_lines_are_read_by_every_runtime() -> None:
    """What containerd (go-runc) and CRI-O or podman (conmon) pass reads the same for all four."""
    containerd = ["--root", "/run/containerd/runc/k8s.io", "--log", "/l/log.json", "--log-format", "json",
                  "--systemd-cgroup", "create", "--bundle", "A", "--pid-file", "/l/init.pid",
                  "--no-pivot", "--no-new-keyring", "--console-socket", "/s", "0123abcd"]
    conmon = ["--systemd-cgroup", "--root=/run/runc", "create", "--bundle", "A", "--pid-file", "/p", "c1.2-x"]
    for args in (containerd, conmon):
        found = creates(args, lambda d: d == "A")
        assert found is not None and (found.config_path, found.cgroup_manager) == ("A/config.json", "systemd")
    found = creates(["create", "--bundle", "A", "id"], lambda d: d == "A")
    assert found is not None and found.cgroup_manager == "cgroupfs"


# Issue 28 item 6: lines both runtimes reject before reading any config. The wrapper used to take
# each for a create from the working directory's config.json (a reading took the option's value
# without checking it as the runtime does) and rewrote that file.
BOTH_REJECT = [
    ["--cgroup-manager=bogus", "create", "id"], ["--log-format=xml", "create", "id"],
    ["--log-level=bogus", "create", "id"], ["--log-format=", "create", "id"],
]  # fmt: skip
# ids runc refuses (validateID) after it has read config.json, and crun accepts
BAD_IDS = [["create", "a/b"], ["create", ".."], ["create", "a b"]]


@pytest.mark.parametrize("args", BOTH_REJECT + BAD_IDS, ids=" ".join)
def test_a_line_the_runtimes_reject_names_no_config(args: list[str]) -> None:
    with pytest.raises(ArgsError):
        cfg(args)


def test_option_values_are_checked_as_each_runtime_checks_them() -> None:
    with pytest.raises(ArgsError, match="unknown cgroup manager"):
        read_crun(["--cgroup-manager=bogus", "create", "id"])
    with pytest.raises(ArgsError, match="unknown verbosity"):
        read_crun(["--log-level=loud", "create", "id"])
    with pytest.raises(ArgsError, match="unknown log format"):
        read_crun_1_8(["--log-format=", "create", "id"])
    assert read_runc_1_1(["--log-format=", "create", "id"]) is not None  # runc: "" is the default
    for reader in (read_runc_1_1, read_runc_1_2):
        with pytest.raises(ArgsError, match="invalid log-format"):
            reader(["--log-format=xml", "create", "id"])
        with pytest.raises(ArgsError, match="invalid id format"):
            reader(["create", "a b"])
    assert read_runc_1_1(["create", "a,b"]) is not None  # 1.1's pattern takes a comma
    with pytest.raises(ArgsError, match="invalid id format"):
        read_runc_1_2(["create", "a,b"])
    assert read_crun(["--version", "--cgroup-manager=x", "create", "id"]) is None  # argp exits first
    with pytest.raises(ArgsError, match="unknown cgroup manager"):
        read_crun(["--cgroup-manager=x", "--version", "create", "id"])
    sd = read_crun(["--systemd-cgroup", "--cgroup-manager", "cgroupfs", "create", "id"])
    assert sd is not None and sd.cgroup_manager == "cgroupfs"  # the last one wins, in order
    sd = read_crun(["--cgroup-manager", "cgroupfs", "--systemd-cgroup", "create", "id"])
    assert sd is not None and sd.cgroup_manager == "systemd"


def test_the_readers_apart() -> None:
    assert read_runc_1_1(["create", "-bundle=A", "id"]) == Creates(command="create", bundle="A", ident="id")
    assert read_crun(["create", "-bundle=A", "id"]) == Creates(command="create", bundle="undle=A", ident="id")
    assert read_crun(["create", "-b=A", "id"]) == Creates(command="create", bundle="=A", ident="id")
    with pytest.raises(ArgsError, match="not defined: -bA"):
        read_runc_1_1(["create", "-bA", "id"])
    with pytest.raises(ArgsError, match="ambiguous"):
        read_crun(["create", "--c=x", "-b", "A", "id"])  # config or console-socket
    with pytest.raises(ArgsError, match="ambiguous"):
        read_crun(["--ro", "/r", "create", "-b", "A", "id"])  # root or rootless
    assert read_crun_1_8(["--ro", "/r", "create", "-b", "A", "id"]) is not None  # rootless was root's alias
    with pytest.raises(ArgsError, match=r"maximum|requires"):
        read_crun(["create", "id", "--bundle", "A"])  # argp stops at the id
    # v1.22.1 moves every dash argument (and the next non-dash one) before the id, so does v1.22.14
    # for the command's own flags: both read a bundle given after the id
    for reader in (read_runc_1_1, read_runc_1_2):
        assert (reader(["create", "id", "-b", "A"]) or Creates(command="", bundle="")).bundle == "A"
        with pytest.raises(ArgsError, match="not defined: -bogus"):
            reader(["create", "--bogus", "id", "-b", "A"])
    assert read_runc_1_2(["create", "--pidfd-socket", "/s", "-b", "A", "id"]) is not None
    with pytest.raises(ArgsError):
        read_runc_1_1(["create", "--pidfd-socket", "/s", "-b", "A", "id"])
    logs = read_runc_1_1(["--log", "/l", "--log-format=json", "create", "id"])
    assert logs is not None and (logs.log, logs.log_format, logs.bundle) == ("/l", "json", "")


@pytest.mark.parametrize(
    "args",
    [["state", "id"], ["kill", "id", "9"], ["delete", "-f", "id"], ["kill", "create", "9"],
     ["exec", "run", "sh"], ["--log", "create", "state", "id"], ["--help", "create", "-b", "A", "id"],
     ["create", "--help", "-b", "A", "id"], ["-v", "run", "-b", "A", "id"]],
    ids=" ".join,
)  # fmt: skip
def test_command_lines_that_create_nothing_pass(args: list[str]) -> None:
    assert cfg(args) is None


# runc's bool flags (Go's flag package) take ``=false`` as false: ``--help=false`` or ``-v=0`` is
# no help and no version, the command runs; crun's argp refuses a value on its help/version options
GO_FALSE_SPELLINGS = [
    ["--help=false", "create", "-b", "A", "id"], ["-help=0", "create", "-b", "A", "id"],
    ["-h=f", "create", "-b", "A", "id"], ["--version=FALSE", "create", "-b", "A", "id"],
    ["-v=False", "run", "-b", "A", "id"], ["create", "--help=false", "-b", "A", "id"],
    ["create", "-b", "A", "-h=F", "id"], ["run", "-help=0", "--bundle=A", "id"],
    ["--debug=false", "--systemd-cgroup=0", "create", "-b", "A", "id"],
]  # fmt: skip
GO_TRUE_SPELLINGS = [
    ["--help=true", "create", "-b", "A", "id"], ["-v=1", "create", "-b", "A", "id"],
    ["create", "--help=T", "-b", "A", "id"], ["run", "-h=TRUE", "-b", "A", "id"],
]  # fmt: skip


@pytest.mark.parametrize("args", GO_FALSE_SPELLINGS, ids=" ".join)
def test_a_runc_bool_flag_set_to_false_is_off_and_the_create_is_read(args: list[str]) -> None:
    """Issue 31: ``runc --help=false create ...`` creates the container (runc reads the bool flag
    as Go's ``strconv.ParseBool`` does), so the wrapper must never pass it through as a help
    request; crun refuses the line, and since issue 28 item 6 a line one runtime refuses is refused
    (the runtime never runs), so the container is never started undecided."""
    found = read_runc_1_1(args)
    assert found == read_runc_1_2(args) and found is not None and found.config_path == "A/config.json"
    with pytest.raises(ArgsError, match=r"not every runtime would create|would not create a container"):
        cfg(args)


@pytest.mark.parametrize("args", GO_TRUE_SPELLINGS, ids=" ".join)
def test_a_runc_bool_flag_set_to_true_prints_and_creates_nothing(args: list[str]) -> None:
    assert cfg(args) is None


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["create", "id", "-x"], "no runtime accepts it"),
        (["create"], "no runtime accepts it"),
        (["create", "--frobnicate", "-b", "A", "id"], "no runtime accepts it"),
        (["create", "-f", "other.json", "-b", "A", "id"], "runc 1.1: flag provided but not defined: -f"),
        (["run", "--config=/x.json", "id"], "runc 1.1: flag provided but not defined: -config"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_what_no_grammar_reads_for_sure_is_refused(args: list[str], why: str) -> None:
    with pytest.raises(ArgsError, match=re.escape(why)):
        cfg(args)


def test_readings_that_differ_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """runc reads ``-bundle=A`` as bundle A, crun as bundle ``undle=A``: with both there, it cannot
    tell; with one there, crun would fail, so it is refused all the same."""
    with pytest.raises(ArgsError, match="different configs"):
        cfg(["create", "-bundle=A", "id"], ("A", "undle=A"))
    with pytest.raises(ArgsError, match="not every runtime"):
        cfg(["create", "-bundle=A", "id"])
    other = Creates(command="create", bundle="B", ident="id")
    monkeypatch.setattr(readings, "READERS", (*readings.READERS, ("other", lambda _args: other)))
    with pytest.raises(ArgsError, match=re.escape("different configs: A/config.json, B/config.json")):
        cfg(["create", "-b", "A", "id"])


def test_a_reading_that_creates_against_one_that_does_not_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readings, "READERS", (*readings.READERS, ("never", lambda _args: None)))
    with pytest.raises(ArgsError, match="never would not create"):
        cfg(["create", "-b", "A", "id"])


# --- differential: the real runtimes -----------------------------------------------------------------

STRACE = shutil.which("strace")
# the readers of the versions installed here (Debian 12: runc 1.1.5, crun 1.8.1)
RUNTIMES = {"runc": (shutil.which("runc"), read_runc_1_1), "crun": (shutil.which("crun"), read_crun_1_8)}
PROBES = RUNC_SPELLINGS + CRUN_SPELLINGS + [
    ["create", "-bundle", "A", "id"], ["create", "--no-pivot", "id", "--bundle", "A"],
    ["create", "-b=", "id"], ["create", "--bundle=", "id"], ["create", "-d", "id"],
    ["create", "-bundle=A", "id"], ["create", "-b=A", "id"],
    ["create", "--pid-file", "--bundle", "A", "id"], ["create", "x", "-b", "A", "-b", "B"],
    ["create", "--console-socket", "--bundle", "A", "id"], ["--log", "create", "run", "-b", "B", "id"],
    *GO_FALSE_SPELLINGS, *GO_TRUE_SPELLINGS,
    *BOTH_REJECT, ["--systemd-cgroup", "create", "--bundle", "A", "id"], ["create", "-b", "A", "--", "id"],
]  # fmt: skip


def _opened(runtime: str, args: list[str], cwd: Path) -> str | None:
    """The config.json the runtime opened (relative to ``cwd``), from strace; None when it opened none."""
    assert STRACE is not None
    out = cwd / "trace"
    trace = [STRACE, "-f", "-qq", "-e", "trace=chdir,openat", "-o", str(out)]
    cmd = [*trace, runtime, "--root", str(cwd / "state"), *args]
    subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    where = ""
    for line in out.read_text().splitlines():
        m = re.search(r'chdir\("([^"]*)"', line)  # with -f a call may be split: "<unfinished ...>"
        if m and "= -1" not in line:
            where = m.group(1)
        m = re.search(r'openat\(AT_FDCWD, "([^"]*config\.json)"', line)
        if m:
            path = m.group(1) if m.group(1).startswith("/") else f"{where or '.'}/{m.group(1)}"
            return path.replace(f"{cwd}/", "").replace(str(cwd), ".")
    return None


@pytest.mark.skipif(STRACE is None, reason="strace not installed (apt-get install strace)")
@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_the_readers_agree_with_the_real_runtimes(runtime: str, tmp_path: Path) -> None:
    binary, reader = RUNTIMES[runtime]
    assert binary is not None, f"{runtime} is installed where the suite runs (apt-get install {runtime})"
    for d in ("A", "B"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text("{" + d)  # never valid: nothing is created
    (tmp_path / "config.json").write_text("{.")
    for args in PROBES:
        if runtime == "crun" and args[0] == "restore":
            continue  # crun is built without CRIU here
        opened = _opened(binary, args, tmp_path)
        try:
            found = reader(args)
            # a bundle that is not there: the runtime's chdir or realpath fails (creates() checks it)
            said = found.config_path if found and (tmp_path / (found.bundle or ".")).is_dir() else None
        except ArgsError:
            said = None
        assert said == opened, f"{runtime} {' '.join(args)}: runtime opened {opened}, reader says {said}"
        if opened is not None:
            dirs = ("A", "B", ".")
            with contextlib.suppress(ArgsError):  # refusing is always allowed
                assert cfg(args, dirs) == opened, args


@pytest.mark.parametrize("reader", [read_runc_1_1, read_runc_1_2, read_crun, read_crun_1_8])
def test_a_double_dash_before_the_id_ends_the_flags_once(reader: Any) -> None:
    """Issue 31 (s142737-159): ``runc create -b A -- id`` creates ``id`` from A (runc 1.1.5 here
    opens A/config.json: the real-runtime probes below); urfave/cli 1.22.14 keeps the ``--`` once
    when it moves the flags, so runc 1.2's reading is the same, never a second argument ``--``."""
    found = reader(["create", "-b", "A", "--", "id"])
    assert found is not None and (found.bundle, found.ident) == ("A", "id")
