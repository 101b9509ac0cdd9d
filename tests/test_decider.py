"""The warm decider and the thin client without a container runtime: the wire, the trust checks,
every fallback of issue 23 item 3, and the views kept by file identity (``hook.sources.warm``).

The decider runs in a thread of this process on a socket in ``tmp_path`` (``client.SOCKET_DIR``
is pointed there); misbehaving deciders are small fake servers. A real container start through
the decider (runc, cgroup v1 and v2) is tests/live/test_decider_live.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hook.core.errors import InputError
from hook.routes import client, fastpath, serve
from hook.routes.live import run_live
from hook.sources import settingsfile as settings
from hook.sources import warm
from tests.bundles import PRIVATE_RUN, gen, settings_file, state, write_bundle

NEEDS_DECISION = "privileged-no-allocation"  # decided "none": logged, nothing to apply


@pytest.fixture
def sockdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The decider's socket dir, and the fast-path record (which a live run writes) in tmp_path."""
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setattr(client, "SOCKET_DIR", str(d))
    monkeypatch.setattr(fastpath, "FASTPATH_CACHE", str(d / "fastpath.json"))
    monkeypatch.setattr(settings, "FASTPATH_CACHE", d / "fastpath.json")
    return d


@pytest.fixture
def decider(sockdir: Path) -> Iterator[serve.Decider]:
    d = serve.Decider(str(sockdir))
    d.listen()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    yield d
    d.close()
    t.join(5)


def fake(sockdir: Path, behave: Callable[[socket.socket], None]) -> threading.Thread:
    """A decider that accepts one connection and does ``behave`` with it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sockdir / client.SOCKET_NAME))
    s.listen(4)

    def run() -> None:
        conn, _ = s.accept()
        with conn:
            behave(conn)
        s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def a_container(tmp_path: Path) -> tuple[dict[str, list[str]], bytes, Path]:
    settings = settings_file(tmp_path)
    bundle = write_bundle(tmp_path / "b", gen.bundles()[NEEDS_DECISION])
    inventory = Path(gen.__file__).parent / "node" / "inventory.json"
    opts = {"--config": [str(settings)], "--inventory": [str(inventory)], "--log": [""]}
    return opts, state(bundle, id="ctr-1"), tmp_path / "hook.log"


def log_lines(log: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        line.pop("time", None)
    return lines


# --- served as in-process ---------------------------------------------------------------------


def test_a_served_decision_is_the_in_process_one(tmp_path: Path, decider: serve.Decider) -> None:
    opts, stdin, log = a_container(tmp_path)
    assert run_live(opts, stdin) == 0
    got = client.ask("prestart", opts, stdin, None)
    assert got == (0, b"")
    first, second = log_lines(log)
    assert first == second and first["verdict"] == "none"
    assert decider.status()["requests"] == 1


def test_a_served_error_is_the_in_process_error(tmp_path: Path, decider: serve.Decider, capsys) -> None:
    opts, _, log = a_container(tmp_path)
    stdin = state(tmp_path / "missing-bundle", id="ctr-2")
    rc = run_live(opts, stdin)
    err = capsys.readouterr().err.encode()
    assert rc != 0 and err
    assert client.ask("prestart", opts, stdin, None) == (rc, err)
    first, second = log_lines(log)
    assert first == second and first["verdict"] == "error"


def test_status_counts_requests(tmp_path: Path, decider: serve.Decider) -> None:
    opts, stdin, _ = a_container(tmp_path)
    for _ in range(3):
        assert client.ask("prestart", opts, stdin, None) == (0, b"")
    st = client.status()
    assert isinstance(st, dict)
    assert (st["requests"], st["version"], st["pid"]) == (3, serve.VERSION, os.getpid())
    assert st["uptime_s"] >= 0


def test_the_socket_is_root_only(sockdir: Path, decider: serve.Decider) -> None:
    st = os.lstat(sockdir / client.SOCKET_NAME)
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
    assert os.lstat(sockdir).st_mode & 0o777 == 0o700


def test_a_group_readable_socket_dir_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    with pytest.raises(Exception, match="mode 0700"):
        serve.Decider(str(d)).listen()


# --- the container handed over by pidfd -----------------------------------------------------------


def request(opts: dict[str, list[str]], stdin: bytes) -> bytes:
    head = client.frame(client.REQUEST, client.encode_opts("prestart", opts))
    return head + client.frame(client.STATE, stdin)


def raw_request(stdin: bytes, pidfd: int | None, opts: dict[str, list[str]]) -> tuple[bytes, bytes]:
    """Send a request by hand (as a forging client would); the decider's first frame."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(os.path.join(client.SOCKET_DIR, client.SOCKET_NAME))
    payload = request(opts, stdin)
    fds = [] if pidfd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, pidfd.to_bytes(4, sys.byteorder))]
    s.sendmsg([payload], fds)
    with s:
        return client.read_frame(s)


