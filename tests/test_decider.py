"""The warm decider and the thin client without a container runtime: the wire, the key, every way
a hook falls back, and the views kept by file identity (``hook.sources.warm``).

The decider runs in a thread of this process on a socket in ``tmp_path`` (``wire.SOCKET_DIR`` and
``wire.KEY_DIR`` are pointed there); misbehaving deciders are small fake servers. Real container
starts through the decider (runc, cgroup v1 and v2) are tests/live/test_decider_live.py; the
attacks from a container are tests/live/test_decider_attacks.py.
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
from hook.routes import act, client, serve, wire
from hook.routes.decision import Live, from_wire, to_wire
from hook.routes.fastpath import look_at
from hook.routes.live import decide_live, run_live
from hook.sources import warm
from tests.bundles import PRIVATE_RUN, gen, settings_file, state, write_bundle

NEEDS_DECISION = "privileged-no-allocation"  # decided "none": logged, nothing to apply


@pytest.fixture
def sockdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The decider's socket and key dirs, and the fast-path record (a decision writes it), in tmp_path."""
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    keys = tmp_path / "keys"
    monkeypatch.setattr(wire, "SOCKET_DIR", str(d))
    monkeypatch.setattr(wire, "KEY_DIR", str(keys))
    from hook.routes import fastpath
    from hook.sources import privatefile, settingsfile

    monkeypatch.setattr(privatefile, "FASTPATH_CACHE", str(d / "fastpath.json"))
    monkeypatch.setattr(fastpath, "FASTPATH_CACHE", str(d / "fastpath.json"), raising=False)
    monkeypatch.setattr(settingsfile, "FASTPATH_CACHE", d / "fastpath.json")
    return d


def a_container(tmp_path: Path) -> tuple[dict[str, list[str]], bytes, Path]:
    settings = settings_file(tmp_path)
    bundle = write_bundle(tmp_path / "b", gen.bundles()[NEEDS_DECISION])
    inventory = Path(gen.__file__).parent / "node" / "inventory.json"
    opts = {"--config": [str(settings)], "--inventory": [str(inventory)]}
    return opts, state(bundle, id="ctr-1"), tmp_path / "hook.log"


@pytest.fixture
def decider(sockdir: Path, tmp_path: Path) -> Iterator[serve.Decider]:
    opts, _, _ = a_container(tmp_path)
    d = serve.Decider(str(sockdir), key=wire.make_key(), opts=opts, settings_path=opts["--config"][0])
    d.listen()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    yield d
    d.close()
    t.join(5)


