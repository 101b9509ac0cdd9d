"""Issue 15 items 5 and 6: CLI slips, `hook --version`, the log line's fields and `hook log`.

Live runs go through ``unshare -m`` with a private tmpfs over /run/oci-device-hook (the fast-path
cache) and a settings file whose log and cache live in the test's temp dir; none applies anything
(verdict none or error), so no cgroup is touched.
"""

from __future__ import annotations

import gzip
import json
import os
import pty
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import (
    PRIVATE_RUN,
    _hook_exe,
    alloc_resp,
    checkpoint,
    checkpoint_entry,
    config,
    hook_cli,
    host_devices,
    node_args,
    settings_file,
    simulate,
    state,
    write_bundle,
)

REPO = Path(__file__).resolve().parents[1]
ENGINE_ID = "a1b2" * 16  # the container id the engine put in linux.cgroupsPath
CGROUPS = {  # what tells the engines apart (hook/sources/kubelet/podid.py): a pod cannot write it
    "containerd": f"/kubepods/podx/{ENGINE_ID}",
    "cri-o": f"/kubepods/podx/crio-{ENGINE_ID}",
}
CONTAINERD_POD = {
    "io.kubernetes.cri.sandbox-id": "5f0c" * 16,
    "io.kubernetes.cri.sandbox-uid": "uid-a",
    "io.kubernetes.cri.sandbox-namespace": "team-a",
    "io.kubernetes.cri.sandbox-name": "trainer-0",
    "io.kubernetes.cri.container-name": "worker",
    "io.kubernetes.cri.container-type": "container",
}
CRIO_POD = {
    "io.kubernetes.cri-o.ContainerID": ENGINE_ID,
    "io.kubernetes.pod.uid": "uid-b",
    "io.kubernetes.pod.namespace": "team-b",
    "io.kubernetes.pod.name": "infer-1",
    "io.kubernetes.container.name": "server",
    "io.kubernetes.cri-o.ContainerType": "container",
}


