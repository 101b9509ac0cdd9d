"""#11 items 5, 6 and 8: inputs runc accepts never refuse a container that asks for nothing, a
container's strings never reach stderr raw, a broken settings file stops only device containers.

The real hook runs as a subprocess inside ``unshare -m`` with private tmpfs over ``/run`` and
``/var/log`` (its cache directory and default log), with an explicit ``--config``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bundles import config, write_bundle

ISOLATE = 'mount -t tmpfs odh-run /run && mount -t tmpfs odh-log /var/log && exec "$@"'
DEEP = 2000


def run_hook(stdin: bytes, settings: Path, tmp: Path) -> subprocess.CompletedProcess[bytes]:
    (tmp / "root").mkdir(exist_ok=True)
    (tmp / "no-cdi").mkdir(exist_ok=True)
    hook = [
        sys.executable,
        "-I",
        "-m",
        "hook",
        "prestart",
        "--config",
        str(settings),
        "--driver-root",
        str(tmp / "root"),
        "--cdi-spec-dir",
        str(tmp / "no-cdi"),
    ]
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", ISOLATE, "sh", *hook]
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=120, check=False)


def state(bundle: str | Path, **extra: object) -> bytes:
    return json.dumps(
        {"ociVersion": "1.1.0", "id": "ctr-1", "status": "creating", "bundle": str(bundle), **extra}
    ).encode()


def with_extension(cfg: dict[str, object], raw: bytes) -> bytes:
    """config.json bytes with an unknown extension field holding ``raw`` (runc ignores it)."""
    return b'{"x-vendor-extension": ' + raw + b", " + json.dumps(cfg).encode()[1:]


@pytest.fixture
def settings(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"# defaults\nlog_file: {tmp_path}/hook.log\n")
    return path


PLAIN = config(["PATH=/bin"])
PRIVILEGED = config(["PATH=/bin"], privileged=True)  # widened, no allocation: the full path decides
ODD = {
    "deep-extension": lambda c: with_extension(c, b"[" * DEEP + b"]" * DEEP),
    "deep-object-extension": lambda c: with_extension(c, b'{"a":' * DEEP + b"1" + b"}" * DEEP),
    "5000-digit-integer": lambda c: with_extension(c, b"7" * 5000),
    "invalid-utf8-extension": lambda c: with_extension(c, b'"\xff\xfe bad \xc3"'),
    "invalid-utf8-env": lambda c: (
        json.dumps(c).encode().replace(b'"PATH=/bin"', b'"PATH=/bin", "X=\xff\xc0"')
    ),
}


@pytest.mark.parametrize("shape", ["plain", "privileged"])
@pytest.mark.parametrize("odd", list(ODD))
def test_what_runc_accepts_starts_a_container_that_asks_for_nothing(
    tmp_path: Path, settings: Path, shape: str, odd: str
) -> None:
    cfg = PLAIN if shape == "plain" else PRIVILEGED
    bundle = write_bundle(tmp_path / "b", ODD[odd](cfg))
    res = run_hook(state(bundle), settings, tmp_path)
    assert res.returncode == 0, res.stderr
    assert b"Traceback" not in res.stderr and b"not valid JSON" not in res.stderr


@pytest.mark.parametrize("shape", ["plain", "privileged"])
def test_deep_state_is_no_traceback(tmp_path: Path, settings: Path, shape: str) -> None:
    bundle = write_bundle(tmp_path / "b", PLAIN if shape == "plain" else PRIVILEGED)
    deep = state(bundle)[:-1] + b', "x": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    res = run_hook(deep, settings, tmp_path)
    assert (res.returncode, b"Traceback" in res.stderr) == (0, False), res.stderr


def test_nul_in_bundle_path_is_one_line(tmp_path: Path, settings: Path) -> None:
    res = run_hook(state(f"{tmp_path}/b\x00/evil"), settings, tmp_path)
    assert res.returncode == 1
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and "bundle" in lines[0] and "NUL" in lines[0], lines


def test_container_strings_reach_stderr_escaped(tmp_path: Path, settings: Path) -> None:
    """A forged log line, a terminal escape, BEL, BS, DEL, NUL: all shown as escapes, on one line."""
    evil = "nvidia.com/gpu=x\x1b[2J\x07\x08\x7f\u2028\r\nforged: deny: everything"
    cfg = config(["PATH=/bin"], annotations={"cdi.k8s.io/evil\x1b]0;title\x07": evil})
    bundle = write_bundle(tmp_path / "b", cfg)
    res = run_hook(state(bundle, id="id\x1b[31m\nforged"), settings, tmp_path)
    assert res.returncode == 1
    err = res.stderr.decode("utf-8", "surrogateescape")
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert not any(ch in err[:-1] for ch in "\x1b\x07\x08\x7f\x00\r\n\u2028"), err
    assert "\\x1b" in err


def test_long_strings_are_capped(tmp_path: Path, settings: Path) -> None:
    cfg = config(["PATH=/bin"], annotations={"cdi.k8s.io/x": "v/c=" + "A" * 200_000 + "\x1b"})
    bundle = write_bundle(tmp_path / "b", cfg)
    res = run_hook(state(bundle), settings, tmp_path)
    assert res.returncode == 1 and len(res.stderr) < 4096, len(res.stderr)


def test_fast_path_json_trick_never_raises_scanner_internals() -> None:
    """In a fresh process (``json`` not imported) the C scanner fails truncated escapes with a
    ``SystemError``: ``_loads`` must answer like ``json.loads`` instead (a ValueError)."""
    code = (
        "from hook.routes.fastpath import loads as _loads\n"
        "out = []\n"
        "for d in [b'\"\\\\u12', b'\"\\\\', b'{\"a\":\"\\\\u00', b'\"a', b'{\"\\\\u', b'1' * 5000, "
        "b'[' * 3000 + b']' * 3000]:\n"
        "    try:\n        _loads(d); out.append('ok')\n"
        "    except ValueError: out.append('ValueError')\n"
        "    except RecursionError: out.append('RecursionError')\n"
        "    except Exception as e: out.append(type(e).__name__)\n"
        "print(out)\n"
    )
    res = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == str(["ValueError"] * 6 + ["RecursionError"])


# --- item 8: a broken settings file ----------------------------------------------------------

BROKEN = {
    "typo-key": "privileged_alocation: narrow\n",
    "duplicate-key": "privileged_allocation: narrow\nprivileged_allocation: audit\n",
    "not-yaml": "privileged_allocation: [narrow\n",
    "bad-value": "privileged_allocation: sometimes\n",
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_broken_settings_stop_only_containers_they_could_change(tmp_path: Path, broken: str) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text(BROKEN[broken])
    plain = write_bundle(tmp_path / "plain", PLAIN)
    res = run_hook(state(plain), bad, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.decode().count("\n") == 1 and str(bad) in res.stderr.decode()
    for name, cfg in {
        "privileged": PRIVILEGED,
        "gpu-env": config(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]),
        "cdi-annotation": config(["PATH=/bin"], annotations={"example.com/cdi-gpu": "nvidia.com/gpu=0"}),
    }.items():
        res = run_hook(state(write_bundle(tmp_path / name, cfg)), bad, tmp_path)
        lines = res.stderr.decode().splitlines()
        assert res.returncode == 1 and len(lines) == 1 and str(bad) in lines[0], (name, lines)


@pytest.mark.parametrize("broken", ["bad-value", "not-yaml"])
def test_a_broken_settings_files_line_goes_to_the_log_it_names(tmp_path: Path, broken: str) -> None:
    """Issue 21, item 8: the operator's ``log_file`` still holds the error (and the plain container's
    "started anyway"), not the default log: read from the YAML, or from one plain ``log_file:``
    line when the YAML does not parse."""
    log = tmp_path / "operator.log"
    bad = tmp_path / "config.yaml"
    bad.write_text(f"log_file: {log}\n" + BROKEN[broken])
    plain = run_hook(state(write_bundle(tmp_path / "plain", PLAIN)), bad, tmp_path)
    device = run_hook(state(write_bundle(tmp_path / "privileged", PRIVILEGED)), bad, tmp_path)
    assert (plain.returncode, device.returncode) == (0, 1)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["verdict"] for r in records] == ["none", "error"]
    assert all(str(bad) in r["error"] for r in records)
    assert [r["container"]["id"] for r in records] == ["ctr-1", "ctr-1"]  # the state's id (issue 37 item 2)


def test_salvage_log_takes_only_a_valid_unambiguous_log_file(tmp_path: Path) -> None:
    from hook.sources.settingsfile import Settings, salvage_log

    path = tmp_path / "config.yaml"
    default = Settings().log_file
    for text, expected in {
        "log_file: /x/y.log\nlog_max_bytes: 8192\nnope: 1\n": ("/x/y.log", 8192),
        "log_file: relative.log\nnope: 1\n": (default, Settings().log_max_bytes),
        "log_file: /a.log\nlog_file: /b.log\n": (default, Settings().log_max_bytes),  # duplicate: no YAML
        "log_file: /x/y.log # here\n  - [\n": ("/x/y.log", Settings().log_max_bytes),
        "  log_file: /nested.log\n[\n": (default, Settings().log_max_bytes),
    }.items():
        path.write_text(text)
        s = salvage_log(path)
        assert (s.log_file, s.log_max_bytes) == expected, text
    assert salvage_log(tmp_path / "absent.yaml") == Settings()


def test_duplicate_key_is_an_error_naming_key_and_line(tmp_path: Path) -> None:
    from hook.core.errors import InputError
    from hook.sources.settingsfile import load_settings

    path = tmp_path / "config.yaml"
    path.write_text("cap_access: r\nlog_max_bytes: 8192\ncap_access: rw\n")
    with pytest.raises(InputError) as info:
        load_settings(path)
    assert str(info.value) == f"{path}: cap_access: duplicate key (line 3)"


@pytest.mark.parametrize(
    ("text", "rc"), [("cap_access: rw\n", 0), ("cap_access: rw\ncap_access: r\n", 1), ("nope: 1\n", 1)]
)
def test_settings_check_command(tmp_path: Path, text: str, rc: int) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    res = subprocess.run(
        [sys.executable, "-I", "-m", "hook", "settings", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == rc, res
    out = (res.stdout + res.stderr).strip().splitlines()
    assert len(out) == 1 and str(path) in out[0], out


def test_settings_check_reports_every_error_and_the_closest_key(tmp_path: Path) -> None:
    """Issue 22, item 5: all of a file's errors at once, an unknown key with the closest known one."""
    path = tmp_path / "config.yaml"
    path.write_text("privileged_alocation: narrow\ncap_access: rwx\nlog_file: rel.log\nzzz: 1\nruntime: x\n")
    res = subprocess.run(
        [sys.executable, "-I", "-m", "hook", "settings", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr.splitlines() == [
        f"hook: {path}: privileged_alocation: unknown setting; did you mean 'privileged_allocation'?",
        f"hook: {path}: cap_access: expected r or rw",
        f"hook: {path}: log_file: expected an absolute path",
        f"hook: {path}: zzz: unknown setting",
    ]


def test_settings_check_reports_a_duplicate_key_and_every_other_error(tmp_path: Path) -> None:
    """Issue 29 item 4: a duplicate key is one error among the file's others, never all it says."""
    path = tmp_path / "config.yaml"
    path.write_text("cap_access: rw\nzzz: 1\ncap_access: r\nlog_file: rel.log\nruntime: /usr/bin/crun\n")
    res = subprocess.run(
        [sys.executable, "-I", "-m", "hook", "settings", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr.splitlines() == [
        f"hook: {path}: cap_access: duplicate key (line 3)",
        f"hook: {path}: zzz: unknown setting",
        f"hook: {path}: log_file: expected an absolute path",
    ]
    path.write_text("cap_access: rw\ncap_access: rwx\n")  # the first value judged, the second line named
    from hook.core.errors import InputError
    from hook.sources.settingsfile import check_file, load_settings

    assert [str(e) for e in check_file(path)] == [f"{path}: cap_access: duplicate key (line 2)"]
    with pytest.raises(InputError, match="duplicate key"):  # the live hook still stops at the first
        load_settings(path)


def test_simulation_of_odd_configs_is_never_a_traceback(tmp_path: Path) -> None:
    """``hook --bundle`` on what runc accepts: a report, or (writing a 2,000-deep config back) one line."""
    bundle = write_bundle(tmp_path / "b", ODD["deep-extension"](PRIVILEGED))
    base = [
        sys.executable,
        "-I",
        "-m",
        "hook",
        "--bundle",
        str(bundle),
        "--config",
        str(tmp_path / "none.yaml"),
    ]
    (tmp_path / "none.yaml").write_text("# defaults\n")
    res = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    out = ["--output-config", str(tmp_path / "out.json")]
    res = subprocess.run([*base, *out], capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in res.stderr and len(res.stderr.splitlines()) <= 1, res.stderr


def test_settings_path_that_is_a_fifo_never_hangs(tmp_path: Path) -> None:
    import os
    import time

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    start = time.monotonic()
    res = run_hook(state(write_bundle(tmp_path / "plain", PLAIN)), fifo, tmp_path)
    assert res.returncode == 0 and "not a regular file" in res.stderr.decode(), res.stderr
    res = run_hook(state(write_bundle(tmp_path / "priv", PRIVILEGED)), fifo, tmp_path)
    assert res.returncode == 1 and "not a regular file" in res.stderr.decode(), res.stderr
    assert time.monotonic() - start < 30