def fake(sockdir: Path, behave: Callable[[socket.socket], None]) -> threading.Thread:
    """A listener that accepts one connection and does ``behave`` with it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sockdir / wire.SOCKET_NAME))
    s.listen(4)

    def run() -> None:
        conn, _ = s.accept()
        with conn:
            behave(conn)
        s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def ask_live(opts: dict[str, list[str]], stdin: bytes) -> tuple[str, bytes | str]:
    look = look_at(opts, stdin, fast=False)
    look.read_config()
    assert look.config_bytes is not None
    fp = wire.fingerprint(opts, opts["--config"][-1])
    return client.ask(b"live", fp, [(wire.STATE, stdin), (wire.CONFIG, look.config_bytes)], 5.0)


def log_lines(log: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        line.pop("time", None)
        line.pop("duration_ms", None)
        line.pop("decider", None)
    return lines


# --- it decides as in-process, and acts on nothing -------------------------------------------------


def test_a_served_decision_is_the_in_process_one(tmp_path: Path, decider: serve.Decider) -> None:
    opts, stdin, log = a_container(tmp_path)
    got, body = ask_live(opts, stdin)
    assert got == "answered" and isinstance(body, bytes)
    assert not log.exists()  # the decider decided and logged nothing
    served = from_wire(body)
    assert served == decide_live(opts, look_at(opts, stdin, fast=False))
    assert isinstance(served, Live) and served.record["verdict"] == "none"
    assert decider.status()["requests"] == 1


def test_a_served_error_is_the_in_process_error(tmp_path: Path, decider: serve.Decider) -> None:
    opts, _, _ = a_container(tmp_path)
    stdin = state(tmp_path / "b", id="ctr-2")
    (tmp_path / "b" / "config.json").write_text("{not json")
    got, body = ask_live(opts, stdin)
    assert got == "answered" and isinstance(body, bytes)
    served = from_wire(body)
    assert served.code == 1 and "not valid JSON" in served.before
    assert served == decide_live(opts, look_at(opts, stdin, fast=False))


def test_decisions_cross_the_wire_unchanged(tmp_path: Path) -> None:
    """A plan with rules and nodes, and a decided config, come back equal (and normalized in-process)."""
    from hook.core.plan import Node, Plan, Verdict, plain
    from hook.core.record import replace
    from hook.core.rules import Access, DeviceType, Rule
    from hook.routes.decision import LogTo, Spec

    plan = Plan(
        verdict=Verdict.APPLY,
        reason="r",
        rules=(
            Rule(allow=False),
            Rule(allow=True, type=DeviceType.CHAR, major=195, minor=1, access=Access.R | Access.W),
        ),
        create=(Node(path="/dev/nvidia1", type="c", major=195, minor=1, file_mode=0o640, uid=1, gid=2),),
        remove=("/dev/nvidia0",),
        denied=("/dev/x",),
    )
    live = Live(
        code=0,
        record={"verdict": "apply", "warnings": ["w"]},
        log=LogTo(file="/l", max_bytes=5000),
        annotations={"a": "b"},
        cgroups_path="/c",
        before="x\n",
        plan=plan,
        rootfs="/r",
        host_dev=("/dev",),
        container="c1",
    )
    back = from_wire(to_wire(live))
    assert back == replace(live, plan=plain(plan))  # the plan as plain values: no enum to apply it
    assert to_wire(back) == to_wire(live)
    assert back.plan is not None and back.plan.rules[1].v1_line() == plan.rules[1].v1_line() == "c 195:1 rw"
    spec = Spec(code=3, out='{"\u00e9": 1}\n'.encode(), record=None, runtime_log="no")
    assert from_wire(to_wire(spec)) == spec


def test_status_counts_requests(tmp_path: Path, decider: serve.Decider) -> None:
    opts, stdin, _ = a_container(tmp_path)
    for _ in range(3):
        assert ask_live(opts, stdin)[0] == "answered"
    st = client.status()
    assert isinstance(st, dict)
    assert (st["requests"], st["version"], st["pid"]) == (3, serve.VERSION, os.getpid())
    assert st["uptime_s"] >= 0


def test_the_socket_is_root_only(sockdir: Path, decider: serve.Decider) -> None:
    st = os.lstat(sockdir / wire.SOCKET_NAME)
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
    assert os.lstat(sockdir).st_mode & 0o777 == 0o700


def test_a_group_readable_socket_dir_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    with pytest.raises(Exception, match="mode 0700"):
        serve.Decider(str(d), key=b"k" * 32).listen()


# --- nothing but the container comes from the requester ---------------------------------------------


def raw(sockdir: Path, data: bytes) -> bytes:
    """Send ``data`` as a forging client would; everything the listener says back."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(sockdir / wire.SOCKET_NAME))
    with s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:  # closed with the rest of the request unread
            pass
    return b"".join(chunks)


@pytest.mark.parametrize("forged", ["no-mac", "wrong-key", "first-design"])
def test_a_request_without_the_key_gets_nothing(
    tmp_path: Path, sockdir: Path, decider: serve.Decider, forged: str
) -> None:
    opts, stdin, log = a_container(tmp_path)
    head = wire.frame(
        wire.REQUEST,
        b"\0".join(
            [
                wire.MAGIC,
                wire.PROTOCOL,
                serve.VERSION.encode(),
                b"live",
                wire.fingerprint(opts, opts["--config"][0]).hex().encode(),
                b"n",
            ]
        ),
    )
    if forged == "no-mac":
        data = head + wire.frame(wire.STATE, stdin)
    elif forged == "wrong-key":
        data = head + wire.frame(wire.MAC, wire.mac(b"x" * 32, b"head", head)) + wire.frame(wire.STATE, stdin)
    else:
        data = wire.frame(
            b"Q", b"\0".join([wire.MAGIC, serve.VERSION.encode(), b"1", b"prestart"])
        ) + wire.frame(b"S", stdin)
    assert raw(sockdir, data) == b""
    assert decider.status()["unauthenticated"] == 1 and decider.status()["requests"] == 0
    assert not log.exists()


