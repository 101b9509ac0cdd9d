"""packaging/runtime: the POSIX sh wrapper decides create/run configs in place and execs the runtime.

The wrapper is copied into a temp dir beside a ``hook`` that is the real console script, and
the "real runtime" is a fake that records its argv and the config it was handed; no container
runs here (tests/live/test_spec_level.py runs real ones through containerd).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hook.adapters.marker import ANNOTATION
from hook.core.errors import InputError
from hook.core.settings import parse_settings
from tests.bundles import EXAMPLES, NODE_CDI, _hook_exe
from tests.hosttree import make_host_tree

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "packaging" / "runtime"


@pytest.fixture
def kit(tmp_path: Path) -> dict[str, Any]:
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    shutil.copy2(WRAPPER, libexec / "runtime")
    hook = libexec / "hook"
    hook.write_text(f'#!/bin/sh\nexec {" ".join(_hook_exe())} "$@"\n')
    hook.chmod(0o755)
    record = tmp_path / "runtime-saw.json"
    fake = tmp_path / "fake-runc"
    fake.write_text(
        "#!/bin/sh\n"
        f'python3 -c \'import json,sys,os; json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd()}}, '
        f'open("{record}", "w"))\' "$@"\n'
    )
    fake.chmod(0o755)
    root = tmp_path / "driver-root"
    make_host_tree(root, "8x-mig", mknod=False)
    settings = tmp_path / "config.yaml"
    settings.write_text(
        f"runtime: {fake}   # the fake runtime\n"
        f"log_file: {tmp_path / 'hook.log'}\ncache_dir: {tmp_path / 'cache'}\n"
        f"driver_root: {root}\ncdi_spec_dirs: [{NODE_CDI}]\n"
    )
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    return {"wrapper": libexec / "runtime", "record": record, "settings": settings, "bundle": bundle,
            "tmp": tmp_path, "fake": fake}  # fmt: skip


def wrap(kit: dict[str, Any], *args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    base = {"PATH": os.environ["PATH"], "OCI_DEVICE_HOOK_CONFIG": str(kit["settings"])}
    return subprocess.run(
        [*IN_NS, str(kit["wrapper"]), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**base, **(env or {})},
    )


def put(kit: dict[str, Any], example: str) -> bytes:
    data = (EXAMPLES / example / "config.json").read_bytes()
    (kit["bundle"] / "config.json").write_bytes(data)
    return data


def saw(kit: dict[str, Any]) -> dict[str, Any]:
    return json.loads(kit["record"].read_text())


# The hook writes its fast-path cache under /run/oci-device-hook and, before it has read its settings,
# may log to /var/log: each run gets private tmpfs ones.
PRIVATE_RUN = (
    "mount -t tmpfs -o mode=0755 tmpfs /run && mount -t tmpfs -o mode=0755 tmpfs /var/log"
    ' && mkdir /run/oci-device-hook && exec "$@"'
)
IN_NS = ["unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE_RUN, "sh"]
CONTAINERD_ARGS = ["--root", "/run/containerd/runc/k8s.io", "--log", "/x/log.json", "--log-format", "json"]


def test_create_rewrites_the_config_keeps_the_original_and_passes_every_argument(kit: dict[str, Any]) -> None:
    original = put(kit, "slice-privileged")
    args = [*CONTAINERD_ARGS, "create", "--bundle", str(kit["bundle"]), "--pid-file", "/x/pid", "ctr-1"]
    res = wrap(kit, *args)
    assert res.returncode == 0, res.stderr
    assert saw(kit)["argv"] == args
    assert (kit["bundle"] / "config.json.orig").read_bytes() == original
    decided = json.loads((kit["bundle"] / "config.json").read_text())
    assert ANNOTATION in decided["annotations"]
    assert [d["path"] for d in decided["linux"]["devices"] if d["path"].startswith("/dev/nvidia")] == [
        "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"
    ]  # fmt: skip
    assert not [p for p in kit["bundle"].iterdir() if p.name.startswith(".config.json")]
    assert (kit["bundle"] / "config.json").stat().st_mode & 0o077 == 0
    record = json.loads((kit["tmp"] / "hook.log").read_text().splitlines()[-1])
    assert record["container"]["id"] == "ctr-1" and record["stage"] == "precreate"


@pytest.mark.parametrize(
    "form",
    [["run", "-b", "{b}", "id"], ["run", "--bundle={b}", "id"], ["--systemd-cgroup", "run", "--b={b}", "id"]],
)
def test_every_bundle_spelling(kit: dict[str, Any], form: list[str]) -> None:
    put(kit, "slice-privileged")
    res = wrap(kit, *[a.replace("{b}", str(kit["bundle"])) for a in form])
    assert res.returncode == 0, res.stderr
    assert (kit["bundle"] / "config.json.orig").exists()


def test_no_bundle_option_means_the_working_directory(kit: dict[str, Any]) -> None:
    put(kit, "slice-privileged")
    assert wrap(kit, "create", "id", cwd=kit["bundle"]).returncode == 0
    assert (kit["bundle"] / "config.json.orig").exists()
    assert saw(kit)["cwd"] == str(kit["bundle"])


def test_plain_container_config_is_left_alone(kit: dict[str, Any]) -> None:
    original = put(kit, "cpu")
    before = (kit["bundle"] / "config.json").stat()
    assert wrap(kit, "create", "--bundle", str(kit["bundle"]), "id").returncode == 0
    after = (kit["bundle"] / "config.json").stat()
    assert (kit["bundle"] / "config.json").read_bytes() == original
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert not (kit["bundle"] / "config.json.orig").exists()


@pytest.mark.parametrize("sub", ["state", "start", "kill", "delete", "features", "--version"])
def test_other_subcommands_go_straight_to_the_runtime(kit: dict[str, Any], sub: str) -> None:
    (kit["wrapper"].parent / "hook").write_text("#!/bin/sh\nexit 99\n")  # proves the hook is never run
    put(kit, "slice-privileged")
    res = wrap(kit, *CONTAINERD_ARGS, sub, "id", cwd=kit["bundle"])
    assert res.returncode == 0, res.stderr
    assert saw(kit)["argv"] == [*CONTAINERD_ARGS, sub, "id"]


def test_deny_stops_before_the_runtime(kit: dict[str, Any]) -> None:
    kit["settings"].write_text(kit["settings"].read_text() + "privileged_allocation: reject\n")
    original = put(kit, "slice-privileged")
    res = wrap(kit, "create", "--bundle", str(kit["bundle"]), "id")
    assert res.returncode == 3
    assert res.stderr.startswith("oci-device-hook: deny: ") and len(res.stderr.splitlines()) == 1
    assert not kit["record"].exists()
    assert (kit["bundle"] / "config.json").read_bytes() == original
    assert sorted(p.name for p in kit["bundle"].iterdir()) == ["config.json", "rootfs"]


def test_default_runtime_is_runc_on_path(kit: dict[str, Any]) -> None:
    kit["settings"].write_text("\n".join(kit["settings"].read_text().splitlines()[1:]) + "\n")
    bindir = kit["tmp"] / "bin"
    bindir.mkdir()
    (bindir / "runc").symlink_to(kit["fake"])
    res = wrap(kit, "state", "id", env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert res.returncode == 0, res.stderr
    assert saw(kit)["argv"] == ["state", "id"]


def test_a_runtime_setting_that_names_the_wrapper_stops(kit: dict[str, Any]) -> None:
    kit["settings"].write_text(f"runtime: {kit['wrapper']}\n")
    res = wrap(kit, "state", "id")
    assert res.returncode == 1 and "leads back to this wrapper" in res.stderr


@pytest.mark.parametrize(
    "line",
    [
        "runtime: {rt}",
        'runtime: "{rt}"',
        "runtime: '{rt}'",
        "runtime:  {rt}  # crun, say",
        "runtime:   {rt}   ",
    ],
)
def test_the_shell_reads_runtime_as_yaml_does(kit: dict[str, Any], line: str) -> None:
    text = line.format(rt=kit["fake"]) + "\n"
    assert parse_settings(yaml.safe_load(text), "x").runtime == str(kit["fake"])
    kit["settings"].write_text(text)
    assert wrap(kit, "state", "id").returncode == 0
    assert saw(kit)["argv"] == ["state", "id"]


@pytest.mark.parametrize("value", ['"/usr/bin/my runc"', "'$(reboot)'", "runc;id"])
def test_a_runtime_the_shell_cannot_read_plainly_is_refused_by_both(kit: dict[str, Any], value: str) -> None:
    text = f"runtime: {value}\n"
    with pytest.raises(InputError):
        parse_settings(yaml.safe_load(text), "x")
    kit["settings"].write_text(text)
    res = wrap(kit, "state", "id")
    assert res.returncode == 1 and "runtime" in res.stderr
    assert not kit["record"].exists()


def test_registration_files_name_the_installed_paths() -> None:
    import tomllib

    eng = REPO / "packaging" / "engines"
    pre = json.loads((eng / "oci-device-hook-precreate.json").read_text())
    live = json.loads((REPO / "nvidia-hook.json").read_text())
    assert pre["stages"] == ["precreate"] and pre["hook"]["args"] == ["hook", "precreate"]
    assert {k: v for k, v in pre["hook"].items() if k != "args"} == {
        k: v for k, v in live["hook"].items() if k != "args"
    }
    assert pre["when"] == {"always": True} and pre["version"] == "1.0.0"
    v2 = tomllib.loads((eng / "containerd-runtime-v2.toml").read_text())
    v3 = tomllib.loads((eng / "containerd-runtime-v3.toml").read_text())
    for doc, plugin in ((v2, "io.containerd.grpc.v1.cri"), (v3, "io.containerd.cri.v1.runtime")):
        cri = doc["plugins"][plugin]["containerd"]
        entry = cri["runtimes"]["oci-device-hook"]
        assert cri["default_runtime_name"] == "oci-device-hook"
        assert entry["runtime_type"] == "io.containerd.runc.v2"
        assert entry["options"]["BinaryName"] == "/usr/libexec/oci-device-hook/runtime"
    assert (v2["version"], v3["version"]) == (2, 3)


def test_a_privileged_dra_pod_is_narrowed_to_its_claim_by_the_wrapper(kit: dict[str, Any]) -> None:
    """Issue 20, spec level: the runtime wrapper hands the runtime only the claim's GPU (the
    dra-claim-privileged example: its claim spec and the kubelet's DRA state)."""
    dra = EXAMPLES / "dra-claim-privileged"
    dirs = f"cdi_spec_dirs: [{NODE_CDI}]"
    text = kit["settings"].read_text().replace(dirs, f"cdi_spec_dirs: [{NODE_CDI}, {dra / 'cdi'}]")
    kit["settings"].write_text(text + f"kubelet_dra_state: {dra / 'kubelet' / 'dra_manager_state'}\n")
    put(kit, "dra-claim-privileged")
    res = wrap(kit, "create", "--bundle", str(kit["bundle"]), "id")
    assert res.returncode == 0, res.stderr
    decided = json.loads((kit["bundle"] / "config.json").read_text())
    gpus = [d["path"] for d in decided["linux"]["devices"] if d["path"][len("/dev/nvidia"):].isdigit()]
    assert gpus == ["/dev/nvidia2"]
    record = json.loads((kit["tmp"] / "hook.log").read_text().splitlines()[-1])
    assert record["kubernetes"]["dra"]["decided"] == ["ml/gpu-claim (9d2f4c1a-6b3e-4e8f-a0c7-5d1b2e3f4a6b)"]
