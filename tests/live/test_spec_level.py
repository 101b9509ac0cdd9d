"""Live, spec level: podman's hooks.d ``precreate`` stage and containerd through the runtime wrapper.

The same seed 000 pods as the prestart scenarios (tests/live/test_hook_scenarios.py), with the
same probes: the allocated node is ENXIO (allowed, no driver behind the fake node), every other
accelerator ENOENT (never created) and, re-created by hand, EPERM (the runtime's own cgroup
rules deny it). Nothing here runs a hook after the runtime started the container: the decided
config.json is all runc gets.

podman runs inside ``unshare -m`` with a private tmpfs ``/dev`` holding the fake GPUs (podman's
``--privileged`` adds every node of ``/dev``); containerd is started by the test with its own
root, state and socket under a temp dir, and killed by pid. Each container has its own cgroup
under ``/odh-live`` (containerd) or podman's ``libpod_parent`` (cgroupfs), never the root one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.marker import ANNOTATION
from tests.hosttree import CAPS_MAJOR, cap_minor, make_host_tree
from tests.live.livekit import (
    BASIC_DEV,
    RUNC,
    build_bundle,
    build_rootfs,
    parse_probe,
    private_host,
    probe_args,
)
from tests.live.test_hook_scenarios import CAPS, MIG_UUID, SLICE_UUID, host_nodes

REPO = Path(__file__).resolve().parents[2]
CDI = REPO / "examples" / "node" / "cdi"
OWN = [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (cap_minor(0, 1), cap_minor(0, 1, 0))]
SIBLING = f"/dev/nvidia-caps/nvidia-cap{cap_minor(0, 2)}"
SLICE_PROBES = ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia7", "/tmp/n0", "/dev/null"]
MIG_PROBES = ["/dev/nvidia0", *OWN, "/dev/nvidia1", SIBLING, "/tmp/sib", "/tmp/cfg"]
SLICE_ENV = [f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}", "CUDA_DEVICE_MEMORY_LIMIT_0=40779m"]
MIG_ANNOTATION = {"cdi.k8s.io/nvidia-device-plugin_x": f"nvidia.com/gpu={MIG_UUID}"}
PLANTED = [("tmp/n0", 195, 0), ("tmp/sib", CAPS_MAJOR, cap_minor(0, 2)), ("tmp/cfg", CAPS_MAJOR, 1)]

SLICE_EXPECTED = {
    "/dev/nvidia1": "ENXIO",  # the allocated card
    "/dev/nvidiactl": "ENXIO",  # a control node
    "/dev/nvidia0": "ENOENT",  # other cards: never created...
    "/dev/nvidia7": "ENOENT",
    "/tmp/n0": "EPERM",  # ...and denied by the runtime's own rules when re-created
    "/dev/null": "OK",
}
MIG_EXPECTED = {
    "/dev/nvidia0": "ENXIO",
    **dict.fromkeys(OWN, "ENXIO"),
    "/dev/nvidia1": "ENOENT",
    SIBLING: "ENOENT",
    "/tmp/sib": "EPERM",
    "/tmp/cfg": "EPERM",
}


IN_NS_RUN = 'mount -t tmpfs -o mode=0755 tmpfs /run && mkdir /run/oci-device-hook && exec "$@"'


def _hook_exe() -> str:
    return shutil.which("hook") or f"{sys.executable} -m hook"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Fake driver root, busybox rootfs with planted nodes, settings, and an installed-like libexec.

    ``libexec/hook`` records the config it got and the one it gave (``rec/in.json``, ``rec/out.json``)
    around the real console script, so a test can tell "untouched" from "decided".
    """
    base = tmp_path_factory.mktemp("spec-level")
    driver = base / "driver"
    make_host_tree(driver, "8x-mig", mknod=True)
    rootfs = build_rootfs(base / "rootfs")
    (rootfs / "etc/group").write_text("root:x:0:\n")
    for rel, major, minor in PLANTED:
        os.mknod(rootfs / rel, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    settings = base / "config.yaml"
    settings.write_text(
        f"log_file: {base / 'hook.log'}\ncache_dir: {base / 'cache'}\n"
        f"driver_root: {driver}\ncdi_spec_dirs: [{CDI}]\n"
        f"runtime: {shutil.which('runc') or '/usr/sbin/runc'}\n"
    )
    rec = base / "rec"
    rec.mkdir()
    libexec = base / "libexec"
    libexec.mkdir()
    shutil.copy2(REPO / "packaging" / "runtime", libexec / "runtime")
    # the wrapper's `hook runtime-wrapper` reads the bundle's config itself (no stdin) and execs the
    # runtime: its reads and its replacement are recorded from inside, in the same process
    record = (
        "import sys; import hook.routes.wrapper as w\n"
        "read, replace = w._read_config, w._replace\n"
        "def rd(path):\n"
        "    data = read(path)\n"
        f"    for name in ('in.json', 'out.json'): open('{rec}/' + name, 'wb').write(data)\n"
        "    return data\n"
        "def rp(path, data):\n"
        f"    open('{rec}/out.json', 'wb').write(data)\n"
        "    replace(path, data)\n"
        "w._read_config, w._replace = rd, rp\n"
        "from hook.entry import run\n"
        'sys.argv = ["hook", *sys.argv[1:]]\n'
        "run()\n"
    )
    (libexec / "record.py").write_text(record)
    (libexec / "hook").write_text(
        f'#!/bin/sh\nif [ "$1" = runtime-wrapper ]; then exec {sys.executable} {libexec}/record.py "$@"; fi\n'
        f'cat >{rec}/in.json\n{_hook_exe()} "$@" <{rec}/in.json >{rec}/out.json\nrc=$?\n'
        f"cat {rec}/out.json\nexit $rc\n"
    )
    (libexec / "hook").chmod(0o755)
    # podman refuses a runroot of more than 50 characters: the temp root of a parallel run
    # (.../pytest-N/popen-gw0/spec-level0/run) is longer, so podman's run state gets a short dir
    runroot = Path(tempfile.mkdtemp(prefix="odhs-", dir="/tmp"))
    yield {
        "base": base,
        "driver": driver,
        "rootfs": rootfs,
        "settings": settings,
        "rec": rec,
        "libexec": libexec,
        "runroot": runroot,
    }
    shutil.rmtree(runroot, ignore_errors=True)


def _records(world: dict[str, Path]) -> tuple[bytes, bytes]:
    return (world["rec"] / "in.json").read_bytes(), (world["rec"] / "out.json").read_bytes()


def _clear(world: dict[str, Path]) -> None:
    for name in ("in.json", "out.json"):
        (world["rec"] / name).unlink(missing_ok=True)


# --- podman: hooks.d precreate ---------------------------------------------------------------------


def _hooks_dir(world: dict[str, Path]) -> Path:
    """packaging/engines/oci-device-hook-precreate.json, pointed at this test's hook and settings."""
    doc = json.loads((REPO / "packaging/engines/oci-device-hook-precreate.json").read_text())
    doc["hook"]["path"] = str(world["libexec"] / "hook")
    doc["hook"]["args"] += ["--config", str(world["settings"])]
    hooks = world["base"] / "hooks.d"
    hooks.mkdir(exist_ok=True)
    (hooks / "oci-device-hook-precreate.json").write_text(json.dumps(doc))
    return hooks


def _in_fake_dev(world: dict[str, Path], cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in a private mount namespace whose /dev holds the fake GPUs (and a private /run)."""
    script = world["base"] / "in-namespace.sh"
    script.write_text(
        "set -eu\nmount -t tmpfs -o mode=0755 tmpfs /run; mkdir /run/oci-device-hook\n"
        "mount -t tmpfs -o mode=0755,nosuid tmpfs /dev\n"
        f"cp -a {world['driver']}/dev/. /dev/\n" + BASIC_DEV + 'exec "$@"\n'
    )
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", str(script), *cmd],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _podman_cmd(world: dict[str, Path], hooks: Path, args: list[str], probes: list[str]) -> list[str]:
    base = world["base"]
    return [
        "podman", "--runtime", "runc", "--root", str(base / "storage"), "--runroot", str(world["runroot"]),
        "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
        "--hooks-dir", str(hooks), "run", "--rm", "--network", "none",
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", *args,
        "--rootfs", str(world["rootfs"]), *probe_args(probes),
    ]  # fmt: skip


def _podman(world: dict[str, Path], hooks: Path, args: list[str], probes: list[str]) -> dict[str, str]:
    proc = _in_fake_dev(world, _podman_cmd(world, hooks, args, probes))
    assert proc.returncode == 0, f"podman exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return parse_probe(proc.stdout)


needs_podman = pytest.mark.skipif(shutil.which("podman") is None, reason="podman not installed")


@needs_podman
def test_podman_without_the_hook_sees_every_gpu(world: dict[str, Path]) -> None:
    """The control run: the probes can tell allowed (ENXIO) from narrowed."""
    empty = world["base"] / "no-hooks"
    empty.mkdir(exist_ok=True)
    seen = _podman(world, empty, ["--privileged", *(f"--env={e}" for e in SLICE_ENV)], SLICE_PROBES)
    assert {p: seen[p] for p in ("/dev/nvidia0", "/dev/nvidia7", "/tmp/n0")} == dict.fromkeys(
        ("/dev/nvidia0", "/dev/nvidia7", "/tmp/n0"), "ENXIO"
    )


@needs_podman
def test_podman_precreate_narrows_the_slice_pod(world: dict[str, Path]) -> None:
    _clear(world)
    seen = _podman(
        world, _hooks_dir(world), ["--privileged", *(f"--env={e}" for e in SLICE_ENV)], SLICE_PROBES
    )
    assert seen == SLICE_EXPECTED
    decided = json.loads(_records(world)[1])
    assert ANNOTATION in decided["annotations"]
    assert decided["linux"]["resources"]["devices"][0] == {
        "allow": False, "type": "a", "major": None, "minor": None, "access": "rwm"
    }  # fmt: skip
    assert all(r["allow"] for r in decided["linux"]["resources"]["devices"][1:])


@needs_podman
def test_a_precreate_refusal_shows_as_an_exit_status_in_podman_and_its_reason_in_the_log(
    world: dict[str, Path],
) -> None:
    """Issue 22, item 5 (docs/operators.md, "Spec level"): podman runs a precreate hook with no
    stderr (containers/common ``pkg/hooks/exec`` ``RuntimeConfigFilter`` passes nil), so its
    error is only "exit status 3"; the reason is the hook's log line, which ``hook log`` shows."""
    settings = world["settings"]
    original = settings.read_text()
    settings.write_text(original + "privileged_allocation: reject\n")
    try:
        args = ["--privileged", *(f"--env={e}" for e in SLICE_ENV)]
        proc = _in_fake_dev(world, _podman_cmd(world, _hooks_dir(world), args, SLICE_PROBES))
        shown = subprocess.run(
            [*_hook_exe().split(), "log", "--config", str(settings), "--verdict", "deny", "--since", "10m"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        settings.write_text(original)
    assert proc.returncode != 0 and "exit status 3" in proc.stderr, proc.stderr
    assert "policy: reject" not in proc.stderr  # podman never shows the hook's own line...
    last = json.loads((world["base"] / "hook.log").read_text().splitlines()[-1])
    assert (last["verdict"], last["stage"]) == ("deny", "precreate")
    assert last["reason"].endswith("(policy: reject)")
    assert shown.returncode == 0 and last["reason"] in shown.stdout  # ...`hook log` does


@needs_podman
def test_podman_prestart_registered_too_trusts_the_marker(world: dict[str, Path]) -> None:
    """Both stages registered: precreate decides, podman re-encodes the config, runc's prestart hook
    verifies the marker on what it got and does nothing more."""
    hooks = _hooks_dir(world)
    prestart = json.loads((REPO / "nvidia-hook.json").read_text())
    prestart["hook"]["path"] = sys.executable
    prestart["hook"]["args"] = [
        sys.executable,
        "-I",
        "-m",
        "hook",
        "prestart",
        "--config",
        str(world["settings"]),
    ]
    (hooks / "oci-device-hook.json").write_text(json.dumps(prestart))
    try:
        seen = _podman(world, hooks, ["--privileged", *(f"--env={e}" for e in SLICE_ENV)], SLICE_PROBES)
    finally:
        (hooks / "oci-device-hook.json").unlink()
    assert seen == SLICE_EXPECTED
    last = json.loads((world["base"] / "hook.log").read_text().splitlines()[-1])
    assert last["verdict"] == "none" and "decided at precreate" in last["reason"], last


@needs_podman
def test_podman_precreate_narrows_the_mig_pod(world: dict[str, Path]) -> None:
    args = ["--privileged", f"--annotation=cdi.k8s.io/nvidia-device-plugin_x=nvidia.com/gpu={MIG_UUID}"]
    assert _podman(world, _hooks_dir(world), args, MIG_PROBES) == MIG_EXPECTED


@needs_podman
def test_podman_plain_container_is_untouched(world: dict[str, Path]) -> None:
    _clear(world)
    seen = _podman(world, _hooks_dir(world), [], ["/dev/nvidia0", "/tmp/n0", "/dev/null"])
    assert seen == {"/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM", "/dev/null": "OK"}
    given, returned = _records(world)
    assert given == returned  # byte for byte


# --- containerd: the runtime wrapper ----------------------------------------------------------------


@pytest.fixture(scope="module")
def containerd(world: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """A containerd of our own (root, state, socket under a temp dir), with the wrapper's settings
    in its environment as an operator would set them; killed by pid afterwards."""
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("containerd not installed (apt-get install containerd)")
    base = world["base"] / "containerd"
    base.mkdir()
    sock = base / "c.sock"
    config = base / "config.toml"
    disabled = [
        "io.containerd.grpc.v1.cri", "io.containerd.internal.v1.tracing",
        "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
        "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
    ]  # fmt: skip
    config.write_text(
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
        f"disabled_plugins = {json.dumps(disabled)}\n"
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{base}/opt"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
    )
    env = {**os.environ, "OCI_DEVICE_HOOK_CONFIG": str(world["settings"])}
    log = open(base / "containerd.log", "wb")  # noqa: SIM115 - closed after the daemon
    # in its own mount namespace with a private /run: the shims' sockets (/run/containerd/s, fixed in
    # 1.6) and the hook's fast-path cache (/run/oci-device-hook) never reach the host's /run
    cmd = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        IN_NS_RUN,
        "sh",
        "containerd",
        "--config",
        str(config),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.1)
        else:
            pytest.fail("containerd did not start: " + (base / "containerd.log").read_text()[-2000:])
        yield {"sock": sock, "ns": f"odh-{uuid.uuid4().hex[:8]}", "base": base}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _ctr(world: dict[str, Path], ctd: dict[str, Any], bundle: Any) -> subprocess.CompletedProcess[str]:
    bundle.config["root"] = {"path": str(world["rootfs"])}
    bundle.write()
    wrapper = str(world["libexec"] / "runtime")
    cmd = ["ctr", "--address", str(ctd["sock"]), "-n", ctd["ns"], "run", "--rm",
           "--fifo-dir", str(ctd["base"] / "fifo"), "--runc-root", str(ctd["base"] / "runc"),
           "--config", str(bundle.path / "config.json"), "--runc-binary", wrapper, bundle.id]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _ctr_run(world: dict[str, Path], ctd: dict[str, Any], bundle: Any) -> dict[str, str]:
    """``ctr run --rm --config <bundle>/config.json --runc-binary <wrapper> ID`` (with --config, ctr
    takes the whole spec from the file, so root.path is made absolute)."""
    proc = _ctr(world, ctd, bundle)
    assert proc.returncode == 0, f"ctr exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return parse_probe(proc.stdout)


def _privileged_bundle(
    dest: Path, env: list[str], probes: list[str], annotations: dict[str, str] | None = None
):
    """containerd's privileged shape (WithPrivileged): allow-all, every host node, every capability."""
    b = build_bundle(
        dest, probe_args(probes), devices=host_nodes(), cgroup_devices=[{"allow": True, "access": "rwm"}],
        env=["PATH=/bin", *env], annotations=annotations,
    )  # fmt: skip
    caps = [*CAPS, "CAP_SYS_ADMIN"]
    b.config["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    return b


def test_containerd_wrapper_narrows_the_slice_pod(
    world: dict[str, Path], containerd: dict[str, Any], tmp_path: Path
):
    _clear(world)
    seen = _ctr_run(world, containerd, _privileged_bundle(tmp_path / "b", SLICE_ENV, SLICE_PROBES))
    assert seen == SLICE_EXPECTED
    assert ANNOTATION in json.loads(_records(world)[1])["annotations"]


def test_ctr_privileged_rootfs_slice_pod(world: dict[str, Path], containerd: dict[str, Any]) -> None:
    """``ctr run --privileged --rootfs DIR --runc-binary <wrapper> ID CMD``: ctr builds the privileged
    spec itself (allow-all, every node of its /dev: the fake GPUs), the wrapper narrows it."""

    def ctr(*runtime: str) -> dict[str, str]:
        cid = f"odh-{uuid.uuid4().hex[:10]}"
        base = containerd["base"]
        cmd = ["ctr", "--address", str(containerd["sock"]), "-n", containerd["ns"], "run", "--rm",
               "--privileged", "--fifo-dir", str(base / "fifo"), "--runc-root", str(base / "runc"),
               "--cgroup", f"/odh-live/{cid}", *(f"--env={e}" for e in SLICE_ENV), *runtime,
               "--rootfs", str(world["rootfs"]), cid, *probe_args(SLICE_PROBES)]  # fmt: skip
        proc = _in_fake_dev(world, cmd)
        assert proc.returncode == 0, f"ctr exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return parse_probe(proc.stdout)

    assert ctr()["/dev/nvidia0"] == "ENXIO"  # control: plain runc, every card reachable
    _clear(world)
    assert ctr("--runc-binary", str(world["libexec"] / "runtime")) == SLICE_EXPECTED
    assert ANNOTATION in json.loads(_records(world)[1])["annotations"]


def test_containerd_wrapper_narrows_the_mig_pod(
    world: dict[str, Path], containerd: dict[str, Any], tmp_path: Path
):
    b = _privileged_bundle(tmp_path / "b", [], MIG_PROBES, MIG_ANNOTATION)
    assert _ctr_run(world, containerd, b) == MIG_EXPECTED


def test_wrapper_runs_crun_on_cgroup_v2(world: dict[str, Path], tmp_path: Path) -> None:
    """``runtime: crun``: the wrapper decides, then crun applies the allow-list as its own eBPF program
    (cgroup2 mounted in a private mount namespace, as in the prestart crun scenario)."""
    crun = shutil.which("crun")
    if crun is None:
        pytest.skip("crun not installed")
    settings = tmp_path / "crun.yaml"
    kept = [ln for ln in world["settings"].read_text().splitlines() if not ln.startswith("runtime:")]
    settings.write_text("\n".join([*kept, f"runtime: {crun}"]) + "\n")  # a duplicate key is an error
    b = _privileged_bundle(tmp_path / "b", SLICE_ENV, SLICE_PROBES)
    b.config["root"] = {"path": str(world["rootfs"])}
    b.write()
    state = tmp_path / "crun-state"
    run = f"{world['libexec'] / 'runtime'} --root {state} run --bundle {b.path} {b.id}"
    env = {**os.environ, "OCI_DEVICE_HOOK_CONFIG": str(settings)}
    try:
        private_run = "mount -t tmpfs tmpfs /run && mkdir /run/oci-device-hook"
        inner = f"{private_run} && mount -t cgroup2 none /sys/fs/cgroup && {run}"
        proc = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
    finally:
        subprocess.run([crun, "--root", str(state), "delete", "-f", b.id], capture_output=True, timeout=30)
    assert (b.path / "config.json.orig").exists()  # the wrapper decided before crun started
    assert ANNOTATION in json.loads((b.path / "config.json").read_text())["annotations"]
    if "setrlimit (RLIM_MEMLOCK)" in proc.stderr:
        # crun raises RLIMIT_MEMLOCK before loading its eBPF program, which needs CAP_SYS_RESOURCE;
        # this machine's bounding set lacks it (as in test_hook_scenarios' crun case)
        pytest.skip("crun cannot raise RLIMIT_MEMLOCK here (no CAP_SYS_RESOURCE); the decision was made")
    assert proc.returncode == 0, proc.stderr
    assert parse_probe(proc.stdout) == SLICE_EXPECTED


# Issue 21 item 6: spellings of the bundle option the old wrapper did not read (it fell back to the
# working directory, here a decoy holding the same privileged config, and ran the bundle's as is).
# Issue 28 item 6: only spellings every runtime reads the same are decided; one that only runc or
# only crun reads is refused, and nothing is written (the line may be the other runtime's).
SPELLINGS = {
    "runc": [["run", "--b", "{b}", "{id}"], ["run", "--bundle={b}", "{id}"]],
    "crun": [["run", "-b", "{b}", "{id}"], ["run", "--b={b}", "{id}"]],
}
ONE_RUNTIME_SPELLINGS = {
    "runc": [["run", "-bundle={b}", "{id}"], ["run", "{id}", "-b", "{b}"]],
    "crun": [["run", "-b{b}", "{id}"], ["run", "--bun={b}", "{id}"]],
}


def _spelled(world: dict[str, Path], tmp_path: Path, runtime: str, form: list[str]) -> tuple[Any, Any, Path]:
    binary = RUNC if runtime == "runc" else shutil.which("crun")
    assert binary is not None, "crun is installed where the suite runs (apt-get install crun)"
    settings = tmp_path / "settings.yaml"
    kept = [ln for ln in world["settings"].read_text().splitlines() if not ln.startswith("runtime:")]
    settings.write_text("\n".join([*kept, f"runtime: {binary}"]) + "\n")
    b = _privileged_bundle(tmp_path / "b", SLICE_ENV, SLICE_PROBES)
    b.config["root"] = {"path": str(world["rootfs"])}
    b.write()
    decoy = tmp_path / "cwd"
    decoy.mkdir()
    shutil.copy2(b.path / "config.json", decoy / "config.json")
    state = tmp_path / "state"
    args = [a.format(b=b.path, id=b.id) for a in form]
    env = {**os.environ, "OCI_DEVICE_HOOK_CONFIG": str(settings)}
    v2 = runtime == "crun"  # crun applies rules as eBPF: a unified cgroup2 view
    cmd = private_host([str(world["libexec"] / "runtime"), "--root", str(state), *args], cgroup2=v2)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              env=env, cwd=decoy)  # fmt: skip
    finally:
        delete = private_host([binary, "--root", str(state), "delete", "-f", b.id], cgroup2=v2)
        subprocess.run(delete, capture_output=True, timeout=30)
    return proc, b, decoy


@pytest.mark.parametrize(
    ("runtime", "form"),
    [(rt, f) for rt, forms in SPELLINGS.items() for f in forms],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_the_wrapper_decides_every_spelling_the_real_runtime_reads(
    world: dict[str, Path], tmp_path: Path, runtime: str, form: list[str]
) -> None:
    proc, b, decoy = _spelled(world, tmp_path, runtime, form)
    assert (b.path / "config.json.orig").exists(), proc.stderr  # decided where the runtime reads
    assert ANNOTATION in json.loads((b.path / "config.json").read_text())["annotations"]
    assert not (decoy / "config.json.orig").exists()
    if runtime == "crun" and "setrlimit (RLIM_MEMLOCK)" in proc.stderr:
        # as in test_wrapper_runs_crun_on_cgroup_v2: crun read the decided config (it reads config.json
        # before it loads its eBPF program) and stopped there; tests/test_runtimeargs.py shows which
        # file crun opens for this spelling
        return
    assert proc.returncode == 0, proc.stderr
    assert parse_probe(proc.stdout) == SLICE_EXPECTED


@pytest.mark.parametrize(
    ("runtime", "form"),
    [(rt, f) for rt, forms in ONE_RUNTIME_SPELLINGS.items() for f in forms],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_a_spelling_only_one_runtime_reads_is_refused_and_nothing_runs(
    world: dict[str, Path], tmp_path: Path, runtime: str, form: list[str]
) -> None:
    proc, b, decoy = _spelled(world, tmp_path, runtime, form)
    assert proc.returncode == 1 and "not every runtime would create" in proc.stderr, proc.stderr
    assert "PROBE" not in proc.stdout  # the runtime never ran the container
    for d in (b.path, decoy):
        assert not (d / "config.json.orig").exists()
        assert ANNOTATION not in json.loads((d / "config.json").read_text()).get("annotations", {})


def test_containerd_plain_container_is_untouched(
    world: dict[str, Path], containerd: dict[str, Any], tmp_path: Path
):
    _clear(world)
    b = build_bundle(tmp_path / "b", probe_args(["/dev/nvidia0", "/tmp/n0", "/dev/null"]))
    seen = _ctr_run(world, containerd, b)
    assert seen == {"/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM", "/dev/null": "OK"}
    given, returned = _records(world)
    assert given == returned


def test_containerd_shows_the_deny_line(world: dict[str, Path], containerd: dict[str, Any], tmp_path: Path):
    """A refused create: runc never runs, and containerd's error carries the hook's one line."""
    settings = world["settings"]
    saved = settings.read_text()
    settings.write_text(saved + "privileged_allocation: reject\n")
    try:
        proc = _ctr(world, containerd, _privileged_bundle(tmp_path / "b", SLICE_ENV, SLICE_PROBES))
    finally:
        settings.write_text(saved)
    assert proc.returncode != 0
    assert "oci-device-hook: deny: container is widened beyond its plugin allocation" in proc.stderr, (
        proc.stderr
    )
