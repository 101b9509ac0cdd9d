"""#11 items 3 and 4 with real runc: whatever sits in the hook's cache directory or at its log
path, containers start (and a device-free one never waits for the hook's timeout).

Each case runs inside ``unshare -m`` with a private tmpfs over ``/run`` (so over
``/run/oci-device-hook``, the directory the hook uses by default) and over ``/var/log``: the
planted FIFOs, symlinks and sparse files exist only in that mount namespace. Two containers
start per case under custom settings (so the fast path needs its record): a plain one, and a
privileged one without an allocation (the full path, which reads the compiled settings and logs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live.livekit import RUNC, Bundle, build_bundle, hook

LOG_DIR = "/var/log/odh-blast"
HOOK_TIMEOUT = 8
PYTHON = [sys.executable, "-I", "-c"]

# Runs inside the private mount namespace: mount, plant, start both containers, report.
DRIVER = r"""
import json, os, subprocess, sys, time
plant, runs = sys.argv[1], json.loads(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "odh-run", "/run"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "odh-log", "/var/log"], check=True)
os.makedirs("/var/lib/oci-device-hook", exist_ok=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "odh-key", "/var/lib/oci-device-hook"], check=True)
os.makedirs("/var/log/odh-blast")
exec(plant)
out = []
for cmd, root, cid in runs:
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    out.append({"rc": p.returncode, "stderr": p.stderr, "s": time.monotonic() - start})
    subprocess.run([cmd[0], "--root", root, "delete", "-f", cid], capture_output=True, timeout=30)
def look(path):
    try:
        st = os.lstat(path)
    except OSError as exc:
        return exc.strerror
    return oct(st.st_mode)
record = "/run/oci-device-hook/fastpath.json"
try:
    data = open(record, "rb").read() if look(record).startswith("0o100") else b"null"
    doc = json.loads(data.split(b"\n", 1)[1] if data.startswith(b"oci-device-hook/sealed/") else data)
except ValueError:
    doc = None
log = "/var/log/odh-blast/hook.log"
print(json.dumps({"runs": out, "dir": look("/run/oci-device-hook"), "record": look(record),
                  "record_hook": (doc or {}).get("hook"), "log": look(log),
                  "elsewhere": os.listdir("/run/elsewhere") if os.path.isdir("/run/elsewhere") else None}))
