"""``hook nri`` against a fake runtime on a scratch socket: registration, the create answers, the
protocol's bounds, and a peer posing as the runtime (issue 34 items 1, 2, 5, 6).

The daemon runs in a thread of this test process, which conftest has moved into a private mount
namespace with its own /run and /var/log; its settings put the log and caches under tmp_path."""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import nrifake as f
from tests.bundles import CONTAINER, POD_UID, checkpoint, checkpoint_entry, settings_file
from tests.hosttree import make_host_tree

NVIDIA = 195


@pytest.fixture(autouse=True)
def warm_off_after() -> Iterator[None]:
    """The daemon keeps views warm process-wide (``hook.sources.warm``): off again for the next test."""
    yield
    from hook.sources import warm

    warm.enable(False)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    make_host_tree(root, "8x-mig", mknod=False)
    return root


def _settings(tmp_path: Path, node: Path, **kw: Any) -> Path:
    ck = tmp_path / "kubelet_internal_checkpoint"
    ck.write_bytes(checkpoint([checkpoint_entry("nvidia.com/gpu", ["1"])]))
    return settings_file(tmp_path, driver_root=str(node), kubelet_checkpoint=str(ck), **kw)


class Bed:
    def __init__(self, tmp_path: Path, config: Path, sessions: int = 1) -> None:
        self.sock = tmp_path / "nri.sock"
        self.rt = f.FakeRuntime(self.sock)
        self.log = tmp_path / "hook.log"
        self.daemon = f.start_daemon(self.sock, config, sessions=sessions, sleep=lambda _s: None)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def bed(tmp_path: Path, node: Path) -> Iterator[Bed]:
    b = Bed(tmp_path, _settings(tmp_path, node))
    yield b
    b.rt.close()
    b.daemon.join(10)


def _pod() -> bytes:
    return f.pod(uid=POD_UID, name="trainer", namespace="ml")


def _gpus(n: int = 8) -> list[bytes]:
    return [f.device(f"/dev/nvidia{i}", "c", NVIDIA, i) for i in range(n)]


def _privileged(**kw: Any) -> bytes:
    return f.event(_pod(), f.container(name=CONTAINER, rules=[f.rule(True)], devices=_gpus(), **kw))


