"""Bad input (issue 2) through the CLI and live mode: exit 1, one stderr line naming file and field,
nothing written, nothing applied. Plus the CLI's usage errors and stage handling."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bundles import (
    NODE_CDI,
    NODE_INVENTORY,
    PRIVATE_RUN,
    config,
    hook_cli,
    hook_live,
    node,
    settings_file,
    write_bundle,
)

NO_SUCH_PID = 1 << 30  # above any pid_max: an apply attempt could never touch a real process


@dataclass(frozen=True)
class Case:
    """A broken input: how to build it, and what the one error line must name."""

    make: Callable[[Path], tuple[Path, bytes | None]]  # tmp -> (bundle, state bytes or None for a good one)
    file: str  # "{bundle}", "{state}", "{settings}", or a literal; formatted per mode
    field: str
    words: str = ""
    settings: dict[str, object] | None = None  # extra settings values (a bad one makes the settings case)


def _bundle(
    cfg: dict[str, object] | bytes | None = None, **kw: object
) -> Callable[[Path], tuple[Path, None]]:
    def make(tmp: Path) -> tuple[Path, None]:
        return write_bundle(tmp / "b", cfg, **kw), None

    return make


def _state(data: bytes) -> Callable[[Path], tuple[Path, bytes]]:
    def make(tmp: Path) -> tuple[Path, bytes]:
        return write_bundle(tmp / "b", config()), data

    return make


def _no_config(tmp: Path) -> tuple[Path, None]:
    b = tmp / "b"
    (b / "rootfs").mkdir(parents=True)
    return b, None


def _with(**section: object) -> dict[str, object]:
    cfg = config()
    for dotted, value in section.items():
        *path, last = dotted.split("__")
        obj = cfg
        for p in path:
            obj = obj[p]
        obj[last] = value
    return cfg


GPU0 = node("/dev/nvidia0", 195, 0)
CASES = {
    "state-not-json": Case(_state(b"{not json"), "{state}", "", "not valid JSON"),
    "state-no-bundle": Case(
        _state(b'{"ociVersion":"1.1.0","id":"x","pid":7}'), "{state}", "bundle", "missing"
    ),
    "state-pid-string": Case(_state(b'{"bundle":"B","pid":"7"}'), "{state}", "pid", "integer"),
    "state-oversize": Case(
        _state(b'{"bundle":"B","pad":"' + b"x" * (1 << 20) + b'"}'), "{state}", "", "larger than 1048576"
    ),
    "no-config": Case(_no_config, "{bundle}/config.json", "", "no such file"),
    "config-not-json": Case(_bundle(b'{"ociVersion": '), "{bundle}/config.json", "", "not valid JSON"),
    "config-oversize": Case(
        _bundle(b'{"x":"' + b"y" * (16 << 20) + b'"}'), "{bundle}/config.json", "", "larger than 16777216"
    ),
    "env-not-list": Case(_bundle(_with(process__env="A=1")), "{bundle}/config.json", "process.env"),
    "env-item-int": Case(_bundle(_with(process__env=["A=1", 2])), "{bundle}/config.json", "process.env[1]"),
    "capabilities-string": Case(
        _bundle(_with(process__capabilities="CAP_SYS_ADMIN")), "{bundle}/config.json", "process.capabilities"
    ),
    "mount-destination-int": Case(
        _bundle(_with(mounts=[{"destination": 3, "source": "/x"}])),
        "{bundle}/config.json",
        "mounts[0].destination",
    ),
    "device-major-string": Case(
        _bundle(_with(linux__devices=[{**GPU0, "major": "195"}])),
        "{bundle}/config.json",
        "linux.devices[0].major",
    ),
    "rule-allow-string": Case(
        _bundle(_with(linux__resources__devices=[{"allow": "false", "access": "rwm"}])),
        "{bundle}/config.json",
        "linux.resources.devices[0].allow",
    ),
    "rule-access-letters": Case(
        _bundle(_with(linux__resources__devices=[{"allow": False, "access": "rwx"}])),
        "{bundle}/config.json",
        "linux.resources.devices[0].access",
        "only r, w and m",
    ),
    "mig-env-not-all": Case(
        _bundle(config(["NVIDIA_MIG_CONFIG_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=0"], privileged=True)),
        "{bundle}/config.json",
        "process.env.NVIDIA_MIG_CONFIG_DEVICES",
        "only 'all'",
    ),
    "cdi-annotation-bad-element": Case(
        _bundle(annotations={"cdi.k8s.io/dp_x": "nvidia.com/gpu=0,bogus"}),
        "annotations",
        "cdi.k8s.io/dp_x",
        "bogus",
    ),
    "unknown-cdi-name": Case(
        _bundle(annotations={"cdi.k8s.io/dp_x": "nvidia.com/gpu=0,nvidia.com/gpu=99"}),
        "CDI spec dirs",
        "devices",
        "nvidia.com/gpu=99",
    ),
    "unknown-nvidia-id": Case(
        _bundle(config(["NVIDIA_VISIBLE_DEVICES=GPU-deadbeef-0000-4000-8000-000000000000"])),
        "env:NVIDIA_VISIBLE_DEVICES",
        "GPU-deadbeef-0000-4000-8000-000000000000",
        "unknown device ID",
    ),
    "settings-unknown-key": Case(
        _bundle(config(["NVIDIA_VISIBLE_DEVICES=0"])),
        "{settings}",
        "privileged_alocation",
        "unknown setting",
        settings={"privileged_alocation": "narrow"},
    ),
    "settings-bad-value": Case(
        _bundle(config(["NVIDIA_VISIBLE_DEVICES=0"])),
        "{settings}",
        "privileged_allocation",
        "narrow | reject | audit",
        settings={"privileged_allocation": "allow"},
    ),
}
SETTINGS_CASES = [k for k, c in CASES.items() if c.settings]


def _prepare(case: Case, tmp: Path) -> tuple[Path, bytes | None, Path]:
    bundle, state = case.make(tmp)
    if state is not None:
        state = state.replace(b'"B"', json.dumps(str(bundle)).encode())
    return bundle, state, settings_file(tmp, **(case.settings or {}))


def _expect(case: Case, err: str, bundle: Path, state_label: str, settings: Path) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert err.endswith("\n")
    where = case.file.format(bundle=bundle, state=state_label, settings=settings)
    assert where in lines[0]
    if case.field:
        assert f": {case.field}: " in lines[0] or f": {case.field} " in lines[0], lines[0]
    assert case.words in lines[0]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_cli(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    bundle, state, settings = _prepare(case, tmp_path)
    args = ["--bundle", str(bundle), "--config", str(settings), "--inventory", str(NODE_INVENTORY)]
    args += ["--cdi-spec-dir", str(NODE_CDI), "--driver-root", str(tmp_path / "root")]
    state_path = tmp_path / "state.json"
    if state is not None:
        state_path.write_bytes(state)
        args += ["--state", str(state_path)]
    out_cfg = tmp_path / "out" / "config.json"
    (tmp_path / "out").mkdir()
    res = hook_cli(*args, "--output-config", str(out_cfg), "--format", "json")
    assert res.returncode == 1, res.stderr
    error = json.loads(res.stdout)["error"]  # issue 37 item 6: stdout stays JSON, the error an object
    assert f"hook: {error['message']}\n" == res.stderr and error["exit_code"] == 1
    assert error["reason"] and error["reason"] in error["message"] and error["file"] in error["message"]
    _expect(case, res.stderr, bundle, str(state_path), settings)
    assert res.stderr.startswith("hook: ")
    assert not out_cfg.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["b", "out", "settings.yaml"] + (["state.json"] if state is not None else [])
    )


def _live_state(bundle: Path, state: bytes | None) -> bytes:
    if state is not None:
        return state
    return json.dumps(
        {"ociVersion": "1.1.0", "id": "ctr-1", "status": "created", "pid": NO_SUCH_PID, "bundle": str(bundle)}
    ).encode()


@pytest.mark.parametrize("name", [k for k in CASES if k not in SETTINGS_CASES])
def test_bad_input_live(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    bundle, state, settings = _prepare(case, tmp_path)
    res = hook_live(
        _live_state(bundle, state),
        "--config",
        str(settings),
        "--inventory",
        str(NODE_INVENTORY),
        "--cdi-spec-dir",
        str(NODE_CDI),
        "--driver-root",
        str(tmp_path / "root"),
    )
    err = res.stderr.decode()
    assert res.returncode == 1, err
    assert res.stdout == b""
    assert err.startswith("oci-device-hook: ")
    _expect(case, err, bundle, "state (stdin)", settings)
    (record,) = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert record["verdict"] == "error"
    assert err.split(": ", 1)[1].strip() == record["error"]


@pytest.mark.parametrize("name", [*SETTINGS_CASES, "config-not-json", "unknown-nvidia-id"])
def test_live_error_never_applies(name: str, tmp_path: Path) -> None:
    """Live mode with apply_plan and the log replaced by recorders: an error path reaches neither."""
    case = CASES[name]
    bundle, state, settings = _prepare(case, tmp_path)
    marks = tmp_path / "marks"
    code = (
        "import sys, hook.routes.live, hook.adapters.apply.transaction as t\n"
        f"def rec(*a, **k): open({str(marks)!r}, 'a').write('applied\\n')\n"
        "t.apply_plan = rec\n"
        "import hook.routes.act\n"
        f"hook.routes.act._write = lambda r, *_: open({str(marks)!r}, 'a')"
        ".write('log ' + r['verdict'] + '\\n')\n"
        "from hook.entry import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    res = subprocess.run(
        [
            *PRIVATE_RUN,
            sys.executable,
            "-I",
            "-c",
            code,
            "--config",
            str(settings),
            "--inventory",
            str(NODE_INVENTORY),
            "--cdi-spec-dir",
            str(NODE_CDI),
            "--driver-root",
            str(tmp_path / "root"),
        ],
        input=_live_state(bundle, state),
        capture_output=True,
        timeout=60,
        check=False,
    )
    err = res.stderr.decode()
    assert res.returncode == 1, err
    _expect(case, err, bundle, "state (stdin)", settings)
    assert marks.read_text() == "log error\n"


def test_bad_input_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hook.cli import run

    bundle = write_bundle(tmp_path / "b", _with(process__env={"A": "1"}))
    assert run(["--bundle", str(bundle), "--config", str(settings_file(tmp_path))]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"hook: {bundle}/config.json: process.env: expected a list of strings\n"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        pytest.param(["--bundle", "/nonexistent", "--format", "yaml"], 2, id="bad-format"),
        pytest.param(["--no-such-option"], 2, id="unknown-option"),
        pytest.param(["--state", "/nonexistent"], 2, id="state-without-bundle"),
    ],
)
def test_usage_errors_exit_2(args: list[str], code: int) -> None:
    res = hook_cli(*args)
    assert res.returncode == code
    assert res.stdout == ""
    assert res.stderr.strip()


@pytest.mark.parametrize("stage", ["createContainer", "startContainer", "poststart", "poststop"])
def test_other_stages_are_no_ops(stage: str) -> None:
    res = hook_live(b"{garbage", stage)
    assert (res.returncode, res.stdout, res.stderr) == (0, b"", b"")


def test_unknown_stage_is_a_usage_error() -> None:
    """interface.md: a word that is neither an OCI stage nor a subcommand is a usage error (exit 2)."""
    res = hook_live(b"{}", "prestop")
    assert res.returncode == 2
    assert b"'prestop' is not a subcommand" in res.stderr


@pytest.mark.parametrize("stage", ["prestart", "createRuntime"])
def test_live_stage_names_reach_the_parser(stage: str, tmp_path: Path) -> None:
    res = hook_live(b'{"id":"x"}', stage, "--config", str(settings_file(tmp_path)))
    assert res.returncode == 1
    assert res.stderr == b"oci-device-hook: state (stdin): bundle: missing\n"
