"""Issue 27's three attacks on the warm decider, as a container that sees the host's /run would run them.

A static client (``tests/live/attack.c``, built with ``cc -static`` into the busybox rootfs) runs
inside a real runc container whose ``/run`` is the (private) host ``/run`` where ``hook serve``
listens. Read-only ``/run``: it asks the decider for a decision about itself (self-grant: all GPUs
by env, its own pid handed over by pidfd) and with options of its choosing (a settings file whose
log is a host file, a CDI spec dir naming a host block device). Read-write ``/run``: it renames
its own listener over the decider's socket and answers "applied" to the next hook, the seed-000
slice pod's. Each attack worked on the first design; now nothing is granted, no host file is
touched, the slice pod is narrowed and its record names the untrusted listener.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hook.core.version import VERSION
from tests.live.decider import with_decider
from tests.live.livekit import RUNC, Bundle, _quote, build_bundle, parse_probe, private_host
from tests.live.test_hook_scenarios import slice_pod

HERE = Path(__file__).parent
CC = shutil.which("cc") or shutil.which("gcc")
SOCKET = "/run/oci-device-hook/decider.sock"
pytestmark = pytest.mark.skipif(CC is None, reason="the attack client is built with a C compiler")


@pytest.fixture(scope="module")
def attack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("attack") / "attack"
    subprocess.run(
        [CC, "-static", "-O2", "-o", str(out), str(HERE / "attack.c")], check=True, capture_output=True
    )
    return out


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def first_design_request(state: dict[str, Any], options: list[str]) -> bytes:
    """A request as the first design's client sent it: options on the wire, the state as given.
    The pid field is padded to 10 characters for the client to patch in its host pid."""
    head = b"\0".join(
        [b"oci-device-hook", VERSION.encode(), b"1", b"prestart", *(o.encode() for o in options)]
    )
    text = json.dumps({**state, "pid": 1}).replace('"pid": 1', '"pid": 1         ')
    return frame(b"Q", head) + frame(b"S", text.encode())


def attacker(bundle_dir: Path, attack: Path, script: str, *, run_rw: bool) -> Bundle:
    """A plain container (asks for nothing) with the host's /run and the static client at /attack."""
    b = build_bundle(bundle_dir, ["/bin/sh", "-c", script])
    shutil.copy2(attack, b.rootfs / "attack")
    b.config["mounts"].append(
        {
            "destination": "/run",
            "type": "bind",
            "source": "/run",
            "options": ["rbind", "rw" if run_rw else "ro"],
        }
    )
    b.config["process"]["capabilities"] = {
        k: ["CAP_MKNOD", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"]
        for k in ("bounding", "effective", "permitted")
    }
    return b.write()


def run_in_view(
    lines: list[str], out: Path, serve_args: list[str], timeout: float = 120
) -> tuple[str, dict[str, Any]]:
    """``lines`` (shell) in one private host view with a decider up; their output and its status."""
    script = "\n".join(lines)
    cmd = private_host(with_decider(["sh", "-c", script], out, serve_args=serve_args))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    try:
        status = json.loads(out.read_text())
    except (OSError, ValueError):
        status = {"error": "no status"}
    return proc.stdout + proc.stderr, status


def runc_line(b: Bundle, log: Path) -> str:
    root = b.path / "runc-state"
    run = [RUNC, "--root", str(root), "run", "--bundle", str(b.path), b.id]
    delete = [RUNC, "--root", str(root), "delete", "-f", b.id]
    return (
        " ".join(map(_quote, run))
        + f" >{_quote(str(log))} 2>&1 </dev/null; "
        + " ".join(map(_quote, delete))
        + " >/dev/null 2>&1"
    )


def test_a_container_cannot_have_the_decider_grant_it_gpus(
    bundle_dir: Path, host: dict[str, Path], attack: Path, tmp_path: Path
) -> None:
    """Self-grant (read-only /run): its own pid by pidfd, a config asking for every GPU by env."""
    b = attacker(bundle_dir, attack, "", run_rw=False)
    forged = tmp_path / "forged"
    forged.mkdir()
    config = json.loads(json.dumps(b.config))
    config["root"]["path"] = str(b.rootfs)
    config["process"]["env"] = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    (forged / "config.json").write_text(json.dumps(config))
    state = {"ociVersion": "1.0.2", "id": b.id, "status": "created", "bundle": str(forged), "annotations": {}}
    opts = [
        f"--driver-root={host['root']}",
        f"--config={host['settings']}",
        f"--cdi-spec-dir={host['no_cdi']}",
    ]
    (b.rootfs / "req").write_bytes(first_design_request(state, opts))
    b.config["process"]["args"] = [
        "/bin/sh",
        "-c",
        f"/attack send {SOCKET} /req; "
        'for n in 0 1 7; do cat /dev/nvidia$n 2>&1 | head -c 80; echo " PROBE$n"; done',
    ]
    b.write()
    out = tmp_path / "attacker.out"
    text, status = run_in_view(
        [runc_line(b, out)], tmp_path / "status.json", [f"--config={host['settings']}"]
    )
    seen = out.read_text()
    print(seen, text, status)
    assert "PROBE0" in seen, seen  # the container ran its probes
    assert "No such device or address" not in seen, seen  # no GPU was opened: nothing granted
    assert "FRAME A" not in seen and "FRAME R" not in seen  # no decision for the attacker
    assert "pidfd is process" not in seen  # no host pid told
    assert status.get("unauthenticated", 0) >= 1, status


def test_options_from_the_wire_reach_nothing(
    bundle_dir: Path, host: dict[str, Path], attack: Path, tmp_path: Path
) -> None:
    """Wire options (read-only /run): a settings file whose log is a host file, a CDI spec dir
    naming a host block device (``b 7:0``, a loop device) for the container."""
    victim = tmp_path / "victim"
    precious = "precious\n" * 600  # past log_max_bytes: the first design rotated it away
    victim.write_text(precious)
    evil = tmp_path / "evil-settings.yaml"
    evil.write_text(f"log_file: {victim}\nlog_max_bytes: 4096\ncache_dir: {tmp_path}/evil-cache\n")
    specs = tmp_path / "evil-cdi"
    specs.mkdir()
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "evil.example/disk",
        "devices": [
            {
                "name": "loop",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/evil-loop", "type": "b", "major": 7, "minor": 0}]
                },
            }
        ],
    }
    (specs / "evil.json").write_text(json.dumps(spec))
    b = attacker(bundle_dir, attack, "", run_rw=False)
    state = {
        "ociVersion": "1.0.2",
        "id": b.id,
        "status": "created",
        "bundle": str(b.path),
        "annotations": {"cdi.k8s.io/evil": "evil.example/disk=loop"},
    }
    opts = [f"--driver-root={host['root']}", f"--config={evil}", f"--cdi-spec-dir={specs}"]
    (b.rootfs / "req").write_bytes(first_design_request(state, opts))
    b.config["process"]["args"] = [
        "/bin/sh",
        "-c",
        f"/attack send {SOCKET} /req; "
        "head -c 1 /dev/evil-loop >/dev/null 2>&1 && echo OPENED || echo CLOSED-LOOP",
    ]
    b.write()
    out = tmp_path / "attacker.out"
    text, status = run_in_view(
        [runc_line(b, out)], tmp_path / "status.json", [f"--config={host['settings']}"]
    )
    seen = out.read_text()
    print(seen, text, status)
    assert "CLOSED-LOOP" in seen and "OPENED" not in seen, seen
    assert victim.read_text() == precious  # the decider wrote no host file
    assert not Path(f"{victim}.1").exists()
    assert "FRAME A" not in seen and "FRAME R" not in seen
    assert status.get("unauthenticated", 0) >= 1, status


