"""Issue 23 with real runc (cgroup v1 and v2): a container decided by the warm decider ends exactly
as one decided in-process (same probes: cgroup and /dev; same log record), the decider notices a
changed spec file, inventory or settings between two starts, and a decider killed at an apply
step leaves the container refused, never half-applied.

The decider runs in the container's private host view (``tests.live.decider``); its status
(request count) proves it served, so a silent fallback cannot pass for a served start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.live.decider import run_served, serve_args_of, with_decider
from tests.live.livekit import Bundle, build_bundle, parse_probe, private_host, probe_args, run_container
from tests.live.test_hook_scenarios import (
    CAPS_MAJOR,
    MIG_UUID,
    OWN_CI,
    OWN_GI,
    REPO,
    SIBLING_GI,
    SLICE_UUID,
    privileged,
    slice_pod,
    the_hook,
)

V1V2 = pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
VOLATILE = ("time", "program_ids", "duration_ms")  # clocks, and kernel-assigned eBPF program ids


def records(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        rec = json.loads(line)
        for key in VOLATILE:
            rec.pop(key, None)
        out.append(rec)
    return out


def mig_pod(bundle_dir: Path, host: dict[str, Path]) -> Bundle:
    own = [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (OWN_GI, OWN_CI)]
    return privileged(
        bundle_dir,
        host,
        [],
        ["/dev/nvidia0", *own, "/dev/nvidia1", f"/dev/nvidia-caps/nvidia-cap{SIBLING_GI}", "/tmp/sib"],
        mknods=[("/tmp/sib", CAPS_MAJOR, SIBLING_GI)],
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": f"nvidia.com/gpu={MIG_UUID}"},
        cdi=(REPO / "examples" / "node" / "cdi",),
    )


def plain(bundle_dir: Path, host: dict[str, Path]) -> Bundle:
    return build_bundle(bundle_dir, probe_args(["/dev/null", "/dev/nvidia0"]), hooks=the_hook(host))


def cdi_container(bundle_dir: Path, host: dict[str, Path]) -> Bundle:
    """A plain container asking for one GPU by a CDI annotation (outside Kubernetes)."""
    cdi = REPO / "examples" / "node" / "cdi"
    return build_bundle(
        bundle_dir,
        probe_args(["/dev/nvidia1", "/dev/nvidia0"]),
        hooks=the_hook(host, cdi),
        annotations={"cdi.k8s.io/x": f"nvidia.com/gpu={SLICE_UUID}"},
    )


# maker, verdict; each start is served: a fresh private /run holds no fast-path record for the
# test's custom settings, so even the plain container takes the full path (decided "none")
CASES = {
    "slice": (slice_pod, "apply"),
    "mig": (mig_pod, "apply"),
    "plain": (plain, "none"),
    "cdi": (cdi_container, "apply"),
}


@V1V2
@pytest.mark.parametrize("case", sorted(CASES))
def test_served_and_in_process_starts_are_identical(
    bundle_dir: Path, host: dict[str, Path], tmp_path: Path, case: str, cgroup2: bool
) -> None:
    make, verdict = CASES[case]
    b = make(bundle_dir, host)
    alone = run_container(b, cgroup2=cgroup2)
    with_it, status = run_served(b, tmp_path / "status.json", cgroup2=cgroup2)
    assert alone.rc == with_it.rc == 0, (alone.stderr, with_it.stderr)
    assert parse_probe(alone.stdout) == parse_probe(with_it.stdout)
    assert parse_probe(alone.stdout)  # the probes ran
    assert status.get("requests") == 1, status  # the decider served it
    first, second = records(host["log"])
    assert "decider" not in first and second.pop("decider") == "answered"
    assert first == second and first["verdict"] == verdict


def deny_pod(bundle_dir: Path, host: dict[str, Path]) -> Bundle:
    """The slice pod under ``privileged_allocation: reject``: refused (exit 3), nothing applied."""
    host["settings"].write_text(host["settings"].read_text() + "privileged_allocation: reject\n")
    return slice_pod(bundle_dir, host)


def refused_pod(bundle_dir: Path, host: dict[str, Path]) -> Bundle:
    """The MIG pod with no CDI spec for its device: an error (exit 1), nothing applied."""
    b = mig_pod(bundle_dir, host)
    b.config["hooks"] = the_hook(host)  # the empty spec dir
    return b.write()


REFUSALS = {"deny": (deny_pod, "deny", 3), "refused": (refused_pod, "error", 1)}


@V1V2
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_served_and_in_process_refusals_are_identical(
    bundle_dir: Path, host: dict[str, Path], tmp_path: Path, case: str, cgroup2: bool
) -> None:
    make, verdict, code = REFUSALS[case]
    b = make(bundle_dir, host)
    alone = run_container(b, cgroup2=cgroup2)
    with_it, status = run_served(b, tmp_path / "status.json", cgroup2=cgroup2)
    assert alone.rc != 0 and with_it.rc != 0 and not parse_probe(alone.stdout + with_it.stdout)
    hook_lines = [
        [ln.split("stderr: ", 1)[-1] for ln in r.stderr.splitlines() if "oci-device-hook" in ln]
        for r in (alone, with_it)
    ]
    assert hook_lines[0] == hook_lines[1] != [], hook_lines
    assert all(f"exit status {code}," in r.stderr for r in (alone, with_it))  # the hook's own status
    assert status.get("requests") == 1, status
    first, second = records(host["log"])
    assert "decider" not in first and second.pop("decider") == "answered"
    assert first == second and first["verdict"] == verdict


@V1V2
def test_a_served_dra_pod_is_the_in_process_one(bundle_dir: Path, tmp_path: Path, cgroup2: bool) -> None:
    """The privileged DRA pod of tests/live/test_dra_live.py (its claim's GPU only)."""
    from tests.dra_shapes import dra_state, injected_nodes, write_claim_spec
    from tests.live.test_dra_live import CLAIM, Node, gpu_claim

    node = Node(tmp_path, "4x-k8s")
    write_claim_spec(node.cdi, CLAIM, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(2)]))
    b = node.pod(bundle_dir, "containerd", injected_nodes(gpus=[2]))
    alone = run_container(b, cgroup2=cgroup2)
    with_it, status = run_served(b, tmp_path / "status.json", cgroup2=cgroup2)
    assert alone.rc == with_it.rc == 0, (alone.stderr, with_it.stderr)
    assert parse_probe(alone.stdout) == parse_probe(with_it.stdout)
    node.only(parse_probe(with_it.stdout), 2)
    assert status.get("requests") == 1, status
    first, second = records(tmp_path / "hook.log")
    assert "decider" not in first and second.pop("decider") == "answered"
    assert first == second and first["verdict"] == "apply"


