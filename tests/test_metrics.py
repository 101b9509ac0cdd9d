"""Issue 29 item 6: counters and a latency histogram over the decision log, in the Prometheus text
format (``hook metrics``), kept as a node_exporter textfile (``--textfile``, ``metrics_textfile``).

Every output is read back with prometheus_client's own text parser, as Prometheus would. The
textfile's counters only grow while the log is appended to and rotated (the hook's own rotation,
logrotate's ``delaycompress``, a compressed rotation), each record counted once; the file is
replaced in one rename, never through a symlink, and never over a file another program wrote.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hook.adapters.log import write_log
from tests.bundles import (
    PRIVATE_RUN,
    _hook_exe,
    config,
    hook_cli,
    host_devices,
    node_args,
    settings_file,
    write_bundle,
)
from tests.bundles import state as oci_state

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample by (name, sorted labels); the parser raises on anything Prometheus would reject."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(got: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in got.items() if n == name and labels.items() <= dict(ls).items())


def rec(verdict: str, t: int, **fields: Any) -> dict[str, Any]:
    return {"verdict": verdict, "time": f"2026-12-01T10:{t // 60:02d}:{t % 60:02d}.000Z", **fields}


def write(log: Path, *records: Any) -> None:
    with log.open("a") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def metrics(tmp: Path, *args: str) -> tuple[int, str, str]:
    res = hook_cli("metrics", "--config", str(tmp / "settings.yaml"), *args)
    return res.returncode, res.stdout, res.stderr


def test_hook_metrics_counts_the_log_in_the_prometheus_text_format(tmp_path: Path) -> None:
    settings_file(tmp_path)
    log = tmp_path / "hook.log"
    write(
        log,
        rec("apply", 1, route="live", engine="containerd", denied=["/dev/nvidia1"], duration_ms=31.5),
        rec(
            "apply", 2, route="live", engine="containerd", denied=[], duration_ms=3
        ),  # CDI grant: not narrowed
        rec("deny", 3, route="wrapper", engine="containerd", decider="answered", duration_ms=7000),
        rec("error", 4, stage="precreate", engine="cri-o", decider="untrusted"),  # an older precreate line
        rec("none", 5, warnings=["decider: no answer within 400 ms; decided in-process"]),  # older: no field
        rec("none", 6, route="live\n# TYPE x gauge", engine='evil"} 1\nx', decider="declined\n"),
        "not json",
        json.dumps({"verdict": ["apply"]}),
    )
    code, out, err = metrics(tmp_path)
    assert (code, err) == (0, "")
    got = samples(out)
    d = "oci_device_hook_decisions_total"
    assert total(got, d) == 6
    assert total(got, d, verdict="apply", route="live", engine="containerd") == 2
    assert total(got, d, verdict="deny", route="wrapper") == 1
    assert total(got, d, verdict="error", route="precreate", engine="cri-o") == 1
    assert total(got, d, verdict="none", route="live", engine="unknown") == 1  # no route: a live line
    assert total(got, d, route="other", engine="other") == 1  # a hand-written line names no new series
    assert total(got, "oci_device_hook_narrowed_total") == 1
    assert total(got, "oci_device_hook_refused_total", route="wrapper") == 1
    assert total(got, "oci_device_hook_errors_total", route="precreate") == 1
    dec = "oci_device_hook_decider_total"
    assert total(got, dec, outcome="answered") == total(got, dec, outcome="untrusted") == 1
    assert total(got, dec, outcome="fallback") == 1  # the warning an older hook wrote
    assert total(got, dec, outcome="none") == 2 and total(got, dec, outcome="other") == 1
    assert total(got, dec) == 6
    assert total(got, "oci_device_hook_log_skipped_lines_total") == 2
    h = "oci_device_hook_decision_seconds"
    assert total(got, f"{h}_count", route="live") == 2 and total(got, f"{h}_count", route="wrapper") == 1
    assert total(got, f"{h}_sum", route="live") == pytest.approx(0.0345)
    assert total(got, f"{h}_bucket", route="live", le="0.005") == 1
    assert total(got, f"{h}_bucket", route="live", le="0.05") == 2
    assert total(got, f"{h}_bucket", route="wrapper", le="5.0") == 0
    assert total(got, f"{h}_bucket", route="wrapper", le="+Inf") == 1
    assert "evil" not in out and "# TYPE x" not in out  # a log line's strings never reach the text


def _textfile_counts(path: Path) -> tuple[float, float]:
    got = samples(path.read_text())
    return total(got, "oci_device_hook_decisions_total"), total(got, "oci_device_hook_decision_seconds_count")


def test_the_textfile_counts_every_record_once_across_rotations(tmp_path: Path) -> None:
    prom = tmp_path / "textfile"
    prom.mkdir()
    settings_file(tmp_path, metrics_textfile=str(prom))
    log, out = tmp_path / "hook.log", prom / "oci-device-hook.prom"
    written, seen = 0, []
    for n in range(200):  # the hook's own rotation at 4 KiB: .1, .2, .3, the oldest dropped
        assert (
            write_log(rec("apply", n, route="live", denied=["/dev/nvidia0"], duration_ms=9), log, 4096)
            is None
        )
        written += 1
        if n % 7 == 6:
            code, stdout, err = metrics(tmp_path, "--textfile")
            assert (code, stdout, err) == (0, "", "")
            seen.append(_textfile_counts(out))
    kept = sum(len(p.read_text().splitlines()) for p in tmp_path.glob("hook.log*"))
    assert kept < written  # the oldest lines were dropped: a count of what the files hold would fall
    assert metrics(tmp_path, "--textfile")[0] == 0
    seen.append(_textfile_counts(out))
    assert seen[-1] == (written, written)
    assert all(a <= b for a, b in itertools.pairwise(seen))  # a counter never goes down
    # printing shows what the next write would hold, and writes nothing
    before = out.read_bytes()
    code, text, _ = metrics(tmp_path)
    assert code == 0 and text.encode() == before and out.read_bytes() == before
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # node_exporter runs as another user
    assert sorted(p.name for p in prom.iterdir()) == ["oci-device-hook.prom"]  # no temp file left


def test_a_rotation_compressed_before_it_was_read_is_counted_by_time(tmp_path: Path) -> None:
    settings_file(tmp_path, metrics_textfile=str(tmp_path / "odh.prom"))
    log = tmp_path / "hook.log"
    write(log, rec("apply", 1, denied=["/dev/nvidia0"]), rec("none", 2))
    assert metrics(tmp_path, "--textfile")[0] == 0
    write(log, rec("deny", 3))  # written, then rotated and compressed before the next run
    with gzip.open(tmp_path / "hook.log.1.gz", "wt") as f:
        f.write(log.read_text())
    log.unlink()
    write(log, rec("error", 4))
    assert metrics(tmp_path, "--textfile")[0] == 0
    got = samples((tmp_path / "odh.prom").read_text())
    d = "oci_device_hook_decisions_total"
    assert [total(got, d, verdict=v) for v in ("apply", "none", "deny", "error")] == [1, 1, 1, 1]


def test_the_textfile_is_never_written_through_a_symlink_nor_over_another_file(tmp_path: Path) -> None:
    settings_file(tmp_path)
    write(tmp_path / "hook.log", rec("none", 1))
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "link.prom").symlink_to(victim)
    code, out, err = metrics(tmp_path, "--textfile", str(tmp_path / "link.prom"))
    assert (code, out) == (1, "") and "symlink" in err and len(err.splitlines()) == 1
    assert victim.read_text() == "precious\n" and (tmp_path / "link.prom").is_symlink()
    other = tmp_path / "node.prom"  # another exporter's textfile
    other.write_text("# HELP node_thing x\n# TYPE node_thing gauge\nnode_thing 1\n")
    code, _, err = metrics(tmp_path, "--textfile", str(other))
    assert code == 1 and "not written by hook metrics" in err
    assert other.read_text().startswith("# HELP node_thing")
    giant = tmp_path / "giant.prom"  # a planted file that starts like ours
    giant.write_bytes(b"# oci-device-hook metrics (hook metrics --textfile): x\n" + b"#" * (2 << 20))
    code, _, err = metrics(tmp_path, "--textfile", str(giant))
    assert code == 1 and "larger than" in err and giant.stat().st_size > 2 << 20
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)
    code, _, err = metrics(tmp_path, "--textfile", str(fifo))  # never blocks on a FIFO
    assert code == 1 and "not a regular file" in err
    code, _, err = metrics(tmp_path, "--textfile", str(tmp_path / "no-such-dir" / "x.prom"))
    assert code == 1 and "no such directory" in err
    assert not (tmp_path / "no-such-dir").exists()
    for name in ("foo.txt", "node.prom.tmp"):  # a file name whose suffix is the problem, not a directory
        code, _, err = metrics(tmp_path, "--textfile", str(tmp_path / name))
        assert code == 1 and len(err.splitlines()) == 1 and "no such directory" not in err, err
        assert f"{tmp_path / name}: textfile: not a directory, and its suffix" in err
        assert "is not .prom" in err
        assert not (tmp_path / name).exists()
    code, _, err = metrics(tmp_path, "--textfile")  # no PATH and no metrics_textfile
    assert code == 2 and "metrics_textfile" in err


def test_a_named_log_that_does_not_exist_is_an_error_the_settings_log_is_not(tmp_path: Path) -> None:
    settings_file(tmp_path)
    code, out, _ = metrics(tmp_path)
    assert code == 0 and total(samples(out), "oci_device_hook_decisions_total") == 0
    code, out, err = metrics(tmp_path, "--file", str(tmp_path / "nope.log"))
    assert (code, out) == (1, "") and "nope.log" in err


def test_settings_check_validates_metrics_textfile(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("metrics_textfile: relative/odh.prom\n")
    res = hook_cli("settings", "check", str(bad))
    assert res.returncode == 1 and "metrics_textfile" in res.stderr and "absolute" in res.stderr
    good = tmp_path / "good.yaml"
    good.write_text('metrics_textfile: ""\n')
    assert hook_cli("settings", "check", str(good)).returncode == 0


@pytest.mark.skipif(not PRIVATE_RUN, reason="needs root and unshare (the hook's caches stay private)")
def test_real_routes_log_their_route_and_duration_and_metrics_reads_them(tmp_path: Path) -> None:
    import subprocess

    settings = settings_file(tmp_path)
    cfg = config(privileged=True, devices=host_devices())  # a full decision: verdict none, logged
    bundle = write_bundle(tmp_path / "b", cfg)
    hook = [*PRIVATE_RUN, *_hook_exe()]
    live = subprocess.run([*hook, "prestart", *node_args(), "--config", str(settings)],
                          input=oci_state(bundle), capture_output=True, timeout=60)  # fmt: skip
    assert live.returncode == 0, live.stderr
    body = (bundle / "config.json").read_bytes()
    pre = subprocess.run([*hook, "precreate", *node_args(), "--config", str(settings)], input=body,
                         capture_output=True, timeout=60)  # fmt: skip
    assert pre.returncode == 0, pre.stderr
    lines = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert [r.get("route") for r in lines] == ["prestart", "precreate"]
    assert all(isinstance(r["duration_ms"], float) and 0 < r["duration_ms"] < 60_000 for r in lines)
    got = samples(metrics(tmp_path)[1])
    for route in ("prestart", "precreate"):
        assert total(got, "oci_device_hook_decisions_total", route=route, verdict="none") == 1
        assert total(got, "oci_device_hook_decision_seconds_count", route=route) == 1


def _k8s() -> tuple[dict[str, Any], dict[str, str]]:
    import yaml

    pkg = Path(__file__).resolve().parents[1] / "packaging/kubernetes"
    ds = yaml.safe_load((pkg / "daemonset.yaml").read_text())
    scripts = next(
        d for d in yaml.safe_load_all((pkg / "configmap.yaml").read_text())
        if d["metadata"]["name"] == "oci-device-hook-scripts"
    )["data"]  # fmt: skip
    return ds, scripts


def test_the_daemonset_serves_metrics_with_no_privilege_and_only_the_log_directory() -> None:
    """Issue 37 item 5: /metrics on a named port (a PodMonitor scrapes it), and of the node only
    the hook's own log directory, read-only (no longer the whole /var/log, nor a textfile dir)."""
    ds, _ = _k8s()
    pod = ds["spec"]["template"]["spec"]
    c = next(c for c in pod["containers"] if c["name"] == "metrics")
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    host = {n: volumes[n]["hostPath"]["path"] for n in mounts if "hostPath" in volumes[n]}
    assert host == {"node-log": "/var/log/oci-device-hook"} and mounts["node-log"]["readOnly"] is True
    env = {e["name"]: e["value"] for e in c["env"]}
    port = int(env["METRICS_LISTEN"].rsplit(":", 1)[1])
    assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]