def test_registers_and_subscribes_configure_before_the_register_reply(bed: Bed) -> None:
    reg = bed.rt.accept()
    assert (reg.service, reg.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
    fields = f.decode(reg.payload)
    assert (fields.text(1), fields.text(2)) == ("oci-device-hook", "90")
    answer = bed.rt.call("Configure", f.configure())  # before RegisterPlugin's reply
    bed.rt.reply_register()
    events = f.decode(answer.payload).uint(2)
    assert events == sum(1 << (e - 1) for e in (4, 6, 10, 11))  # create, start, stop, remove
    assert bed.rt.call("Synchronize", f.synchronize([], [])).code == 0


def test_plain_container_gets_no_adjustment_and_no_line(bed: Bed) -> None:
    bed.rt.handshake()
    r = bed.rt.call("CreateContainer", f.event(_pod(), f.container(name=CONTAINER, env=["PATH=/bin"])))
    assert (r.code, r.payload) == (0, b"")
    assert bed.records() == []


def test_privileged_overgrant_is_decided_at_create_and_left_to_start_before_nri_0_10(bed: Bed) -> None:
    bed.rt.handshake(version="v2.1.9")
    r = bed.rt.call("CreateContainer", _privileged())
    assert r.code == 0
    adjust = f.adjust_of(r.payload)
    assert adjust["rules"] == []  # 2.1 ignores an adjustment's rules: start narrows
    assert {d[0] for d in adjust["devices"]} == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    (rec,) = bed.records()
    assert rec["verdict"] == "apply" and rec["route"] == "nri" and rec["stage"] == "create"
    cards = {d for d in rec["denied"] if d.startswith("/dev/nvidia") and d[11:].isdigit()}
    assert cards == {f"/dev/nvidia{i}" for i in range(8) if i != 1}


def test_deny_rules_are_answered_where_nri_applies_them(bed: Bed) -> None:
    bed.rt.handshake(runtime="containerd", version="v2.2.7", nri="v0.11.0")
    r = bed.rt.call("CreateContainer", _privileged())
    rules = f.adjust_of(r.payload)["rules"]
    denied = {(t, ma, mi) for allow, t, ma, mi, _ in rules if not allow}
    assert {d for d in denied if d[1] == NVIDIA} == {("c", NVIDIA, i) for i in range(8) if i != 1}
    assert all(
        not allow for allow, t, major, minor, _ in rules if (major, minor) in ((NVIDIA, None), (None, None))
    )


def test_deny_is_an_error_status_with_the_routes_one_line(tmp_path: Path, node: Path) -> None:
    b = Bed(tmp_path, _settings(tmp_path, node, mig_management="never"))
    try:
        b.rt.handshake()
        ev = f.event(
            f.pod(namespace="gpu-operator"),
            f.container(env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all"]),
        )
        r = b.rt.call("CreateContainer", ev)
        assert r.code == 7 and r.message.startswith(
            "oci-device-hook: deny: NVIDIA_MIG_CONFIG_DEVICES=all refused"
        )
        assert "\n" not in r.message
        assert [x["verdict"] for x in b.records()] == ["deny"]
    finally:
        b.rt.close()
        b.daemon.join(10)


def test_split_frames_and_messages_are_reassembled(bed: Bed) -> None:
    bed.rt.handshake()
    r = bed.rt.call("CreateContainer", _privileged(), split=1)  # one byte per write
    assert r.code == 0 and bed.records()[0]["verdict"] == "apply"


def test_unknown_method_and_undecodable_payload_are_error_statuses_not_a_crash(bed: Bed) -> None:
    bed.rt.handshake()
    assert bed.rt.call("UpdatePodSandbox", b"").code == 12
    assert bed.rt.call("CreateContainer", b"\x0a\xff\xff\xff\xff\x0f").code == 3  # a length past the end
    assert bed.rt.call("CreateContainer", f.event(_pod(), f.container())).code == 0  # still serving


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(struct.pack(">II", 1, 0xFFFFFFFF), id="oversized-mux-frame"),
        pytest.param(struct.pack(">II", 7, 4) + b"abcd", id="unknown-connection"),
        pytest.param(
            f.frames.mux(1, struct.pack(">IIBB", 0x7FFFFFFF, 1, 1, 0)), id="oversized-ttrpc-message"
        ),
    ],
)
def test_bad_framing_ends_the_session_and_the_daemon_connects_again(
    tmp_path: Path, node: Path, garbage: bytes
) -> None:
    b = Bed(tmp_path, _settings(tmp_path, node), sessions=2)
    try:
        b.rt.handshake()
        b.rt.send_raw(garbage)
        b.rt.accept()  # the daemon dropped the session and registered again, on the same socket
        b.rt.reply_register()
    finally:
        b.rt.close()
        b.daemon.join(10)
    assert not b.daemon.is_alive()


def _wait_for(log: Path, text: str, seconds: float = 10) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if log.exists() and text in log.read_text():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"{text!r} not in {log} after {seconds}s")


