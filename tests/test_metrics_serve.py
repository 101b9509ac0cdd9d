"""Issue 37 item 5: ``hook metrics --serve ADDR:PORT`` answers a Prometheus scrape on a port
(127.0.0.1 only, in these tests), with the same counts as ``hook metrics`` prints."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bundles import settings_file
from tests.test_metrics import rec, samples, total, write


def _cmd(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "hook", "metrics", "--config", str(tmp / "settings.yaml"), *args]


def _start(tmp: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        _cmd(tmp, *args),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("hook metrics: serving /metrics on 127.0.0.1:"), line + proc.stderr.read()
    return proc, int(line.rsplit(":", 1)[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    settings_file(tmp_path)
    write(tmp_path / "hook.log", rec("apply", 1, route="live", denied=["/dev/nvidia2"], duration_ms=12))
    proc, port = _start(tmp_path, "--serve", "127.0.0.1:0")
    try:
        yield tmp_path, port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _get(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        res = conn.getresponse()
        return res.status, res.getheader("Content-Type") or "", res.read().decode()
    finally:
        conn.close()


def test_serve_answers_a_scrape_and_counts_what_the_log_gains(served: tuple[Path, int]) -> None:
    tmp, port = served
    status, kind, body = _get(port)
    assert status == 200 and kind.startswith("text/plain; version=0.0.4")
    got = samples(body)
    assert total(got, "oci_device_hook_narrowed_total", route="live") == 1
    assert total(got, "oci_device_hook_errors_total") == 0
    write(tmp / "hook.log", rec("error", 2, route="wrapper"), rec("deny", 3, route="wrapper"))
    got = samples(_get(port)[2])
    assert total(got, "oci_device_hook_errors_total", route="wrapper") == 1
    assert total(got, "oci_device_hook_refused_total", route="wrapper") == 1
    assert total(got, "oci_device_hook_narrowed_total", route="live") == 1  # counted once, not twice
    printed = subprocess.run(_cmd(tmp), capture_output=True, text=True, check=True).stdout
    assert samples(printed) == got  # the same counts as hook metrics prints


def test_serve_answers_only_get_metrics(served: tuple[Path, int]) -> None:
    """A client of the port (any pod, in the DaemonSet) reads counts and nothing else."""
    _, port = served
    assert _get(port, "/")[0] == 404
    assert _get(port, "/../../etc/shadow")[0] == 404
    assert _get(port, "/metrics", "POST")[0] == 501
    assert _get(port, "/metrics?name[]=x")[0] == 200


def test_idle_clients_do_not_hold_up_a_scrape(served: tuple[Path, int]) -> None:
    """The attacker: connections that send nothing (more than are served at once). A scrape is
    still answered, at the latest when the idle ones time out."""
    from hook.tools.metricsserve import MAX_CLIENTS, TIMEOUT

    _, port = served
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CLIENTS + 4)]
    try:
        start = time.monotonic()
        deadline = start + TIMEOUT + 10
        while True:
            try:
                status = _get(port)[0]
                break
            except (ConnectionError, http.client.HTTPException):
                assert time.monotonic() < deadline, "no scrape answered while clients sat idle"
                time.sleep(0.2)
        assert status == 200 and time.monotonic() - start < TIMEOUT + 10
    finally:
        for s in idle:
            s.close()


@pytest.mark.parametrize("value", ["9402", "host:", "1.2.3.4:99999", "a b:1", "[zz]:1"])
def test_serve_refuses_an_address_it_cannot_read(tmp_path: Path, value: str) -> None:
    settings_file(tmp_path)
    res = subprocess.run(_cmd(tmp_path, "--serve", value), capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "--serve" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""


def test_serve_is_not_a_textfile_or_a_window(tmp_path: Path) -> None:
    settings_file(tmp_path)
    for extra in (["--textfile", str(tmp_path)], ["--since", "1h"]):
        cmd = _cmd(tmp_path, "--serve", "127.0.0.1:0", *extra)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and "--serve: not with --textfile or --since" in res.stderr, res.stderr


def test_each_scrape_says_what_the_node_says_now(tmp_path: Path) -> None:
    """Issue 37 items 1-2: the gauges are read at each scrape, not at start: a settings edit that
    breaks the file turns settings_valid to 0 (the server keeps serving), the installer's verdict
    turns registered to 0."""
    settings = settings_file(tmp_path)
    status = tmp_path / "registration.json"
    status.write_text('{"ok": true, "registered": {"containerd": {"runc": true}}}')
    proc, port = _start(tmp_path, "--serve", "127.0.0.1:0", "--registration", str(status))
    try:
        got = samples(_get(port)[2])
        assert got[("oci_device_hook_settings_valid", ())] == 1
        assert got[("oci_device_hook_registered", (("engine", "containerd"), ("handler", "runc")))] == 1
        settings.write_text(settings.read_text() + "privileged_alocation: narrow\n")
        status.write_text('{"ok": false, "registered": {"containerd": {"runc": false}}}')
        status_code, _, body = _get(port)
        got = samples(body)
        assert status_code == 200 and got[("oci_device_hook_settings_valid", ())] == 0
        assert got[("oci_device_hook_registered", (("engine", "containerd"), ("handler", "runc")))] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