def test_a_planted_socket_does_not_free_the_slice_pod(
    bundle_dir: Path, host: dict[str, Path], attack: Path, tmp_path: Path
) -> None:
    """Planted socket (read-write /run): the attacker's listener answers "applied, exit 0" (and a
    made-up proof); the slice pod after it is narrowed in-process, and its record says why."""
    planted = attacker(tmp_path / "attacker", attack, "", run_rw=True)
    (planted.rootfs / "answer").write_bytes(frame(b"A", b"0\0") + frame(b"M", bytes(32)))
    planted.config["process"]["args"] = ["/bin/sh", "-c", f"/attack plant {SOCKET} /answer"]
    planted.write()
    pod = slice_pod(bundle_dir, host)
    for hook in pod.config["hooks"]["prestart"]:
        hook["env"] = [*hook.get("env", []), "OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS=5000"]
    pod.write()
    a_out, p_out = tmp_path / "attacker.out", tmp_path / "pod.out"
    lines = [
        f"( {runc_line(planted, a_out)} ) &",
        f"i=0; until grep -q PLANTED {_quote(str(a_out))} 2>/dev/null || [ $i -gt 200 ]; do",
        "sleep 0.05; i=$((i+1)); done",
        runc_line(pod, p_out),
        "wait",
    ]
    text, _status = run_in_view(lines, tmp_path / "status.json", [f"--config={host['settings']}"])
    print(a_out.read_text(), p_out.read_text(), text)
    assert "PLANTED" in a_out.read_text() and "SERVED" in a_out.read_text()  # the pod's hook asked it
    seen = parse_probe(p_out.read_text())
    assert seen == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}, p_out.read_text()
    (record,) = [json.loads(line) for line in host["log"].read_text().splitlines()]
    assert record["verdict"] == "apply" and record["decider"] == "untrusted"
    assert any(
        w.startswith("decider: ") and "untrusted listener" in w and SOCKET in w for w in record["warnings"]
    )