def test_a_late_narrowing_that_fails_is_an_error_record_and_a_stderr_line(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    bed.rt.accept()
    bed.rt.call("Configure", f.configure())
    running = f.container(name=CONTAINER, state=3, rules=[f.rule(True)], devices=_gpus(), pid=4_000_000)
    assert bed.rt.call("Synchronize", f.synchronize([_pod()], [running])).code == 0
    bed.rt.reply_register()
    assert _wait_for(bed.log, '"late": true') < 10
    (rec,) = bed.records()
    assert (rec["verdict"], rec["late"], rec["stage"]) == ("error", True, "synchronize")
    assert "No such process" in rec["error"]
    bed.rt.close()
    bed.daemon.join(10)
    assert "error: late narrowing of container" in capsys.readouterr().err


def test_state_change_start_is_the_start_of_nri_before_0_12(bed: Bed) -> None:
    bed.rt.handshake(version="1.7.24")
    ev = (
        f.enc_int(1, 6)
        + f.enc_msg(2, _pod())
        + f.enc_msg(3, f.container(name=CONTAINER, rules=[f.rule(True)], devices=_gpus()))
    )
    r = bed.rt.call("StateChange", ev)
    assert (r.code, r.message) == (
        9,
        "oci-device-hook: NRI StartContainer: pid: missing: the runtime sent no pid",
    )
    plain = f.enc_int(1, 6) + f.enc_msg(2, _pod()) + f.enc_msg(3, f.container(name=CONTAINER))
    assert bed.rt.call("StateChange", plain).code == 0  # a container that asks for nothing always starts


def test_memory_is_bounded_and_forgotten_on_stop_and_remove(tmp_path: Path, node: Path) -> None:
    from hook.routes.nri.plugin import Plugin
    from hook.routes.nri.verdicts import Ctx
    from hook.routes.options import Options

    config = _settings(tmp_path, node, cap_access="r")
    plugin = Plugin(
        Ctx(options=Options(settings_file=config)), lambda _a: None, lambda _s: None, max_remembered=8
    )
    mgmt = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all"]
    for i in range(50):
        ev = f.event(f.pod(namespace="gpu-operator"), f.container(f"{i:064x}", env=mgmt))
        code, _, payload = plugin.call("CreateContainer", ev)
        assert code == 0 and f.adjust_of(payload)["devices"]
    running = [
        f.container(f"{i:064x}", state=3, pid=4_000_000, rules=[f.rule(True)]) for i in range(100, 150)
    ]
    plugin.call("Synchronize", f.synchronize([], running))
    assert plugin.remembered() == 24  # 8 created awaiting start (trims, decision), 8 late narrowings
    for method in ("StopContainer", "RemoveContainer"):
        plugin.call(method, f.event(f.pod(), f.container(f"{49:064x}")))
    assert plugin.remembered() == 22


def test_a_refused_registration_ends_the_session_and_backs_off(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slept: list[float] = []
    sock = tmp_path / "nri.sock"
    rt = f.FakeRuntime(sock)
    t = f.start_daemon(sock, _settings(tmp_path, node), sessions=2, sleep=slept.append)
    try:
        for _ in range(2):
            rt.accept()
            rt.reply_register(code=9, message="plugin index taken")
            rt.conn.close()  # type: ignore[union-attr]
        t.join(10)
    finally:
        rt.close()
    assert not t.is_alive() and slept == [0.5, 1.0]
    err = capsys.readouterr().err
    assert err.count("not registered as 90-oci-device-hook") == 2 and "plugin index taken" in err


def test_cdi_devices_nri_lists_are_a_request_the_kubelets_files_must_vouch_for(bed: Bed) -> None:
    """NRI's ``CDI_devices`` carry what the kubelet put in the CRI request, but the daemon cannot
    authenticate the socket: they are weighed like a CDI annotation, so a card the kubelet's
    checkpoint does not allocate stays denied."""
    bed.rt.handshake()
    r = bed.rt.call("CreateContainer", _privileged(cdi=["nvidia.com/gpu=0"]))
    assert r.code == 0
    (rec,) = bed.records()
    assert "/dev/nvidia0" in rec["denied"] and "/dev/nvidia1" not in rec["denied"]
    assert any("nri-cdi-devices=nvidia.com/gpu=0 ignored" in w for w in rec["warnings"])


def test_a_broken_settings_file_refuses_device_containers_and_starts_the_rest(tmp_path: Path) -> None:
    """``hook nri`` does not exit on a settings file that does not load (the runtime would then
    create every container unadjusted): it serves, device containers are refused with the file's
    error, and a container that asks for nothing starts."""
    import subprocess
    import sys

    broken = tmp_path / "settings.yaml"
    broken.write_text(f"log_file: {tmp_path / 'hook.log'}\nprivileged_allocation: [\n")
    sock = tmp_path / "nri.sock"
    rt = f.FakeRuntime(sock)
    cmd = [sys.executable, "-m", "hook", "nri", "--socket", str(sock), "--config", str(broken)]
    daemon = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        rt.handshake()
        refused = rt.call("CreateContainer", _privileged())
        plain = rt.call("CreateContainer", f.event(_pod(), f.container(name=CONTAINER)))
    finally:
        daemon.terminate()
        _, err = daemon.communicate(timeout=10)
        rt.close()
    assert refused.code == 9 and str(broken) in refused.message
    assert (plain.code, plain.payload) == (0, b"")
    assert "warning:" in err and "serving with the default NRI settings" in err
    assert daemon.returncode == 0 and err.endswith(
        "oci-device-hook nri: stopped by SIGTERM\n"
    )  # a stop is one line
    (rec,) = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert rec["verdict"] == "error" and str(broken) in rec["error"]  # in the log the file still names


LISTENER = """
import os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.settimeout(3)
try:
    print("got", len(c.recv(1 << 16)), flush=True)
except TimeoutError:
    print("got nothing", flush=True)
"""


def test_a_listener_that_is_not_root_gets_no_registration(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A non-root process of a pod that got to listen at the socket path (a hostPath) is no runtime:
    the daemon reads its credentials from the kernel (SO_PEERCRED) and sends it nothing."""
    import subprocess
    import sys

    shared = Path("/tmp") / f"odh-nri-{os.getpid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    sock = shared / "nri.sock"
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(sock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "ready\n"
        t = f.start_daemon(sock, _settings(tmp_path, node), sessions=1, sleep=lambda _s: None)
        t.join(10)
        out, _ = listener.communicate(timeout=10)
    finally:
        listener.kill()
        sock.unlink(missing_ok=True)
        shared.rmdir()
    assert out == "got 0\n" or out == "got nothing\n", out  # closed unread: no RegisterPlugin
    assert "runs as uid 65534, not root: not a runtime" in capsys.readouterr().err


def test_synchronize_queues_running_and_paused_containers_not_created_ones(
    tmp_path: Path, node: Path
) -> None:
    from hook.routes.nri.plugin import Plugin
    from hook.routes.nri.verdicts import Ctx
    from hook.routes.options import Options

    plugin = Plugin(
        Ctx(options=Options(settings_file=_settings(tmp_path, node))), lambda _a: None, lambda _s: None
    )
    listed = [
        f.container(f"{state:064x}", state=state) for state in (1, 2, 3, 4)
    ]  # created, paused, running, stopped
    plugin.call("Synchronize", f.synchronize([], listed))
    assert plugin.remembered() == 2


def test_a_removed_containers_pod_view_is_forgotten_so_memory_stays_flat(tmp_path: Path, node: Path) -> None:
    """The daemon keeps each pod's kubelet view warm; RemoveContainer drops it, so a node that runs
    thousands of pods keeps none of the removed ones (bounded anyway by ``warm.MAX_SLOTS``)."""
    from hook.routes.nri.plugin import Plugin
    from hook.routes.nri.verdicts import Ctx
    from hook.routes.options import Options
    from hook.sources import warm

    warm.enable()
    plugin = Plugin(
        Ctx(options=Options(settings_file=_settings(tmp_path, node))), lambda _a: None, lambda _s: None
    )

    def kubelet_views() -> int:
        return sum(1 for slot in warm._slots if isinstance(slot, tuple) and slot[:1] == ("kubelet",))

    for i in range(20):
        ev = f.event(
            f.pod(uid=f"uid-{i}", name=f"p{i}"),
            f.container(f"{i:064x}", name=CONTAINER, rules=[f.rule(True)], devices=_gpus()),
        )
        assert plugin.call("CreateContainer", ev)[0] == 0
    assert kubelet_views() == 20
    for i in range(20):
        plugin.call("StopContainer", f.event(f.pod(uid=f"uid-{i}"), f.container(f"{i:064x}", name=CONTAINER)))
    assert kubelet_views() == 20  # stopped: it may start again
    for i in range(20):
        plugin.call(
            "RemoveContainer", f.event(f.pod(uid=f"uid-{i}"), f.container(f"{i:064x}", name=CONTAINER))
        )
    assert kubelet_views() == 0


@pytest.mark.parametrize("who", ["the daemon", "init", "a host process"])
def test_synchronize_acts_on_no_pid_a_peer_names_that_is_not_the_containers(
    tmp_path: Path, node: Path, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    """The same checks as at start hold on the Synchronize path: a listed running container whose
    pid is the daemon's, init's or a host process's is never applied to (the apply step is not even
    reached), and the failure is a late error record."""
    import subprocess

    from hook.adapters.apply import transaction
    from hook.routes.nri.plugin import Plugin
    from hook.routes.nri.verdicts import Ctx
    from hook.routes.options import Options

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("apply_plan reached")

    monkeypatch.setattr(transaction, "apply_plan", refuse)
    host = subprocess.Popen(["sleep", "30"])
    pid = {"the daemon": os.getpid(), "init": 1, "a host process": host.pid}[who]
    answers: list[Any] = []
    plugin = Plugin(
        Ctx(options=Options(settings_file=_settings(tmp_path, node))), answers.append, lambda _s: None
    )
    try:
        running = f.container(name=CONTAINER, state=3, rules=[f.rule(True)], devices=_gpus(), pid=pid)
        plugin.call("Synchronize", f.synchronize([_pod()], [running]))
        assert plugin.work() and not plugin.work()
    finally:
        host.kill()
    (a,) = answers
    why = {"the daemon": "it is init or the daemon itself", "init": "it is init or the daemon itself"}
    assert a.record["verdict"] == "error" and a.record["late"] is True
    assert why.get(who, "it shares the mount namespace of the daemon") in a.record["error"]
    assert plugin.late_failed == 1 and plugin.late_narrowed == 0
