"""Issue 28 item 4: crun's systemd cgroup driver reads a 0 as a wildcard; spec-level output never
hands it a rule it would widen.

crun (``src/libcrun/cgroup-systemd.c``, ``IS_WILDCARD(x) (x <= 0)``) turns ``allow c 195:0`` (GPU
0) into ``DeviceAllow=char-195``: every GPU. The model in tests/crun_systemd.py restates that
conversion on the config's JSON; no systemd-managed crun runs on the test machine (no systemd as
init here), so the unit it would ask for is what the tests judge, device by device. Before this
change ``hook precreate`` (and the wrapper, and ``--output-config``) handed out ``c 195:0`` and
``c 511:0`` whatever the runtime and its driver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hook.core.crunsd import crun_reading, widened
from hook.core.oci import parse_rule
from hook.core.rules import Access, DeviceType, Rule, evaluate
from hook.routes import crunguard, wrapper
from hook.routes.precreate import run_precreate
from tests.bundles import config
from tests.crun_systemd import CRUN_DEFAULTS, device_allow, unit_allows
from tests.hosttree import make_host_tree
from tests.test_runtime_wrapper import kit, saw, wrap  # noqa: F401 - kit is a fixture

C = DeviceType.CHAR
UVM = 511  # tests/hosttree.py's nvidia-uvm major on 8x-mig
SYSTEMD_PATH = "system.slice:docker:0123abcd"


def rule(major: int | None, minor: int | None, access: str = "rw", kind: DeviceType = C) -> Rule:
    return Rule(allow=True, type=kind, major=major, minor=minor, access=Access.parse(access))


def deny_all() -> Rule:
    return Rule(allow=False)


# --- the reading, pure ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("r", "reading"),
    [(rule(195, 0), (195, None)), (rule(0, 0), (None, None)), (rule(0, 3), None), (rule(195, 3), (195, 3)),
     (rule(None, 0), (None, None)), (rule(195, None), (195, None))],
    ids=["minor-0", "zero-zero", "major-0-dropped", "exact", "star-0", "star"],
)  # fmt: skip
def test_crun_reads_a_zero_as_every_number(r: Rule, reading: tuple[int | None, int | None] | None) -> None:
    assert crun_reading(r) == reading


def test_the_issues_rules_are_widened_and_the_harmless_ones_not() -> None:
    gpu0, uvm0 = rule(195, 0), rule(UVM, 0)
    assert widened([deny_all(), gpu0, rule(195, 255)]) == (gpu0,)
    assert widened([deny_all(), uvm0]) == (uvm0,)
    assert widened([deny_all(), rule(UVM, None), uvm0]) == ()  # the major is granted anyway
    assert widened([deny_all(), rule(5, 0, "rwm")]) == ()  # /dev/tty: crun widens char-5 itself
    assert widened([deny_all(), rule(195, 0, "m")]) == ()  # crun grants m on every char device
    assert widened([deny_all(), rule(195, 1), rule(195, 255)]) == ()
    known = [(C, UVM, 0), (C, UVM, 1), (C, 195, 0), (C, 195, 1)]
    assert widened([deny_all(), uvm0, rule(UVM, 1)], known) == ()  # uvm-tools granted too: nothing new
    assert widened([deny_all(), gpu0, rule(UVM, 0), rule(UVM, 1)], known) == (gpu0,)  # GPU 1 exists
    assert widened([deny_all(), uvm0], [(C, UVM, 0)]) == (uvm0,)  # nothing else known: fail closed


PROBE_MAJORS = (1, 5, 136, 195, UVM, 226, 0)
PROBE_MINORS = (0, 1, 2, 3, 128, 255)


def _runc_reading(rules: list[dict[str, Any]], kind: str, major: int, minor: int, bit: str) -> bool:
    parsed = [parse_rule(r, "c", "r") for r in rules]
    crun_own = [rule(d[1] if d[1] >= 0 else None, d[2] if d[2] >= 0 else None, d[3], DeviceType(d[0]))
                for d in CRUN_DEFAULTS]
    crun_own += [rule(5, None, "rwm"), rule(136, None, "rwm")]  # what crun's own defaults widen to
    return evaluate([*parsed, *crun_own], DeviceType(kind), major, minor, Access.parse(bit))


@pytest.mark.parametrize("seed", range(40))
def test_a_list_without_a_widened_rule_gets_no_more_from_crun_than_runc_gives(seed: int) -> None:
    """Against the model: whenever ``widened`` says none, the unit crun asks for opens no device
    (on the probe grid) that the rules read exactly, plus crun's own defaults, keep closed; and
    whenever it names one, some probe device is opened that should not be."""
    import random

    rnd = random.Random(seed)
    rules: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    for _ in range(rnd.randint(1, 5)):
        minor = rnd.choice((0, 0, 1, 2, 255, None))
        access = rnd.choice(("rw", "rwm", "r", "m"))
        rules.append({"allow": True, "type": "c", "major": rnd.choice((195, UVM, 226, 5)), "minor": minor,
                      "access": access})
        if rules[-1]["minor"] is None:
            del rules[-1]["minor"]
    policy, entries = device_allow(rules)
    extra = [(m, n, b) for m in PROBE_MAJORS for n in PROBE_MINORS for b in "rw"
             if unit_allows(policy, entries, "c", m, n, b) and not _runc_reading(rules, "c", m, n, b)]
    flagged = widened([parse_rule(r, "c", "r") for r in rules])
    assert bool(flagged) == bool(extra), (rules, flagged, extra)


# --- spec level: precreate, the wrapper's facts, --output-config -----------------------------------


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Seed 000 with real character nodes (8 GPUs, nvidia-uvm and -tools), its settings and log; the
    fast path's record under the test's temp dir, never the host's /run."""
    from hook.routes import fastpath
    from hook.sources import settingsfile

    record = tmp_path / "run" / "fastpath.json"
    monkeypatch.setattr(fastpath, "FASTPATH_CACHE", str(record))
    monkeypatch.setattr(settingsfile, "FASTPATH_CACHE", record)
    root = tmp_path / "root"
    make_host_tree(root, "8x-mig", mknod=True)
    settings = tmp_path / "settings.yaml"
    settings.write_text(json.dumps({"log_file": str(tmp_path / "hook.log"),
                                    "cache_dir": str(tmp_path / "cache"), "driver_root": str(root),
                                    "cdi_spec_dirs": [str(tmp_path / "no-cdi")]}))
    return {"root": root, "opts": {"--config": [str(settings)]}, "tmp": tmp_path}