def test_a_hook_with_other_settings_is_declined(tmp_path: Path, decider: serve.Decider) -> None:
    """Same request, but the hook names another driver root: declined (the hook decides itself)."""
    opts, stdin, _ = a_container(tmp_path)
    other = {**opts, "--driver-root": [str(tmp_path)]}
    got, why = ask_live(other, stdin)
    assert (got, why) == ("declined", "declined: the hook's settings file or options are not the decider's")
    (tmp_path / "settings.yaml").write_text((tmp_path / "settings.yaml").read_text() + "\n# edited\n")
    assert ask_live(opts, stdin)[0] == "answered"  # the same file, edited: both see the same identity


def test_another_version_is_declined_without_a_pid(
    tmp_path: Path, decider: serve.Decider, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hook.routes import answer

    monkeypatch.setattr(answer, "VERSION", "9.9.9")
    opts, stdin, log = a_container(tmp_path)
    got, why = ask_live(opts, stdin)
    assert got == "declined" and "9.9.9" in str(why) and str(os.getpid()) not in str(why)
    assert not log.exists()


def test_the_fingerprint_covers_settings_identity_and_options(tmp_path: Path) -> None:
    settings = tmp_path / "s.yaml"
    settings.write_text("log_file: /x\n")
    base = wire.fingerprint({}, str(settings))
    assert wire.fingerprint({}, str(settings)) == base
    assert wire.fingerprint({"--driver-root": ["/"]}, str(settings)) != base
    assert wire.fingerprint({"--log": [""]}, str(settings)) == base  # not a decision input
    settings.write_text("log_file: /y\n")
    assert wire.fingerprint({}, str(settings)) != base


# --- the key -------------------------------------------------------------------------------------------


def test_the_key_is_made_once_root_only(tmp_path: Path) -> None:
    d = tmp_path / "k"
    key = wire.make_key(str(d))
    assert len(key) == 32 and wire.make_key(str(d)) == key == wire.read_key(str(d))
    assert os.stat(d).st_mode & 0o777 == 0o700 and os.stat(d / wire.KEY_NAME).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("bad", ["symlink", "group-readable", "short", "long", "dir-open", "fifo"])
def test_a_key_that_cannot_be_trusted_is_none(tmp_path: Path, bad: str) -> None:
    d = tmp_path / "k"
    key = wire.make_key(str(d))
    path = d / wire.KEY_NAME
    if bad == "symlink":
        other = tmp_path / "elsewhere"
        other.write_bytes(key)
        other.chmod(0o600)
        path.unlink()
        path.symlink_to(other)
    elif bad == "group-readable":
        path.chmod(0o640)
    elif bad == "short":
        path.write_bytes(key[:16])
    elif bad == "long":  # issue 31 (s142737-178): 33 bytes are not a key with a byte to spare
        path.write_bytes(key + b"k")
    elif bad == "dir-open":
        d.chmod(0o755)
    else:
        path.unlink()
        os.mkfifo(path, 0o600)
    assert wire.read_key(str(d)) is None
    if bad != "dir-open":
        fresh = wire.make_key(str(d))  # replaced by a rename, never written through what sits there
        assert len(fresh) == 32 and not path.is_symlink() and wire.read_key(str(d)) == fresh


def test_a_fresh_daemonset_key_dir_is_narrowed_through_its_fd(tmp_path: Path) -> None:
    """Issue 36 item 6: hostPath ``DirectoryOrCreate`` makes the key dir 0755 (root's); ``hook
    serve`` narrows its own directory to 0700 and makes its key there, instead of crash-looping."""
    d = tmp_path / "k"
    d.mkdir()
    d.chmod(0o755)
    key = wire.make_key(str(d))
    assert len(key) == 32 and wire.read_key(str(d)) == key
    assert os.stat(d).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("bad", ["symlink", "foreign"])
def test_a_key_dir_not_ours_is_never_narrowed(tmp_path: Path, bad: str) -> None:
    """A symlink at the key dir's name, or another user's directory there, is refused as it is:
    no chmod reaches what it names, no key is written into it."""
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o755)
    d = target
    if bad == "symlink":
        d = tmp_path / "k"
        d.symlink_to(target)
    else:
        os.chown(target, 12345, 12345)
    with pytest.raises(OSError):
        wire.make_key(str(d))
    assert os.stat(target).st_mode & 0o777 == 0o755 and os.listdir(target) == []