def test_a_pid_that_is_not_the_pidfds_process_is_declined(tmp_path: Path, decider: serve.Decider) -> None:
    """The state names one process, the pidfd another: declined, never decided (nothing logged)."""
    opts, _, log = a_container(tmp_path)
    other = subprocess.Popen(["sleep", "30"])
    try:
        fd = os.pidfd_open(other.pid)
        stdin = state(tmp_path / "b", id="ctr-1", pid=os.getpid())
        kind, body = raw_request(stdin, fd, opts)
        os.close(fd)
    finally:
        other.kill()
        other.wait()
    assert kind == client.DECLINE
    assert f"pidfd is process {other.pid}, the state says pid {os.getpid()}" in body.decode()
    assert not log.exists()


def test_a_pid_without_a_pidfd_is_declined(tmp_path: Path, decider: serve.Decider) -> None:
    opts, _, log = a_container(tmp_path)
    kind, body = raw_request(state(tmp_path / "b", id="ctr-1", pid=os.getpid()), None, opts)
    assert (kind, body) == (client.DECLINE, b"no pidfd for the state's pid")
    assert not log.exists()


def test_an_fd_that_is_not_a_pidfd_is_declined(tmp_path: Path, decider: serve.Decider) -> None:
    opts, _, _ = a_container(tmp_path)
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        kind, body = raw_request(state(tmp_path / "b", id="ctr-1", pid=os.getpid()), fd, opts)
    finally:
        os.close(fd)
    assert kind == client.DECLINE and b"pidfd is process None" in body


def test_the_client_hands_over_its_pid_by_pidfd(tmp_path: Path, decider: serve.Decider) -> None:
    """With the real client, the state's pid (a live process) passes the pidfd check."""
    opts, _, log = a_container(tmp_path)
    stdin = state(tmp_path / "b", id="ctr-1", pid=os.getpid())
    assert client.ask("prestart", opts, stdin, os.getpid()) == (0, b"")
    assert log_lines(log)[0]["verdict"] == "none"


def test_check_pid_fails_once_the_process_is_gone() -> None:
    child = subprocess.Popen(["true"])
    fd = os.pidfd_open(child.pid)
    conn = socket.socket(socket.AF_UNIX)
    session = serve._Served(conn, serve._Reader(conn, b""), fd)
    session.check_pid(child.pid)  # not reaped yet: still that process
    child.wait()
    with pytest.raises(Exception, match="has exited"):
        session.check_pid(child.pid)
    os.close(fd)


# --- every failure falls back (item 3) --------------------------------------------------------------


def test_no_socket_is_a_silent_fallback(tmp_path: Path, sockdir: Path) -> None:
    opts, stdin, _ = a_container(tmp_path)
    assert client.ask("prestart", opts, stdin, None) == ""


def test_refused(tmp_path: Path, sockdir: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sockdir / client.SOCKET_NAME))  # bound, never listening: a stopped decider's socket
    opts, stdin, _ = a_container(tmp_path)
    assert client.ask("prestart", opts, stdin, None) == "Connection refused"
    s.close()


