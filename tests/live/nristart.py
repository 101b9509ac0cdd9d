"""Driver for the NRI start tests, run inside ``livekit.private_host`` (a private /dev with fake GPUs,
/run, /var/log, and a guarded cgroup root): real runc containers created (their init waits at the
exec fifo, as at NRI's StartContainer), ``hook nri`` in a thread of this process, and a fake runtime
that names pids, honestly or not. Prints one JSON object: what each call answered and what each
container's probes saw.

    python -m tests.live.nristart WORKDIR CASE      (CASE: narrow | attack | late)
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests import nrifake as f
from tests.bundles import CONTAINER, POD_UID, checkpoint, checkpoint_entry
from tests.hosttree import make_host_tree
from tests.live.livekit import RUNC, build_bundle, parse_probe, probe_args

GPUS = 8
PROBES = ["/dev/nvidia1", "/dev/nvidia0", "/dev/nvidia7", "/tmp/n0"]


def _fake_gpus() -> None:
    for i in range(GPUS):
        path = f"/dev/nvidia{i}"
        if not os.path.exists(path):
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, i))


def _container(
    work: Path, name: str, *, privileged: bool = True, bounding: list[str] | None = None
) -> dict[str, Any]:
    """A privileged-like container holding every card (else a plain one with the ``bounding``
    set), created and waiting at the exec fifo."""
    cid = secrets.token_hex(32)
    cards = [
        {"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i, "fileMode": 0o666}
        for i in range(GPUS)
    ]
    b = build_bundle(
        work / name,
        probe_args(PROBES),
        devices=cards if privileged else [],
        cgroup_devices=[{"allow": True, "access": "rwm"}] if privileged else None,
    )
    if bounding is not None:
        b.config["process"]["capabilities"] = {k: bounding for k in ("bounding", "effective", "permitted")}
    b.config["linux"]["cgroupsPath"] = f"/odh-live/{cid}"
    b.write()
    os.mknod(b.rootfs / "tmp" / "n0", 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    out = open(work / f"{name}.out", "w")  # noqa: SIM115 - the container writes here after start
    state = work / "runc-state"
    subprocess.run(
        [RUNC, "--root", str(state), "create", "--bundle", str(b.path), cid],
        check=True,
        stdout=out,
        stderr=out,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    st = json.loads(
        subprocess.run(
            [RUNC, "--root", str(state), "state", cid], check=True, capture_output=True, text=True
        ).stdout
    )
    return {
        "id": cid,
        "pid": st["pid"],
        "cgroups_path": f"/odh-live/{cid}",
        "out": work / f"{name}.out",
        "state": state,
    }


def _run_and_probe(c: dict[str, Any]) -> dict[str, str]:
    subprocess.run([RUNC, "--root", str(c["state"]), "start", c["id"]], check=True, timeout=30)
    for _ in range(200):
        st = subprocess.run(
            [RUNC, "--root", str(c["state"]), "state", c["id"]], capture_output=True, text=True
        )
        if '"stopped"' in st.stdout:
            break
        time.sleep(0.05)
    subprocess.run([RUNC, "--root", str(c["state"]), "delete", "-f", c["id"]], timeout=30)
    return parse_probe(Path(c["out"]).read_text())


def _count_forks() -> list[int]:
    """``os.fork`` counted from here on (the daemon narrows in a thread: none is expected)."""
    calls: list[int] = []
    real = os.fork

    def counted() -> int:
        calls.append(1)
        return real()

    os.fork = counted
    return calls


def _count_decisions() -> list[int]:
    """``hook.core.decide.decide`` counted from here on (the daemon's, in this process)."""
    from hook.core import decide as module

    calls: list[int] = []
    real = module.decide

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*args, **kw)

    module.decide = counted  # type: ignore[assignment]
    return calls


def _ctr(c: dict[str, Any], *, pid: int | None = None, cgroups_path: str | None = None) -> bytes:
    return f.container(
        c["id"],
        sandbox="p" * 64,
        name=CONTAINER,
        state=3,
        rules=[f.rule(True)],
        devices=[f.device(f"/dev/nvidia{i}", "c", 195, i) for i in range(GPUS)],
        cgroups_path=c["cgroups_path"] if cgroups_path is None else cgroups_path,
        pid=c["pid"] if pid is None else pid,
    )


def _event(c: dict[str, Any], **kw: Any) -> bytes:
    return f.event(f.pod(id="p" * 64, uid=POD_UID, name="trainer", namespace="ml"), _ctr(c, **kw))