"""

MK = "os.makedirs('/run/oci-device-hook', 0o700); R = '/run/oci-device-hook/fastpath.json'; "
PLANTS = {
    "fifo-record": MK + "os.mkfifo(R)",
    "dev-zero-record": MK + "os.symlink('/dev/zero', R)",
    "huge-sparse-record": MK + "f = open(R, 'wb'); f.truncate(8 << 30); f.close()",
    "truncated-record": MK + 'open(R, \'wb\').write(b\'{"kind": "fastpath", "files": {"\\\\u00\')',
    "symlinked-dir": "os.makedirs('/run/elsewhere', 0o700); "
    "os.symlink('/run/elsewhere', '/run/oci-device-hook')",
    "group-writable-dir": "os.makedirs('/run/oci-device-hook'); os.chmod('/run/oci-device-hook', 0o777)",
    "fifo-log": "os.mkfifo('/var/log/odh-blast/hook.log')",
    "log-is-symlink-to-dev-zero": "os.symlink('/dev/zero', '/var/log/odh-blast/hook.log')",
}


def other_version_record(settings: Path) -> str:
    """A record a rolled-back hook left: current shape, another version, an extra settings key."""
    st = settings.stat()
    key = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
    entry = {
        "key": key,
        "cdi_annotation_prefixes": ["cdi.k8s.io/"],
        "volume_mount_root": "/x",
        "settings": {"privileged_allocation": "narrow", "knob_from_v2": True},
    }
    old_key = [str(settings), st.st_size, st.st_mtime_ns, st.st_ino]
    docs = {
        "kind": "fastpath",
        "format": 2,
        "hook": "9.9.9",
        "files": {str(settings): entry},
        "key": old_key,
        **{k: v for k, v in entry.items() if k != "key"},
    }
    return (
        "os.makedirs('/run/oci-device-hook', 0o700); "
        f"open('/run/oci-device-hook/fastpath.json', 'w').write({json.dumps(docs)!r}); "
        "os.chmod('/run/oci-device-hook/fastpath.json', 0o600)"
    )


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"privileged_allocation: narrow\nlog_file: {LOG_DIR}/hook.log\n")
    (tmp_path / "no-cdi").mkdir()
    (tmp_path / "driver-root").mkdir()
    return {"settings": settings, "tmp": tmp_path}


def bundles(s: dict[str, Path]) -> list[Bundle]:
    args = [
        sys.executable,
        "-I",
        "-m",
        "hook",
        "prestart",
        "--config",
        str(s["settings"]),
        "--driver-root",
        str(s["tmp"] / "driver-root"),
        "--cdi-spec-dir",
        str(s["tmp"] / "no-cdi"),
    ]
    hooks = {"prestart": [hook(sys.executable, args, timeout=HOOK_TIMEOUT)]}
    plain = build_bundle(s["tmp"] / "plain", ["/bin/true"], hooks=hooks)
    privileged = build_bundle(
        s["tmp"] / "privileged", ["/bin/true"], hooks=hooks, cgroup_devices=[{"allow": True, "access": "rwm"}]
    )
    return [plain, privileged]


def run_case(s: dict[str, Path], plant: str, extension: bytes = b"") -> dict[str, object]:
    runs = []
    for b in bundles(s):
        if extension:  # an unknown field runc ignores (#11 item 5), written as raw bytes
            raw = (b.path / "config.json").read_bytes()
            (b.path / "config.json").write_bytes(b'{"x-vendor-extension": ' + extension + b", " + raw[1:])
        root = str(b.path / "runc-state")
        runs.append([[RUNC, "--root", root, "run", "--bundle", str(b.path), b.id], root, b.id])
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", *PYTHON, DRIVER, plant, json.dumps(runs)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", [*PLANTS, "other-version-record"])
def test_containers_start_whatever_is_planted(setup: dict[str, Path], case: str) -> None:
    plant = other_version_record(setup["settings"]) if case == "other-version-record" else PLANTS[case]
    seen = run_case(setup, plant)
    for run in seen["runs"]:  # type: ignore[attr-defined]
        assert run["rc"] == 0, (case, run["stderr"])
        assert run["s"] < HOOK_TIMEOUT - 2, (case, run)  # never waited for the hook's timeout
        assert "Traceback" not in run["stderr"]
    if case == "symlinked-dir":
        assert seen["dir"].startswith("0o12") and seen["elsewhere"] == []  # not followed, nothing written
    elif case.endswith("log") or case.startswith("log"):
        assert not seen["log"].startswith("0o100")  # the planted thing is left alone, never written
    else:  # rebuilt: a regular record of this hook in a 0700 directory
        assert seen["dir"] == oct(0o40700) and seen["record"] == oct(0o100600)
        assert seen["record_hook"] is not None and seen["record_hook"] != "9.9.9"
    if not case.endswith("log") and not case.startswith("log"):
        assert seen["log"] == oct(0o100640)


def test_cgroup_root_untouched() -> None:
    """The suite's containers ran in scratch cgroups: the v1 root still allows everything."""
    devices = Path("/sys/fs/cgroup/devices/devices.list")
    if devices.exists():
        assert devices.read_text().split() == ["a", "*:*", "rwm"]


EXTENSIONS = {
    "2000-deep": b"[" * 2000 + b"]" * 2000,
    "5000-digit-integer": b"7" * 5000,
    "invalid-utf8": b'"\xff\xfe \xc3"',
}


@pytest.mark.parametrize("name", list(EXTENSIONS))
def test_configs_runc_accepts_start_without_a_device(setup: dict[str, Path], name: str) -> None:
    """#11 item 5: runc runs these configs; the hook (fast path and full path) must let them run."""
    seen = run_case(setup, "", EXTENSIONS[name])
    for run in seen["runs"]:  # type: ignore[attr-defined]
        assert run["rc"] == 0 and "Traceback" not in run["stderr"], (name, run["stderr"])