def _live(tmp: Path, stdin: Any, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The console script in a private mount namespace: its fast-path cache never reaches the host."""
    cmd = [*PRIVATE_RUN, *_hook_exe(), *args]
    if isinstance(stdin, bytes):
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=60, check=False)
    return subprocess.run(cmd, stdin=stdin, capture_output=True, timeout=60, check=False)


# --- item 6: CLI slips ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "hint"),
    [("doctr", "doctor"), ("prestrat", "prestart"), ("inventroy", "inventory"), ("prestop", "prestart")],
)
def test_unknown_word_is_a_usage_error_with_a_suggestion(word: str, hint: str) -> None:
    res = hook_cli(word, stdin=b"{}")
    assert res.returncode == 2
    assert res.stdout == ""
    assert f"did you mean {hint!r}" in res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_unknown_word_without_a_close_match_names_the_subcommands() -> None:
    res = hook_cli("frobnicate")
    assert res.returncode == 2
    assert "did you mean" not in res.stderr and "cdi, doctor, inventory, log" in res.stderr


def test_unknown_word_is_escaped_for_the_terminal() -> None:
    res = hook_cli("\x1b[31mred")
    assert res.returncode == 2 and "\x1b" not in res.stderr


@pytest.mark.parametrize("stage", ["createContainer", "startContainer", "poststart", "poststop"])
def test_other_oci_stages_stay_silent_no_ops(stage: str) -> None:
    res = hook_cli(stage, stdin=b"{garbage")
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_live_mode_on_a_terminal_says_it_wants_the_state_on_stdin() -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([*_hook_exe()], stdin=slave, capture_output=True, text=True, timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    assert proc.returncode == 2
    assert "expects the OCI state JSON on stdin" in proc.stderr


@pytest.mark.parametrize("stage", ["prestart", "createRuntime", "poststop"])
def test_stage_help(stage: str) -> None:
    res = hook_cli(stage, "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: hook [prestart|createRuntime]")
    assert "--log" in res.stdout


def test_version_matches_the_package_metadata() -> None:
    from importlib.metadata import version as installed

    from hook.core.version import VERSION

    version = installed("oci-device-hook")  # pyproject's dynamic version, read from hook/core/version.py
    assert version == VERSION
    res = hook_cli("--version")
    assert (res.returncode, res.stdout) == (0, f"hook (oci-device-hook) {version}\n")


def test_live_path_modules_do_not_import_importlib_metadata() -> None:
    code = (
        "import sys; import hook.entry, hook.routes.logrecord, hook.routes.live; "
        "print('importlib.metadata' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.strip() == "False"


def test_missing_cdi_spec_dir_is_a_warning_and_empty_list_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    res = hook_cli("cdi", "list", "--cdi-spec-dir", str(tmp_path / "nope"), "--cdi-spec-dir", str(empty))
    assert res.returncode == 0
    assert res.stderr == f"hook: warning: --cdi-spec-dir {tmp_path / 'nope'}: no such directory\n"
    assert res.stdout.startswith("no CDI specs in ")


@pytest.mark.parametrize("kind", ["nvidia", "nvidia.com/", "/gpu", "a/b/c"])
def test_cdi_kind_without_a_class_is_an_error(kind: str, tmp_path: Path) -> None:
    from hook.core.errors import InputError
    from hook.core.settings import parse_settings

    with pytest.raises(InputError, match="cdi_kinds") as err:
        parse_settings({"cdi_kinds": ["nvidia.com/gpu", kind]}, "config.yaml")
    assert "vendor/class" in str(err.value)
    bundle = write_bundle(tmp_path / "b", config())
    res = hook_cli("--bundle", str(bundle), "--config", str(settings_file(tmp_path, cdi_kinds=[kind])))
    assert res.returncode == 1 and "cdi_kinds" in res.stderr


# --- item 5: the log line ----------------------------------------------------------------------------


def _priv_bundle(tmp: Path, annotations: dict[str, str], cgroups: str = CGROUPS["containerd"]) -> Path:
    """A privileged container without a plugin allocation: the full path, verdict none, nothing applied."""
    cfg = config(privileged=True, devices=host_devices())
    cfg["annotations"] = dict(annotations)  # exactly these: no pod defaults from tests.bundles
    cfg["linux"]["cgroupsPath"] = cgroups
    return write_bundle(tmp / "b", cfg)


@pytest.mark.parametrize(
    ("annotations", "engine", "pod"),
    [
        (CONTAINERD_POD, "containerd", {"namespace": "team-a", "name": "trainer-0", "container": "worker"}),
        (CRIO_POD, "cri-o", {"namespace": "team-b", "name": "infer-1", "container": "server"}),
        ({"io.container.manager": "libpod"}, "podman", None),
    ],
)
def test_log_line_has_time_version_pod_and_engine(
    annotations: dict[str, str], engine: str, pod: dict[str, str] | None, tmp_path: Path
) -> None:
    from hook.core.version import VERSION

    bundle = _priv_bundle(tmp_path, annotations, CGROUPS.get(engine, ""))
    before = datetime.now().astimezone()
    res = _live(tmp_path, state(bundle), "prestart", *node_args(), "--config", str(settings_file(tmp_path)))
    assert res.returncode == 0, res.stderr
    (line,) = (tmp_path / "hook.log").read_text().splitlines()
    rec = json.loads(line)
    assert rec["verdict"] == "none"
    stamp = datetime.fromisoformat(rec["time"])
    assert rec["time"].endswith("Z") and abs((stamp - before).total_seconds()) < 60
    assert rec["version"] == VERSION
    assert rec["engine"] == engine
    assert rec.get("pod") == pod


@pytest.mark.parametrize("readable", [True, False], ids=["config-read", "config-unparsable"])
def test_error_lines_name_the_pod_only_as_the_config_tells_it(readable: bool, tmp_path: Path) -> None:
    """An error after config.json was read names the pod; before, nothing tells the engine (its
    linux.cgroupsPath is unknown), so the line names none rather than what the annotations claim."""
    plugin = {"cdi.k8s.io/x": "nvidia.com/gpu=no-such-device"}  # the kubelet's word (issue 28)
    ann = {**CONTAINERD_POD, **plugin}
    bundle = _priv_bundle(tmp_path, ann)
    if not readable:
        cfg = json.loads((bundle / "config.json").read_text())
        cfg["linux"]["devices"][0]["major"] = "x"
        (bundle / "config.json").write_text(json.dumps(cfg))
    resp = alloc_resp(annotations=plugin)
    entry = checkpoint_entry("nvidia.com/gpu", ["x"], resp, pod_uid="uid-a", container="worker")
    (tmp_path / "ckpt").write_bytes(checkpoint([entry]))
    settings = settings_file(tmp_path, kubelet_checkpoint=str(tmp_path / "ckpt"))
    args = ["prestart", *node_args(), "--config", str(settings)]
    res = _live(tmp_path, state(bundle, annotations=ann), *args)
    assert res.returncode == 1, res.stderr
    rec = json.loads((tmp_path / "hook.log").read_text())
    assert rec["verdict"] == "error"
    if readable:
        assert rec["pod"]["name"] == "trainer-0" and rec["engine"] == "containerd"
    else:
        assert "pod" not in rec and "engine" not in rec


def test_pod_values_are_capped_and_stay_one_json_line(tmp_path: Path) -> None:
    from hook.routes.logrecord import stamp

    ann = {**CRIO_POD, "io.kubernetes.pod.name": "x\n" * 400}
    rec = stamp({"verdict": "none"}, ann, now=0.0, cgroups_path=CGROUPS["cri-o"])
    assert rec["time"] == "1970-01-01T00:00:00.000Z"
    assert len(rec["pod"]["name"]) <= 254
    assert "\n" not in json.dumps(rec)


def test_by_hand_run_does_not_append_unless_asked(tmp_path: Path) -> None:
    bundle = _priv_bundle(tmp_path, CONTAINERD_POD)
    state_file = tmp_path / "state.json"
    state_file.write_bytes(state(bundle))
    args = ["prestart", *node_args(), "--config", str(settings_file(tmp_path))]
    log = tmp_path / "hook.log"
    with state_file.open("rb") as f:
        res = _live(tmp_path, f, *args)
    assert res.returncode == 0, res.stderr
    assert not log.exists()
    assert json.loads(res.stdout)["verdict"] == "none"
    assert b"run by hand: not appended to" in res.stderr
    with state_file.open("rb") as f:
        res = _live(tmp_path, f, *args, "--log")
    assert res.returncode == 0 and len(log.read_text().splitlines()) == 1
    res = _live(tmp_path, state_file.read_bytes(), *args)  # a pipe, as runc and crun give it
    assert res.returncode == 0 and res.stdout == b"" and len(log.read_text().splitlines()) == 2


def _narrowing(tmp: Path, capsys: Any, **settings: Any) -> dict[str, Any]:
    cfg = config(
        privileged=True,
        devices=host_devices(),
        annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0,nvidia.com/gpu=1"},
    )
    bundle = write_bundle(tmp / "bundle", cfg)
    settings.setdefault("kubelet_checkpoint", str(tmp / "ckpt"))
    args = [*node_args(), "--config", str(settings_file(tmp, **settings))]
    rc, rep, _ = simulate(bundle, *args, capsys=capsys)
    assert rc == 0
    return rep


@pytest.mark.parametrize("policy", ["narrow", "audit"])
def test_denied_nodes_are_named(policy: str, tmp_path: Path, capsys: Any) -> None:
    rep = _narrowing(tmp_path, capsys, privileged_allocation=policy)
    assert rep["verdict"] == ("apply" if policy == "narrow" else "none")
    assert "/dev/nvidia7" in rep["denied"] and "/dev/nvidia2" in rep["denied"]
    assert "/dev/nvidia0" not in rep["denied"] and "/dev/nvidia1" not in rep["denied"]
    assert rep["denied"] == sorted(rep["denied"])
    if policy == "narrow":
        denied_majors = {(r["major"], r["minor"]) for r in rep["cgroup"] if not r["allow"]}
        assert len(denied_majors) == len(rep["denied"])


# --- hook log -------------------------------------------------------------------------------------------


def _rec(t: str, verdict: str, ns: str, pod: str, denied: list[str] | None = None) -> str:
    obj = {"time": t, "verdict": verdict, "pod": {"namespace": ns, "name": pod, "container": "c"},
           "container": {"id": f"id-{pod}"}, "reason": "r", "denied": denied or []}  # fmt: skip
    return json.dumps(obj, sort_keys=True) + "\n"


def test_hook_log_answers_which_containers_were_narrowed_today(tmp_path: Path) -> None:
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    log = tmp_path / "hook.log"
    with gzip.open(tmp_path / "hook.log.2.gz", "wt") as f:
        f.write(_rec("2000-01-01T00:00:00.000Z", "apply", "a", "ancient", ["/dev/nvidia1"]))
    (tmp_path / "hook.log.1").write_text(
        _rec(f"{today}T00:00:01.000Z", "apply", "a", "early", ["/dev/nvidia2"]) + "not json\n"
    )
    log.write_text(
        _rec(f"{today}T23:59:58.000Z", "apply", "b", "granted")  # apply, but nothing denied
        + _rec(f"{today}T23:59:59.000Z", "apply", "b", "late", ["/dev/nvidia3"])
        + _rec(f"{today}T23:59:59.500Z", "none", "b", "idle")
    )
    res = hook_cli("log", "--file", str(log), "--since", f"{today}T00:00:00Z", "--narrowed")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [ln.split()[2] for ln in lines[:2]] == ["a/early/c", "b/late/c"]
    assert "denied=/dev/nvidia3" in lines[1]
    assert lines[2] == "(1 line(s) were not log records and were skipped)"
    res = hook_cli("log", "--file", str(log), "--verdict", "apply", "--namespace", "b", "--format", "json")
    assert [json.loads(x)["pod"]["name"] for x in res.stdout.splitlines()] == ["granted", "late"]
    res = hook_cli("log", "--file", str(log), "--since", "today", "--pod", "ancient")
    assert res.stdout.endswith("no matching log records\n")
    res = hook_cli("log", "--file", str(log), "--pod", "ancient")
    assert "a/ancient/c" in res.stdout


def test_hook_log_reads_the_settings_log_file(tmp_path: Path) -> None:
    (tmp_path / "hook.log").write_text(_rec("2030-01-01T00:00:00.000Z", "deny", "n", "p"))
    res = hook_cli("log", "--config", str(settings_file(tmp_path)))
    assert res.returncode == 0 and "n/p/c" in res.stdout and "deny" in res.stdout


@pytest.mark.parametrize("since", ["sometime", "3w"])
def test_hook_log_bad_since_is_a_usage_error(since: str, tmp_path: Path) -> None:
    res = hook_cli("log", "--file", str(tmp_path / "x.log"), "--since", since)
    assert res.returncode == 2 and "--since" in res.stderr


def test_parse_since_relative_and_absolute() -> None:
    from hook.tools.logread import parse_since

    now = datetime.fromisoformat("2026-03-04T12:30:00+00:00").timestamp()
    assert parse_since("today", now) == "2026-03-04T00:00:00.000Z"
    assert parse_since("yesterday", now) == "2026-03-03T00:00:00.000Z"
    assert parse_since("2h", now) == "2026-03-04T10:30:00.000Z"
    assert parse_since("2026-03-01", now) == "2026-03-01T00:00:00.000Z"
    assert parse_since("2026-03-01T01:00:00+01:00", now) == "2026-03-01T00:00:00.000Z"


def test_logrotate_snippet_names_the_default_log() -> None:
    text = (REPO / "packaging/logrotate").read_text()
    from hook.core.settings import Settings

    assert f"{Settings().log_file} {{" in text
    if shutil.which("logrotate"):
        subprocess.run(
            ["logrotate", "-d", str(REPO / "packaging/logrotate")], check=True, capture_output=True
        )


def test_hook_log_counts_and_skips_records_of_the_wrong_shape(tmp_path: Path) -> None:
    """Issue 21, item 8: one record with a non-string verdict (or a non-list denied) hid every line."""
    log = tmp_path / "hook.log"
    good = _rec("2030-01-01T00:00:00.000Z", "apply", "n", "good", ["/dev/nvidia1"])
    odd = [{"time": "2030-01-01T00:00:01.000Z", "verdict": ["apply"]},
           {"time": "2030-01-01T00:00:02.000Z", "verdict": "apply", "denied": 5},
           {"time": 7, "verdict": "none"}, {"reason": "no verdict"}]  # fmt: skip
    log.write_text(good + "".join(json.dumps(o) + "\n" for o in odd))
    for args in ([], ["--narrowed"], ["--verdict", "apply"], ["--since", "2000-01-01"]):
        res = hook_cli("log", "--file", str(log), *args)
        assert res.returncode == 0 and res.stderr == "", res.stderr
        lines = res.stdout.splitlines()
        assert "n/good/c" in lines[0] and lines[1:] == ["(4 line(s) were not log records and were skipped)"]


def test_hook_log_text_shows_warnings_and_filters_on_them(tmp_path: Path) -> None:
    """Issue 22, item 5: a record's warnings are part of the text, and ``--warnings`` finds them."""
    log = tmp_path / "hook.log"
    warned = json.loads(_rec("2030-01-01T00:00:00.000Z", "none", "n", "warned"))
    warned["warnings"] = ["NVIDIA_VISIBLE_DEVICES=all ignored: no \x1b[31mGPU"]
    log.write_text(json.dumps(warned) + "\n" + _rec("2030-01-01T00:00:01.000Z", "none", "n", "quiet"))
    res = hook_cli("log", "--file", str(log))
    lines = res.stdout.splitlines()
    assert "n/warned/c" in lines[0] and "n/quiet/c" in lines[2]
    assert lines[1] == "    warning: NVIDIA_VISIBLE_DEVICES=all ignored: no \\x1b[31mGPU"  # escaped
    res = hook_cli("log", "--file", str(log), "--warnings")
    assert [ln for ln in res.stdout.splitlines() if not ln.startswith("    ")] == [lines[0]]


def test_hook_log_on_a_missing_file_is_an_error(tmp_path: Path) -> None:
    """Issue 22, item 5: ``--file`` names a file; a typo there must not read as "nothing happened"."""
    res = hook_cli("log", "--file", str(tmp_path / "nope.log"))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"hook: {tmp_path / 'nope.log'}: no such log file (nor rotated copies of it)\n"
    res = hook_cli("log", "--config", str(settings_file(tmp_path)))  # the settings' log, not yet written
    assert res.returncode == 0
    assert res.stdout == f"no matching log records ({tmp_path / 'hook.log'} does not exist yet)\n"


def test_a_missing_inventory_file_is_an_error(tmp_path: Path) -> None:
    """Issue 22, item 5: ``--inventory`` names a file; a typo there passed for "a driver is here"."""
    missing = tmp_path / "inventory.json"
    bundle = REPO / "examples" / "slice-privileged"
    cdi = str(REPO / "examples" / "node" / "cdi")
    res = hook_cli("--bundle", str(bundle), "--inventory", str(missing), "--cdi-spec-dir", cdi)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == f"hook: {missing}: no such file (--inventory)\n"
    live = _live(tmp_path, state(bundle), "prestart", "--inventory", str(missing), "--config",
                 str(settings_file(tmp_path)), "--cdi-spec-dir", cdi)  # fmt: skip
    assert live.returncode == 1
    assert live.stderr.decode() == f"oci-device-hook: {missing}: no such file (--inventory)\n"
    record = json.loads((tmp_path / "hook.log").read_text().splitlines()[-1])  # the settings' log
    assert record["verdict"] == "error" and str(missing) in record["error"]


def test_format_json_prints_an_error_object_and_text_prints_nothing(tmp_path: Path) -> None:
    """Issue 37 item 6: a program reading ``--format json`` gets an object on error too (stdout
    stays JSON); stderr keeps its one line either way, and text mode prints nothing on stdout."""
    missing = tmp_path / "nope.log"
    for args in (
        ["--format", "json", "log", "--file", str(missing)],
        ["log", "--format=json", "--file", str(missing)],
    ):
        res = hook_cli(*args)
        assert res.returncode == 1 and res.stderr.count("\n") == 1 and str(missing) in res.stderr
        error = json.loads(res.stdout)["error"]
        assert res.stderr == f"hook: {error['message']}\n" and error["file"] == str(missing)
    res = hook_cli("log", "--file", str(missing))
    assert (res.returncode, res.stdout) == (1, "") and str(missing) in res.stderr