def test_the_daemonset_script_runs_hook_metrics_on_the_bundled_interpreter(
    built_deb: Path, tmp_path: Path
) -> None:
    """metrics.sh as the image runs it: the package's tree (dpkg-deb -x, as the Containerfile
    copies it) and its own interpreter, which must bring prometheus_client along."""
    import subprocess

    _, scripts = _k8s()
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(built_deb), str(root)], check=True)
    script = tmp_path / "metrics.sh"
    script.write_text(scripts["metrics.sh"])
    settings = settings_file(tmp_path)
    write(tmp_path / "hook.log", rec("apply", 1, route="live", denied=["/dev/nvidia2"], duration_ms=12))
    (tmp_path / "textfile").mkdir()
    env = {"PATH": "/usr/bin:/bin", "SRC": str(root), "SETTINGS": str(settings),
           "TEXTFILE": str(tmp_path / "textfile"), "METRICS_SECONDS": "0"}  # fmt: skip
    res = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = samples((tmp_path / "textfile/oci-device-hook.prom").read_text())
    assert total(got, "oci_device_hook_narrowed_total", route="live") == 1
    # the .deb's way: a timer it installs but does not enable (metrics_textfile must be set first)
    units = root / "lib/systemd/system"
    service = (units / "oci-device-hook-metrics.service").read_text()
    verdict = "/var/lib/oci-device-hook/registration.json"  # issue 37 item 1: kept before each run
    assert f"ExecStartPre=-/usr/libexec/oci-device-hook/installer status --write {verdict}\n" in service
    start = f"ExecStart=/usr/libexec/oci-device-hook/hook metrics --textfile --registration {verdict}\n"
    assert start in service
    # the package's own installer keeps the verdict, and metrics.sh hands the pod's copy on
    (tmp_path / "pod").mkdir()
    node = tmp_path / "node"
    node.mkdir()
    installer = root / "usr/libexec/oci-device-hook/installer"
    kept = subprocess.run([str(installer), "status", "--write", str(tmp_path / "pod/registration.json"),
                           "--root", str(node)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert kept.returncode == 0 and json.loads((tmp_path / "pod/registration.json").read_text())["ok"]
    (tmp_path / "pod/registration.json").write_text('{"registered": {"containerd": {"runc": false}}}')
    res = subprocess.run(["sh", str(script)], env={**env, "POD_STATE": str(tmp_path / "pod")},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    got = samples((tmp_path / "textfile/oci-device-hook.prom").read_text())
    runc = ("oci_device_hook_registered", (("engine", "containerd"), ("handler", "runc")))
    assert res.returncode == 0 and got[runc] == 0, res.stderr
    assert "OnUnitActiveSec=1min" in (units / "oci-device-hook-metrics.timer").read_text()
    assert not list(root.rglob("timers.target.wants"))


def test_since_prints_a_window_of_the_log_and_never_keeps_a_textfile(tmp_path: Path) -> None:
    """The shared contract's ``--since`` (as ``hook log``): the records stamped then or later only;
    a textfile's counters must only grow, so a window is never written into one."""
    settings_file(tmp_path)
    write(tmp_path / "hook.log", rec("apply", 1, route="live"), rec("deny", 2, route="live"))
    code, out, err = metrics(tmp_path, "--since", "2026-12-01T10:00:02")
    assert (code, err) == (0, "")
    got = samples(out)
    assert total(got, "oci_device_hook_decisions_total") == 1
    assert total(got, "oci_device_hook_decisions_total", verdict="deny") == 1
    code, _, err = metrics(tmp_path, "--since", "2h", "--textfile", str(tmp_path / "m.prom"))
    assert code == 2 and "--since" in err
    assert not (tmp_path / "m.prom").exists()
    code, _, err = metrics(tmp_path, "--since", "soon")
    assert code == 2 and "--since" in err


def test_late_narrowings_of_the_nri_daemon_are_counted_with_their_outcome(tmp_path: Path) -> None:
    """Issue 34 item 4: ``oci_device_hook_late_narrowed_total{outcome}`` from the ``late: true``
    records; a start-time narrowing or a late record that changed nothing is not a late narrowing."""
    settings_file(tmp_path)
    write(
        tmp_path / "hook.log",
        rec("apply", 1, route="nri", stage="synchronize", late=True, cgroup_version=1, denied=["/dev/n0"]),
        rec("apply", 2, route="nri", stage="synchronize", late=True, cgroup_version=2, denied=["/dev/n0"]),
        rec("error", 3, route="nri", stage="synchronize", late=True, error="pid: 4 is not a container's"),
        rec("apply", 4, route="nri", stage="start", cgroup_version=1, denied=["/dev/nvidia0"]),
        rec("none", 5, route="nri", stage="synchronize", late=True),
        rec("apply", 6, route="nri", stage="synchronize", late="true", cgroup_version=1),  # not the flag
    )
    code, out, err = metrics(tmp_path)
    assert (code, err) == (0, "")
    got = samples(out)
    late = "oci_device_hook_late_narrowed_total"
    assert total(got, late, outcome="narrowed") == 2 and total(got, late, outcome="failed") == 1
    assert total(got, "oci_device_hook_decisions_total", route="nri") == 6


def test_every_counter_series_starts_at_0_and_build_info_is_written(tmp_path: Path) -> None:
    """Issue 37 item 2: an alert on ``rate(oci_device_hook_errors_total[5m])`` needs the series
    before the first error; every series of the closed label sets is there at 0 on an empty log."""
    from hook.core.version import VERSION
    from hook.tools.metrics import DOMAINS, ROUTES

    settings_file(tmp_path)
    code, out, _ = metrics(tmp_path)
    got = samples(out)
    assert code == 0 and got
    assert not any(v for (n, _), v in got.items() if not n.endswith(("_info", "_valid")))
    for verdict, route, engine in itertools.product(DOMAINS["verdict"], DOMAINS["route"], DOMAINS["engine"]):
        labels = (("engine", engine), ("route", route), ("verdict", verdict))
        assert got[("oci_device_hook_decisions_total", labels)] == 0
    for route in ROUTES:
        assert got[("oci_device_hook_errors_total", (("engine", "containerd"), ("route", route)))] == 0
        assert got[("oci_device_hook_decision_seconds_count", (("route", route),))] == 0
    assert got[("oci_device_hook_build_info", (("version", VERSION),))] == 1
    assert got[("oci_device_hook_settings_valid", ())] == 1
    write(tmp_path / "hook.log", rec("error", 1, route="wrapper", engine="containerd"))
    got = samples(metrics(tmp_path)[1])
    assert got[("oci_device_hook_errors_total", (("engine", "containerd"), ("route", "wrapper")))] == 1


@pytest.mark.parametrize("broken", ["privileged_alocation: narrow\n", "privileged_allocation: [narrow\n"])
def test_log_and_metrics_survive_a_broken_settings_file(tmp_path: Path, broken: str) -> None:
    """Issue 37 item 2: with the settings file broken (the failure that stops GPU pods), ``hook
    metrics`` and ``hook log`` still read the log it names, warn once, and the gauge says 0."""
    log = tmp_path / "operator.log"
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"log_file: {log}\nmetrics_textfile: {textdir}\n{broken}")
    write(log, rec("error", 1, route="precreate", engine="containerd", container={"id": "c1"}, error="x"))
    printed = ""
    for args in ([], ["--textfile"]):
        code, out, err = metrics(tmp_path, *args)
        printed = printed or out
        assert code == 0 and err.count("\n") == 1 and err.startswith(f"hook: warning: {settings}"), err
        assert f"log_file {log}" in err and f"metrics_textfile {textdir}" in err
    for got in (samples(printed), samples((textdir / "oci-device-hook.prom").read_text())):
        assert got[("oci_device_hook_settings_valid", ())] == 0
        assert got[("oci_device_hook_errors_total", (("engine", "containerd"), ("route", "precreate")))] == 1
    res = hook_cli("log", "--config", str(settings), "--format", "json")
    assert res.returncode == 0 and res.stderr.startswith(f"hook: warning: {settings}"), res.stderr
    assert [r["container"]["id"] for r in map(json.loads, res.stdout.splitlines())] == ["c1"]
    res = hook_cli("metrics", "--config", str(tmp_path / "absent.yaml"))  # named but absent: still an error
    assert res.returncode == 1 and "no such file" in res.stderr