def test_a_non_root_peer(tmp_path: Path, sockdir: Path) -> None:
    """A socket whose listener is not uid 0 is never asked (nothing is sent to it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to listen as another uid")
    path = sockdir / client.SOCKET_NAME
    code = (  # the peer's credentials are those at listen()
        "import os, socket, sys, time\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({str(path)!r})\n"
        "os.setgid(65534); os.setuid(65534); s.listen(1)\n"
        "print('up', flush=True); c, _ = s.accept(); print(len(c.recv(100)), flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        opts, stdin, _ = a_container(tmp_path)
        assert client.ask("prestart", opts, stdin, None) == "the socket's peer is uid 65534, not root"
        assert proc.wait(10) == 0 and proc.stdout.read() == "0\n"  # it got nothing
    finally:
        proc.kill()


def test_another_version(tmp_path: Path, decider: serve.Decider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "VERSION", "9.9.9")
    opts, stdin, log = a_container(tmp_path)
    got = client.ask("prestart", opts, stdin, None)
    assert isinstance(got, str) and got.startswith("declined: decider is version 9.9.9, the hook ")
    assert not log.exists()


@pytest.mark.parametrize(
    "answer, why",
    [
        (client.frame(client.ANSWER, b"zero\0x"), "malformed answer"),
        (client.frame(b"?", b""), "unexpected answer b'?'"),
        (b"A\xff\xff\xff\xff", "frame of 4294967295 bytes"),
        (b"", "connection closed"),
    ],
    ids=["malformed", "unknown-kind", "huge-frame", "missing"],
)
def test_a_bad_or_missing_answer(tmp_path: Path, sockdir: Path, answer: bytes, why: str) -> None:
    def behave(conn: socket.socket) -> None:
        conn.recv(1 << 16)
        conn.sendall(answer)

    t = fake(sockdir, behave)
    opts, stdin, _ = a_container(tmp_path)
    assert client.ask("prestart", opts, stdin, None) == why
    t.join(5)


def test_a_silent_decider_times_out(tmp_path: Path, sockdir: Path) -> None:
    done = threading.Event()
    t = fake(sockdir, lambda conn: done.wait(5))
    opts, stdin, _ = a_container(tmp_path)
    start = time.monotonic()
    assert client.ask("prestart", opts, stdin, None) == "no answer within 400 ms"
    assert time.monotonic() - start < 1.5
    done.set()
    t.join(5)


def test_a_decider_that_dies_after_go_refuses(tmp_path: Path, sockdir: Path) -> None:
    """After "go" the container is the decider's: its end is a refusal, never an in-process redo."""

    def behave(conn: socket.socket) -> None:
        conn.recv(1 << 16)
        conn.sendall(client.frame(client.READY, b""))
        assert client.read_frame(conn)[0] == client.GO
        # and then it dies

    t = fake(sockdir, behave)
    opts, stdin, _ = a_container(tmp_path)
    with pytest.raises(client.Refused, match="connection closed"):
        client.ask("prestart", opts, stdin, None)
    t.join(5)


def test_a_client_that_left_is_abandoned_unapplied(tmp_path: Path, decider: serve.Decider) -> None:
    """The client timed out (decided in-process): the decider's "ready" finds no "go", so it
    neither applies nor logs."""
    opts, stdin, log = a_container(tmp_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(client.SOCKET_DIR, client.SOCKET_NAME))
    s.sendall(request(opts, stdin))
    assert client.read_frame(s)[0] == client.READY
    s.close()
    for _ in range(100):
        if decider.status()["abandoned"]:
            break
        time.sleep(0.02)
    assert decider.status()["abandoned"] == 1 and decider.status()["requests"] == 0
    assert not log.exists()