# --- every failure falls back, and says so -----------------------------------------------------------


def test_no_socket_is_a_silent_fallback(tmp_path: Path, sockdir: Path) -> None:
    opts, stdin, _ = a_container(tmp_path)
    assert ask_live(opts, stdin) == ("", "")


def test_refused(tmp_path: Path, sockdir: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sockdir / wire.SOCKET_NAME))  # bound, never listening: a stopped decider's socket
    wire.make_key()
    opts, stdin, _ = a_container(tmp_path)
    assert ask_live(opts, stdin) == ("fallback", "Connection refused")
    s.close()


def test_no_key_means_no_trust(tmp_path: Path, sockdir: Path) -> None:
    """A listener on a node without the key is never believed (nothing is sent to it)."""
    got: list[bytes] = []
    t = fake(sockdir, lambda conn: got.append(conn.recv(100)))
    opts, stdin, _ = a_container(tmp_path)
    status, why = ask_live(opts, stdin)
    assert status == "untrusted" and "no usable key" in str(why)
    t.join(5)
    assert got == [b""]


@pytest.mark.parametrize(
    "answer",
    [
        wire.frame(wire.ANSWER, b"{}") + wire.frame(wire.MAC, bytes(32)),  # a made-up proof
        wire.frame(wire.ANSWER, b"0\0"),  # the first design's "applied, exit 0", no proof
        wire.frame(wire.DECLINE, b"busy") + wire.frame(wire.MAC, bytes(32)),
    ],
    ids=["forged-proof", "first-design-answer", "forged-decline"],
)
def test_an_answer_without_the_proof_is_untrusted(tmp_path: Path, sockdir: Path, answer: bytes) -> None:
    wire.make_key()

    def behave(conn: socket.socket) -> None:
        conn.recv(1 << 16)
        conn.sendall(answer)

    t = fake(sockdir, behave)
    opts, stdin, _ = a_container(tmp_path)
    status, why = ask_live(opts, stdin)
    t.join(5)
    if answer.startswith(wire.ANSWER) and len(answer) < 20:
        assert status in ("untrusted", "fallback")  # its proof never comes: a closed connection
    else:
        assert status == "untrusted" and "untrusted listener" in str(why)


def test_a_replayed_answer_is_untrusted(tmp_path: Path, sockdir: Path, decider: serve.Decider) -> None:
    """A real answer, recorded and sent back to the next request (another nonce), fails its proof."""
    opts, stdin, _ = a_container(tmp_path)
    recorded: list[bytes] = []
    real = client.ask

    def spy(route: bytes, fp: bytes, parts: list[tuple[bytes, bytes]], timeout: float | None = None):
        got = real(route, fp, parts, timeout)
        recorded.append(got[1] if isinstance(got[1], bytes) else b"")
        return got

    assert (
        spy(
            b"live",
            wire.fingerprint(opts, opts["--config"][0]),
            [(wire.STATE, stdin), (wire.CONFIG, (tmp_path / "b" / "config.json").read_bytes())],
            5.0,
        )[0]
        == "answered"
    )
    decider.close()
    key = wire.read_key()
    assert key is not None
    replay = wire.frame(wire.ANSWER, recorded[0]) + wire.frame(
        wire.MAC, wire.mac(key, b"answer", b"old", wire.ANSWER, recorded[0])
    )

    def behave(conn: socket.socket) -> None:
        conn.recv(1 << 20)
        conn.sendall(replay)

    t = fake(sockdir, behave)
    status, why = ask_live(opts, stdin)
    t.join(5)
    assert status == "untrusted", why