def two_starts(b1: Bundle, b2: Bundle, change: str, out: Path) -> tuple[int, int, dict[str, Any]]:
    """Start ``b1``, run the shell line ``change``, start ``b2``, all under one decider."""
    from tests.live.livekit import RUNC, _quote

    def run(b: Bundle, name: str) -> str:
        cmd = [RUNC, "--root", str(b.path / "runc-state"), "run", "--bundle", str(b.path), b.id]
        delete = [RUNC, "--root", str(b.path / "runc-state"), "delete", "-f", b.id]
        return (
            " ".join(map(_quote, cmd))
            + f" > {out}.{name} 2>&1 </dev/null; echo $? >> {out}.rc; "
            + " ".join(map(_quote, delete))
            + " >/dev/null 2>&1"
        )

    script = f"{run(b1, 'one')}; {change}; {run(b2, 'two')}"
    cmd = private_host(with_decider(["sh", "-c", script], out, serve_args=serve_args_of(b1)))
    import subprocess

    subprocess.run(cmd, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    rc1, rc2 = (int(x) for x in Path(f"{out}.rc").read_text().split())
    return rc1, rc2, json.loads(out.read_text())


def test_a_removed_spec_file_is_seen_at_the_next_start(host: dict[str, Path], tmp_path: Path) -> None:
    specs = tmp_path / "cdi"
    shutil.copytree(REPO / "examples" / "node" / "cdi", specs)
    makes = []
    for name in ("b1", "b2"):
        b = mig_pod(tmp_path / name, host)
        b.config["hooks"] = the_hook(host, specs)
        makes.append(b.write())
    rc1, rc2, status = two_starts(*makes, f"rm -f {specs}/*", tmp_path / "status.json")
    assert (rc1, status["requests"]) == (0, 2), status
    assert rc2 != 0  # its CDI device is gone: refused, not decided from the old registry
    assert "unresolvable CDI devices" in Path(f"{tmp_path / 'status.json'}.two").read_text()


def test_a_changed_inventory_is_seen_at_the_next_start(host: dict[str, Path], tmp_path: Path) -> None:
    """The slice's card leaves the driver's /proc (a GPU gone, a MIG reconfiguration)."""
    gpus = host["root"] / "proc" / "driver" / "nvidia" / "gpus"
    card = next(d for d in gpus.iterdir() if SLICE_UUID in (d / "information").read_text())
    b1, b2 = slice_pod(tmp_path / "b1", host), slice_pod(tmp_path / "b2", host)
    rc1, rc2, status = two_starts(b1, b2, f"mv {card} {tmp_path}/gone", tmp_path / "status.json")
    assert (rc1, status["requests"]) == (0, 2), status
    assert rc2 != 0
    assert SLICE_UUID in Path(f"{tmp_path / 'status.json'}.two").read_text()


def test_changed_settings_are_seen_at_the_next_start(host: dict[str, Path], tmp_path: Path) -> None:
    """The second start logs where the edited settings say (a kept view would log to the old file)."""
    b1, b2 = slice_pod(tmp_path / "b1", host), slice_pod(tmp_path / "b2", host)
    moved = tmp_path / "moved.log"
    edit = f"sed -i 's#^log_file: .*#log_file: {moved}#' {host['settings']}"
    rc1, rc2, status = two_starts(b1, b2, edit, tmp_path / "status.json")
    assert (rc1, rc2, status["requests"]) == (0, 0, 2), status
    assert len(records(host["log"])) == 1 and len(records(moved)) == 1


STRACE = shutil.which("strace")


def _path(call: str) -> str:
    """The path an ``-y`` traced call names (its dirfd's path joined with a relative name)."""
    quoted = call.split('"')
    name = quoted[1] if len(quoted) > 1 else call
    if name.startswith("/") or "<" not in quoted[0]:
        return name
    return quoted[0].split("<", 1)[1].split(">", 1)[0] + "/" + name


# what the decider opens for writing and may: its socket dir and fast-path record, its key, the
# settings' cache (marker key, inventory), and Python's own bytecode cache
MAY_WRITE = ("/run/oci-device-hook/", "/var/lib/oci-device-hook/", "__pycache__")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_the_decider_writes_nothing_for_a_request(
    bundle_dir: Path, host: dict[str, Path], tmp_path: Path, cgroup2: bool
) -> None:
    """Issue 27 item 1: the decider decides; the hook applies and logs. Traced from its start, the
    decider opens no cgroup, ``/dev`` or log file for writing, loads no eBPF program and makes no
    node, while the slice pod it decided for is narrowed exactly as in-process."""
    trace = tmp_path / "decider.strace"
    wrap = [
        STRACE,
        "-f",
        "-qq",
        "-y",  # a dirfd is shown with its path: openat(3</run/oci-device-hook>, ...)
        "-o",
        str(trace),
        "-e",
        "trace=openat,open,creat,mknodat,mknod,bpf,rename,renameat2,unlink,unlinkat",
    ]
    b = slice_pod(bundle_dir, host)
    res, status = run_served(b, tmp_path / "status.json", cgroup2=cgroup2, serve_wrap=wrap)
    assert res.rc == 0, res.stderr
    assert status.get("requests") == 1, status
    assert parse_probe(res.stdout) == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
    cache = str(tmp_path / "cache") + "/"
    wrote = []
    for line in trace.read_text().splitlines():
        call = line.split(None, 1)[-1]
        if call.startswith(("bpf(BPF_PROG_LOAD", "mknod")):
            wrote.append(call)
        elif call.startswith(("open", "creat")) and (
            "O_WRONLY" in call or "O_RDWR" in call or "O_CREAT" in call
        ):
            path = _path(call)
            if not (path.startswith(cache) or any(part in path for part in MAY_WRITE)):
                wrote.append(call)
        elif call.startswith(("rename", "unlink")) and " = 0" in call:
            paths = [_path(call)]
            if not all(p.startswith(cache) or any(part in p for part in MAY_WRITE) for p in paths):
                wrote.append(call)
    assert wrote == [], wrote
    (record,) = records(host["log"])
    assert record["verdict"] == "apply" and record["decider"] == "answered"


def test_a_fresh_daemonset_node_serves(tmp_path: Path) -> None:
    """Issue 36 item 6: on a fresh node the DaemonSet's hostPath ``DirectoryOrCreate`` makes the key
    dir root's 0755. The decider narrows it through its fd to 0700 and serves (the first design
    refused it and crash-looped, so every hook decided in-process)."""
    out = tmp_path / "status.json"
    probe = ["sh", "-c", "stat -c 'KEYDIR %a' /var/lib/oci-device-hook; ls /var/lib/oci-device-hook"]
    fresh = ["sh", "-c", 'chmod 0755 /var/lib/oci-device-hook && exec "$@"', "fresh-node"]
    proc = subprocess.run(
        private_host([*fresh, *with_decider(probe, out)]),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    status = json.loads(out.read_text()) if out.exists() else {}
    assert "KEYDIR 700" in proc.stdout and "decider.key" in proc.stdout, (proc.stdout, proc.stderr)
    assert isinstance(status.get("pid"), int), (status, Path(f"{out}.err").read_text())