def gpu_config(index: str, cgroups_path: str = SYSTEMD_PATH) -> bytes:
    cfg = config([f"NVIDIA_VISIBLE_DEVICES={index}"])
    cfg["linux"]["cgroupsPath"] = cgroups_path
    return json.dumps(cfg).encode()


def precreate(node: dict[str, Any], data: bytes, monkeypatch: pytest.MonkeyPatch,
              **env: str) -> tuple[int, bytes]:
    for name in (crunguard.MANAGER_ENV, crunguard.EXEC_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return run_precreate(node["opts"], data)


def opened_by_crun(out: bytes) -> set[int]:
    """The GPU minors (major 195) a crun with the systemd driver opens for this decided config."""
    policy, entries = device_allow(json.loads(out)["linux"]["resources"]["devices"])
    return {m for m in range(8) if unit_allows(policy, entries, "c", 195, m, "rw")}


def test_gpu_0_for_crun_with_the_systemd_driver_is_refused_with_one_line(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {crunguard.MANAGER_ENV: "systemd", crunguard.EXEC_ENV: "/usr/bin/crun"}
    code, out = precreate(node, gpu_config("0"), monkeypatch, **env)
    if code == 0:  # before: the decided config went out, and crun opened every GPU
        assert opened_by_crun(out) == {0}, opened_by_crun(out)
    err = capsys.readouterr().err
    assert (code, out) == (1, b""), err
    assert len(err.splitlines()) == 1 and "allow c 195:0 rw" in err and "DeviceAllow=char-195" in err, err
    assert "'/usr/bin/crun'" in err
    record = json.loads((node["tmp"] / "hook.log").read_text().splitlines()[-1])
    assert record["verdict"] == "error" and "char-195" in record["error"]


@pytest.mark.parametrize(
    "env",
    [{crunguard.MANAGER_ENV: "systemd", crunguard.EXEC_ENV: "runc"},
     {crunguard.MANAGER_ENV: "cgroupfs", crunguard.EXEC_ENV: "crun"}],
    ids=["runc-systemd", "crun-cgroupfs"],
)  # fmt: skip
def test_gpu_0_where_no_driver_widens_it_is_decided(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    code, out = precreate(node, gpu_config("0"), monkeypatch, **env)
    assert code == 0 and out
    rules = json.loads(out)["linux"]["resources"]["devices"]
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"} in rules


def test_another_gpu_is_decided_for_crun_with_systemd(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU 3 and the uvm pair (511:0 widened to char-511 opens only nvidia-uvm-tools, granted too)."""
    env = {crunguard.MANAGER_ENV: "systemd", crunguard.EXEC_ENV: "crun"}
    code, out = precreate(node, gpu_config("3"), monkeypatch, **env)
    assert code == 0, out
    assert opened_by_crun(out) == {3}


@pytest.mark.parametrize(("path", "code"), [(SYSTEMD_PATH, 1), ("/docker/0123abcd", 0)],
                         ids=["systemd", "path"])
def test_without_a_command_line_the_cgroups_path_tells_the_driver(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch, path: str, code: int
) -> None:
    """hooks.d precreate: no runtime named, so it may be crun; the systemd form of cgroupsPath
    (``slice:prefix:name``) is what engines write for the systemd driver."""
    assert precreate(node, gpu_config("0", path), monkeypatch)[0] == code


@pytest.mark.parametrize(("says", "code"), [("runc version 1.1.12", 0), ("crun version 1.8.1", 1), ("", 1)],
                         ids=["fronts-runc", "fronts-crun", "says-nothing"])
def test_a_runtime_front_is_asked_which_runtime_it_runs(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch, says: str, code: int
) -> None:
    front = node["tmp"] / "nvidia-container-runtime"
    front.write_text(f"#!/bin/sh\necho 'NVIDIA Container Runtime version 1.17.0'\necho '{says}'\n")
    front.chmod(0o755)
    env = {crunguard.MANAGER_ENV: "systemd", crunguard.EXEC_ENV: str(front)}
    assert precreate(node, gpu_config("0"), monkeypatch, **env)[0] == code


def test_the_wrapper_names_its_facts_as_the_guard_reads_them() -> None:
    names = (crunguard.MANAGER_ENV, crunguard.EXEC_ENV)
    assert names == (wrapper.CGROUP_MANAGER_ENV, wrapper.RUNTIME_EXEC_ENV)
    assert {crunguard.MANAGER_ENV, crunguard.EXEC_ENV} <= set(wrapper._HOOK_ONLY)  # never the runtime's


def test_output_config_refuses_the_same(node: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    from hook.cli import run

    bundle = node["tmp"] / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_bytes(gpu_config("0"))
    out = node["tmp"] / "out.json"
    argv = ["--bundle", str(bundle), "--config", node["opts"]["--config"][0], "--output-config", str(out)]
    rc = run(argv)
    err = capsys.readouterr().err
    assert rc == 1 and "DeviceAllow=char-195" in err and not out.exists(), err
    (bundle / "config.json").write_bytes(gpu_config("0", "/docker/0123abcd"))
    assert run(argv) == 0
    assert out.exists()


def test_the_wrapper_in_front_of_crun_with_systemd_refuses_and_writes_nothing(
    kit: dict[str, Any],  # noqa: F811
) -> None:
    """End to end through packaging/runtime: containerd's line with ``--systemd-cgroup`` in front of
    a runtime named crun. Before: the config was rewritten with ``c 195:0`` and crun ran."""
    crun = kit["tmp"] / "bin" / "crun"
    crun.parent.mkdir()
    crun.write_bytes(kit["fake"].read_bytes())
    crun.chmod(0o755)
    settings = kit["settings"].read_text().replace(str(kit["fake"]), str(crun))
    kit["settings"].write_text(settings)
    data = gpu_config("0")
    (kit["bundle"] / "config.json").write_bytes(data)
    args = ["--systemd-cgroup", "create", "--bundle", str(kit["bundle"]), "id"]
    res = wrap(kit, *args)
    assert res.returncode == 1 and "DeviceAllow=char-195" in res.stderr, res.stderr
    assert not kit["record"].exists()  # crun never ran
    assert (kit["bundle"] / "config.json").read_bytes() == data
    assert not (kit["bundle"] / "config.json.orig").exists()
    res = wrap(kit, *args[1:])  # crun's own cgroupfs driver reads 195:0 as one node: decided, run
    assert res.returncode == 0, res.stderr
    assert saw(kit)["argv"] == args[1:]


# --- issue 35 item 2: the guard is paid only where it may refuse (hook.routes.crungate) -----------


def _runtimes(tmp: Path) -> list[str | None]:
    """Every way the wrapper names its runtime: none (hooks.d), names on PATH, paths, a link named
    runc that runs crun, a front that says nothing."""
    crun_link = tmp / "bin" / "runc"
    crun_link.parent.mkdir()
    crun_link.symlink_to("/usr/bin/crun")
    front = tmp / "nvidia-container-runtime"
    front.write_text("#!/bin/sh\necho 'NVIDIA Container Runtime version 1.17.0'\n")
    front.chmod(0o755)
    real_runc = tmp / "real" / "runc"
    real_runc.parent.mkdir()
    real_runc.write_text("#!/bin/sh\necho 'runc version 1.1.12'\n")
    real_runc.chmod(0o755)
    return [None, "", "runc", "crun", str(crun_link), str(front), str(real_runc), "/nonexistent/runc", "nope"]


def _cleared_before(rules: list[Rule], path: str, env: dict[str, str]) -> bool:
    """The guard's own reading before the gate existed (issue 28): True where it let the config
    through without looking at the host's nodes (the oracle the gate is held to)."""
    if not widened(rules):
        return True
    manager = env.get(crunguard.MANAGER_ENV) or ("systemd" if path.count(":") == 2 else "cgroupfs")
    if manager != "systemd":
        return True
    runtime = env.get(crunguard.EXEC_ENV, "")
    return bool(runtime) and crunguard.runtime_kind(runtime) == "runc"


def test_the_gate_never_skips_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``crungate.needs_guard`` false ⇒ the guard would have let the config through, over every
    manager, path form, runtime and rule list (fail-closed: where the runtime or the driver cannot
    be told, the guard runs). The per-start process loads the guard only where the gate is true."""
    from hook.routes import crungate

    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin")
    rule_lists = [[deny_all(), rule(195, 0)], [deny_all(), rule(195, 3)], [deny_all(), rule(UVM, 0)], []]
    skipped = 0
    for runtime in _runtimes(tmp_path):
        for manager in (None, "", "systemd", "cgroupfs", "disabled"):
            for path in (SYSTEMD_PATH, "/docker/0123abcd", "", "a:b", "a:b:c:d"):
                named = ((crungate.MANAGER_ENV, manager), (crungate.EXEC_ENV, runtime))
                env = {k: v for k, v in named if v is not None}
                for rules in rule_lists:
                    if not crungate.needs_guard(bool(widened(rules)), path.count(":") == 2, env):
                        skipped += 1
                        assert _cleared_before(rules, path, env), (runtime, manager, path, rules)
                        assert crunguard.refusal(rules, path, env) is None
    assert skipped  # the gate does clear some starts (runc, cgroupfs, nothing widened)


@pytest.mark.parametrize(
    ("runtime", "manager", "systemd_path", "needed"),
    [("runc", "systemd", True, False), ("/usr/sbin/runc", "systemd", True, False),
     ("runc", "", False, False), ("crun", "cgroupfs", True, False), (None, None, False, False),
     ("crun", "systemd", False, True), (None, None, True, True), ("", "", True, True),
     ("nvidia-container-runtime", "systemd", False, True), ("RUNC-LINK", "systemd", False, True)],
    ids=["runc", "runc-path", "runc-path-form", "crun-cgroupfs", "hooksd-cgroupfs-path", "crun-systemd",
         "hooksd-systemd-path", "empty", "front", "runc-link-to-crun"],
)  # fmt: skip
def test_the_gate_reads_the_wrappers_facts_fail_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str | None, manager: str | None,
    systemd_path: bool, needed: bool,
) -> None:
    from hook.routes import crungate

    link = tmp_path / "runc"
    link.symlink_to("/usr/bin/crun")
    env = {crungate.MANAGER_ENV: manager, crungate.EXEC_ENV: str(link) if runtime == "RUNC-LINK" else runtime}
    env = {k: v for k, v in env.items() if v is not None}
    assert crungate.needs_guard(True, systemd_path, env) is needed
    assert crungate.needs_guard(False, True, env) is False  # no rule it widens: nothing to guard


@pytest.mark.parametrize("name", ["runc", "sh", "nope", "/usr/sbin/runc", "./runc", "/nonexistent/x"])
@pytest.mark.parametrize("path", [None, "", ":", "/usr/sbin:/usr/bin:/bin", "/nonexistent:/usr/bin"])
def test_which_is_shutil_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, path: str | None
) -> None:
    import shutil

    from hook.routes import crungate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runc").write_text("#!/bin/sh\n")
    (tmp_path / "runc").chmod(0o755)
    if path is None:
        monkeypatch.delenv("PATH", raising=False)
    else:
        monkeypatch.setenv("PATH", path)
    assert crungate.which(name) == shutil.which(name)