def test_the_hook_falls_back_with_one_warning_in_the_log(tmp_path: Path) -> None:
    """End to end (console script, the state in a pipe): a socket nobody listens on → decided
    in-process, the same record plus one warning."""
    opts, stdin, log = a_container(tmp_path)
    args = [f"{k}={v}" if v else k for k, vs in opts.items() for v in vs]
    bind = (
        "import socket, subprocess, sys; s = socket.socket(socket.AF_UNIX); "
        "import os; os.makedirs('/run/oci-device-hook', mode=0o700, exist_ok=True); "
        "s.bind('/run/oci-device-hook/decider.sock'); "
        "sys.exit(subprocess.run(sys.argv[1:], input=sys.stdin.buffer.read()).returncode)"
    )
    hook = [sys.executable, "-I", "-m", "hook", "prestart", *args]
    plain = subprocess.run([*PRIVATE_RUN, *hook], input=stdin, capture_output=True, timeout=60)
    stopped = subprocess.run(
        [*PRIVATE_RUN, sys.executable, "-I", "-c", bind, *hook], input=stdin, capture_output=True, timeout=60
    )
    assert plain.returncode == stopped.returncode == 0, stopped.stderr
    first, second = log_lines(log)
    warning = "decider: Connection refused; decided in-process"
    assert second.pop("warnings") == [*first.pop("warnings", []), warning]
    assert first == second


# --- views kept by identity (hook.sources.warm)
# ---------------------------------------------------------------


@pytest.fixture
def warm_on() -> Iterator[None]:
    warm.enable()
    yield
    warm.enable(False)


def test_warm_is_off_unless_enabled(tmp_path: Path) -> None:
    assert warm.identity(tmp_path) is None  # no stat while off
    calls = []
    for _ in range(2):
        warm.remembered("slot", 1, lambda: calls.append(1))
    assert len(calls) == 2


def test_a_view_is_kept_until_its_identity_changes(tmp_path: Path, warm_on: None) -> None:
    f = tmp_path / "f"
    f.write_text("one")
    calls: list[str] = []

    def view() -> str:
        calls.append(f.read_text())
        return calls[-1]

    assert warm.remembered("f", warm.identity(f), view) == "one"
    assert warm.remembered("f", warm.identity(f), view) == "one"
    f.write_text("two!")  # size and mtime
    assert warm.remembered("f", warm.identity(f), view) == "two!"
    f.unlink()
    f.write_text("thre")  # same size, a new inode
    assert warm.remembered("f", warm.identity(f), view) == "thre"
    assert calls == ["one", "two!", "thre"]


def test_a_failed_view_is_not_kept(warm_on: None) -> None:
    def boom() -> int:
        raise ValueError("no")

    with pytest.raises(ValueError):
        warm.remembered("x", 1, boom)
    assert warm.remembered("x", 1, lambda: 2) == 2


def test_a_big_node_fits_without_thrashing(warm_on: None) -> None:
    """A 64-GPU + 224-MIG node keeps ~600 parsed files: all stay (a cap of 512 cleared them on
    every decision)."""
    for i in range(2000):
        warm.remembered(("f", i), 1, lambda: 0)
    calls = []
    for i in range(2000):
        warm.remembered(("f", i), 1, lambda: calls.append(1))
    assert calls == []


def test_decider_off_in_the_settings_stops_serve_before_it_listens(tmp_path: Path) -> None:
    """The shared contract's ``decider: off``: no socket, so every hook decides in-process."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("decider: off\n")
    sock_dir = tmp_path / "sock"
    proc = subprocess.run(
        [sys.executable, "-I", "-m", "hook", "serve", "--config", str(settings),
         "--socket-dir", str(sock_dir)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "decider: off" in proc.stderr and not sock_dir.exists()


def test_decider_setting_takes_auto_or_off_only(tmp_path: Path) -> None:
    from hook.sources.settingsfile import DeciderMode, load_settings

    good = tmp_path / "good.yaml"
    good.write_text("decider: off\n")
    assert load_settings(good).decider is DeciderMode.OFF
    bad = tmp_path / "bad.yaml"
    bad.write_text("decider: sometimes\n")
    with pytest.raises(InputError, match="decider"):
        load_settings(bad)