def test_a_silent_decider_times_out(tmp_path: Path, sockdir: Path) -> None:
    wire.make_key()
    done = threading.Event()
    t = fake(sockdir, lambda conn: done.wait(5))
    opts, stdin, _ = a_container(tmp_path)
    start = time.monotonic()
    look = look_at(opts, stdin, fast=False)
    look.read_config()
    assert look.config_bytes is not None
    got = client.ask(b"live", b"", [(wire.CONFIG, look.config_bytes)])
    assert got == ("fallback", "no answer within 400 ms")
    assert time.monotonic() - start < 1.5
    done.set()
    t.join(5)


def test_the_hook_falls_back_with_one_warning_in_the_log(tmp_path: Path) -> None:
    """End to end (console script, the state in a pipe): a socket nobody listens on → decided
    in-process, the same record plus one warning and ``decider: fallback``."""
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
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert "decider" not in first and second.pop("decider") == "fallback"
    warning = "decider: Connection refused; decided in-process"
    assert second.pop("warnings") == [*first.pop("warnings", []), warning]
    first.pop("time"), second.pop("time")
    first.pop("duration_ms", None), second.pop("duration_ms", None)
    assert first == second


def test_decider_off_in_the_hooks_settings_asks_nothing(
    tmp_path: Path, sockdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decider: off`` (read from the fast path's compiled record): no connection, record says "off"."""
    from hook.routes import offer
    from hook.routes.live import remember
    from hook.sources.settingsfile import load_settings

    settings = settings_file(tmp_path, decider="off")
    bundle = write_bundle(tmp_path / "b", gen.bundles()[NEEDS_DECISION])
    opts = {"--config": [str(settings)]}
    assert remember(opts, load_settings(settings)) == ""  # the record the first container leaves
    connects: list[int] = []
    monkeypatch.setattr(client, "_connect", lambda t: connects.append(1))
    monkeypatch.setattr(offer, "_by_pipe", lambda: True)
    decision, session = offer.live("prestart", opts, look_at(opts, state(bundle), fast=False))
    assert decision is None and session.decider == "off" and connects == []


# --- views kept by identity (hook.sources.warm) ---------------------------------------------------------


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
    time.sleep(0.05)  # past the timestamp granularity: a reused inode number still differs by ctime
    f.write_text("thre")  # same size, a new file (the in-place rewrite: tests/test_file_identity.py)
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
        [
            sys.executable,
            "-I",
            "-m",
            "hook",
            "serve",
            "--config",
            str(settings),
            "--socket-dir",
            str(sock_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "decider: off" in proc.stderr and not sock_dir.exists()


def test_decider_setting_takes_auto_or_off_only(tmp_path: Path) -> None:
    from hook.core.settings import DeciderMode
    from hook.sources.settingsfile import load_settings

    good = tmp_path / "good.yaml"
    good.write_text("decider: off\n")
    assert load_settings(good).decider is DeciderMode.OFF
    bad = tmp_path / "bad.yaml"
    bad.write_text("decider: sometimes\n")
    with pytest.raises(InputError, match="decider"):
        load_settings(bad)


def test_run_live_acts_on_the_decision(tmp_path: Path, sockdir: Path) -> None:
    opts, stdin, log = a_container(tmp_path)
    assert run_live({**opts, "--log": [""]}, stdin) == 0
    assert log_lines(log)[0]["verdict"] == "none"
    assert act.Session("prestart").route == "prestart"


# --- issue 31: each of the decider's checks of the node key, pinned by name -----------------------------


def _signed(
    opts: dict[str, list[str]], key: bytes, frames: list[tuple[bytes, bytes]], body_key: bytes
) -> bytes:
    """A request as the hook sends it (header, its MAC, ``frames``), closed by a MAC by ``body_key``."""
    header = [wire.MAGIC, wire.PROTOCOL, serve.VERSION.encode(), b"live"]
    header += [wire.fingerprint(opts, opts["--config"][0]).hex().encode(), os.urandom(16).hex().encode()]
    head = wire.frame(wire.REQUEST, b"\0".join(header))
    body = head + wire.frame(wire.MAC, wire.mac(key, b"head", head))
    body += b"".join(wire.frame(kind, payload) for kind, payload in frames)
    return body + wire.frame(wire.MAC, wire.mac(body_key, b"request", body))


@pytest.mark.parametrize("forged", ["body-mac-of-another-key", "body-changed-after-the-mac", "two-states"])
def test_a_request_is_served_only_when_its_whole_body_proves_the_key(
    tmp_path: Path, sockdir: Path, decider: serve.Decider, forged: str
) -> None:
    """Issue 31: the header's MAC alone admits nothing. The closing MAC must prove the node key over
    every frame as sent (a container that got hold of one valid header cannot put its own state or
    config behind it), and a request carries each frame once (two states are not read as either)."""
    opts, stdin, _ = a_container(tmp_path)
    look = look_at(opts, stdin, fast=False)
    look.read_config()
    assert look.config_bytes is not None
    key = wire.read_key()
    assert key is not None
    frames = [(wire.STATE, stdin), (wire.CONFIG, look.config_bytes)]
    honest = _signed(opts, key, frames, key)
    assert raw(sockdir, honest)[:1] == wire.ANSWER  # the control: the same request, signed, is answered
    if forged == "body-mac-of-another-key":
        data = _signed(opts, key, frames, b"x" * 32)
    elif forged == "body-changed-after-the-mac":
        other = state(tmp_path / "elsewhere", id="ctr-2")
        data = honest.replace(wire.frame(wire.STATE, stdin), wire.frame(wire.STATE, other))
        assert data != honest
    else:
        data = _signed(opts, key, [(wire.STATE, stdin), *frames], key)
    assert raw(sockdir, data) == b""
    assert (decider.status()["unauthenticated"], decider.status()["requests"]) == (1, 1)


def test_a_header_without_the_keys_mac_is_dropped_before_its_frames_are_read(
    tmp_path: Path, sockdir: Path, decider: serve.Decider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: the decider checks the header's MAC before it reads a frame past 4 KiB, so a client
    without the key cannot make it hold a connection (or 24 MiB) open: it hangs up at once, while the
    client is still sending, however long the decider would wait for a slow honest hook."""
    monkeypatch.setattr(serve, "READ_TIMEOUT", 60.0)
    head = wire.frame(wire.REQUEST, b"\0".join([wire.MAGIC, wire.PROTOCOL, b"x", b"live", b"f", b"n"]))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(sockdir / wire.SOCKET_NAME))
    with s:
        s.sendall(head + wire.frame(wire.MAC, b"\0" * 32) + wire.STATE + (1 << 20).to_bytes(4, "big") + b"{")
        try:
            got = s.recv(1)  # the rest of the frame never comes: only the decider can end this
        except ConnectionResetError:
            got = b""
    assert got == b""
    assert decider.status()["unauthenticated"] == 1


def test_the_mac_is_keyed_blake2b_256_over_unambiguous_parts() -> None:
    """Issue 31 (s142737-175): docs/design.md's MAC is keyed BLAKE2b-256 (32 bytes: a shorter tag
    is a weaker one nobody chose), keyed by the node key, and a list of parts never collides with
    another split of the same bytes (each part is length-prefixed)."""
    import hashlib

    key = b"k" * wire.KEY_BYTES
    tag = wire.mac(key, b"head", b"x")
    assert len(tag) == 32
    assert tag == hashlib.blake2b(
        len(b"head").to_bytes(8, "big") + b"head" + (1).to_bytes(8, "big") + b"x",
        key=key, digest_size=32, person=b"odh-decider-v2",
    ).digest()  # fmt: skip
    assert wire.mac(b"j" * wire.KEY_BYTES, b"head", b"x") != tag
    assert wire.mac(key, b"hea", b"dx") != tag and wire.mac(key, b"headx") != tag


def test_stopping_waits_for_the_requests_in_flight(sockdir: Path) -> None:
    """Issue 31 (s142737-164): ``hook serve`` stopping (SIGTERM: an upgrade, a restart) lets every
    request already being decided finish, within its limit, before the process exits: a hook
    waiting on an answer then gets one instead of a dropped connection."""
    d = serve.Decider(str(sockdir), key=b"k" * 32, opts={}, settings_path="/nonexistent")
    assert d._slots.acquire(blocking=False)  # a worker still deciding

    def finish() -> None:
        time.sleep(0.5)
        d._slots.release()

    threading.Thread(target=finish, daemon=True).start()
    start = time.monotonic()
    d.drain(30.0)
    assert time.monotonic() - start >= 0.45  # returned only once that request was done


def test_a_decision_that_cannot_be_applied_is_logged_as_an_error(tmp_path: Path, sockdir: Path) -> None:
    """Issue 31 (s142737-194): a plan that changes something but cannot be applied (here: the state
    names no pid, so there is no container to apply it to) exits non-zero with one line, and the
    log says so (verdict error, the reason), never nothing: the operator's log is where a start
    that failed is looked for."""
    opts, _, log = a_container(tmp_path)
    bundle = write_bundle(tmp_path / "slice", gen.bundles()["slice-privileged"])
    rc = run_live({**opts, "--log": [""]}, state(bundle, id="ctr-9"))
    assert rc != 0
    (line,) = log_lines(log)
    assert line["verdict"] == "error" and "pid" in str(line["error"]), line
    assert line["container"] == {"id": "ctr-9"} or line["container"]["id"] == "ctr-9"


def test_a_request_that_breaks_the_decider_is_one_escaped_line_and_frees_its_slot(
    sockdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (s142737-165): a worker's unexpected error never takes the decider down and is
    never silent: one line on its stderr (the journal), escaped, and the slot is given back."""
    d = serve.Decider(str(sockdir), key=b"k" * 32, opts={}, settings_path="/nonexistent")

    def broken(conn: socket.socket, deadline: float | None = None) -> None:
        raise RuntimeError("bad\x1b[2J\nnews")

    monkeypatch.setattr(d.answerer, "handle", broken)
    assert d._slots.acquire(blocking=False)  # as run() does before it starts the worker
    a, b = socket.socketpair()
    b.close()
    d._worker(a)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "request failed: RuntimeError" in err and "\x1b" not in err, err
    assert d._slots._value == serve.MAX_WORKERS  # type: ignore[attr-defined]  # the slot came back


def test_serve_without_a_usable_key_dir_is_one_line_and_exit_1(
    tmp_path: Path, sockdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31 (s142737-166): no key, no decider: ``hook serve`` says why in one line and exits 1
    before it listens (no socket a hook would then wait on)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr(wire, "KEY_DIR", str(blocker / "keys"))
    opts, _, _ = a_container(tmp_path)
    assert serve.serve(opts, str(sockdir)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no key in" in err, err
    assert not (sockdir / wire.SOCKET_NAME).exists()


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o700])
def test_the_key_directory_error_shows_the_mode_it_found(tmp_path: Path, mode: int) -> None:
    """The fact to fix is the mode and owner found: the error says them (make_key refuses another
    user's directory, the socket dir any open one)."""
    d = tmp_path / "k"
    d.mkdir()
    d.chmod(mode)
    os.chown(d, 12345, 12345)
    with pytest.raises(PermissionError) as info:
        wire.make_key(str(d))
    assert f"{d}: must be this user's directory, mode 0700" in str(info.value)
    assert f"found mode {mode:04o}, owner uid 12345 (this process is uid {os.geteuid()})" in str(info.value)
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(PermissionError, match="found a symlink"):
        wire.make_key(str(link))
    mine = tmp_path / "s"
    mine.mkdir()
    mine.chmod(0o755)
    decider = serve.Decider(str(mine), key=b"k" * 32, opts={}, settings_path=str(tmp_path / "none.yaml"))
    with pytest.raises(InputError, match=f"found mode 0755, owner uid {os.geteuid()}"):
        decider.listen()