def main(work: Path, case: str) -> dict[str, Any]:
    _fake_gpus()
    root = work / "driver-root"
    make_host_tree(root, "8x-mig", mknod=True)
    ck = work / "kubelet_internal_checkpoint"
    ck.write_bytes(checkpoint([checkpoint_entry("nvidia.com/gpu", ["1"])]))
    settings = work / "settings.yaml"
    settings.write_text(json.dumps({"log_file": str(work / "hook.log"), "cache_dir": str(work / "cache"),
                                    "driver_root": str(root), "kubelet_checkpoint": str(ck)}))  # fmt: skip
    result: dict[str, Any] = {}
    forks = _count_forks()
    decisions = _count_decisions()
    # narrow: privileged as engines make one, CAP_SYS_ADMIN in its bounding set (create assumes it)
    a = _container(work, "a", bounding=["CAP_SYS_ADMIN"] if case == "narrow" else None)
    rt = f.FakeRuntime(work / "nri.sock")
    f.start_daemon(work / "nri.sock", settings, sessions=2, sleep=lambda _s: None)
    if case in ("late", "restart"):  # a started container the daemon never saw: Synchronize lists it
        rt.accept()
        rt.call("Configure", f.configure())
        t0 = time.monotonic()
        sync = f.synchronize([f.pod(id="p" * 64, uid=POD_UID, name="trainer", namespace="ml")], [_ctr(a)])
        result["sync"] = rt.call("Synchronize", sync).code
        rt.reply_register()
        log = work / "hook.log"
        while time.monotonic() - t0 < 10 and not (log.exists() and '"late": true' in log.read_text()):
            time.sleep(0.05)
        result["late_seconds"] = round(time.monotonic() - t0, 3)
        if case == "restart":  # a new daemon (no memory) on a new socket: a is narrowed already
            rt.close()
            rt = f.FakeRuntime(work / "nri2.sock")
            f.start_daemon(work / "nri2.sock", settings, sessions=1, sleep=lambda _s: None)
            rt.accept()
            rt.call("Configure", f.configure())
            rt.call("Synchronize", sync)
            rt.reply_register()
            while time.monotonic() - t0 < 20 and log.read_text().count("\n") < 2:
                time.sleep(0.05)
    else:
        rt.handshake()
    if case == "narrow":
        created = rt.call("CreateContainer", _event(a, pid=0))
        result["create"] = [created.code, created.message]
        started = rt.call("StartContainer", _event(a))
        result["start"] = [started.code, started.message]
    if case == "attack":
        b = _container(work, "b")
        helper = subprocess.Popen(["unshare", "-m", "sleep", "30"])
        from hook.adapters.apply.locate import find

        # a process of the daemon's own mount namespace, moved into container a's device cgroup
        inside = subprocess.Popen(["sleep", "30"])
        (Path(find(a["pid"]).path) / "cgroup.procs").write_text(f"{inside.pid}\n")
        time.sleep(0.3)
        tries = {
            "daemon-pid": _event(a, pid=os.getpid()),
            "init": _event(a, pid=1),
            "parent": _event(a, pid=os.getppid()),
            "other-container-pid": _event(a, pid=b["pid"]),
            "other-container-pid-and-cgroup": _event(a, pid=b["pid"], cgroups_path=b["cgroups_path"]),
            "wrong-cgroup": _event(a, pid=helper.pid),
            "no-such-pid": _event(a, pid=4_000_000),
            "daemon-namespace-in-the-cgroup": _event(a, pid=inside.pid),
        }
        result["attack"] = {name: list(astuple(rt.call("StartContainer", ev))) for name, ev in tries.items()}
        helper.kill()
        inside.kill()
        result["b"] = _run_and_probe(b)
    if case == "caps":  # management caps need CAP_SYS_ADMIN: NRI does not say; the process does
        env = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all"]
        for name, bounding in (("without", []), ("with", ["CAP_SYS_ADMIN"])):
            c = _container(work, name, privileged=False, bounding=bounding)
            ctr = f.container(
                c["id"], sandbox="p" * 64, name=CONTAINER, state=1, env=env, cgroups_path=c["cgroups_path"]
            )
            created = rt.call("CreateContainer", f.event(f.pod(id="p" * 64, namespace="gpu-operator"), ctr))
            ctr = f.container(
                c["id"],
                sandbox="p" * 64,
                name=CONTAINER,
                env=env,
                cgroups_path=c["cgroups_path"],
                pid=c["pid"],
            )
            started = rt.call("StartContainer", f.event(f.pod(id="p" * 64, namespace="gpu-operator"), ctr))
            result[name] = {
                "create": [created.code, len(f.adjust_of(created.payload)["devices"])],
                "start": [started.code, started.message],
            }
            subprocess.run([RUNC, "--root", str(c["state"]), "delete", "-f", c["id"]], timeout=30)
    rt.close()
    result["forks"] = len(forks)  # the daemon's own (subprocess and runc fork through fork_exec)
    result["decisions"] = len(decisions)
    result["a"] = _run_and_probe(a)
    log = work / "hook.log"
    result["records"] = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return result


def astuple(r: Any) -> tuple[int, str]:
    return r.code, r.message


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2]), default=str))
