"""Issue 37 item 4: ``installer teardown`` (the chart's pre-delete hook) arms the DaemonSet's
preStop to uninstall (``UNINSTALL_ON_STOP=true``) and waits for the rollout, against a fake API
server on 127.0.0.1 that plays the DaemonSet controller."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.tools.install.main import main
from hook.tools.install.teardown import teardown

PATH = "/apis/apps/v1/namespaces/gpu-guard/daemonsets/oci-device-hook"


class FakeApi:
    def __init__(self, exists: bool = True, rolls_after: int = 2, nodes: int = 3) -> None:
        self.exists, self.rolls_after, self.nodes = exists, rolls_after, nodes
        self.generation, self.gets_since_patch, self.patches = 1, 0, []  # type: ignore[var-annotated]
        self.auth: set[str] = set()

    def ds(self) -> dict[str, Any]:
        return {"metadata": {"generation": self.generation},
                "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "oci-device-hook"}}},
                "status": {"observedGeneration": self.generation, "desiredNumberScheduled": self.nodes,
                           "numberAvailable": 0}}  # fmt: skip

    def pods(self) -> list[dict[str, Any]]:
        """Before the patch: old pods. Then one armed pod still starting, the rest old; after
        ``rolls_after`` reads, every pod armed and running, and none ready (containerd on those
        nodes was never restarted: the readiness probe fails, and the node must still be armed)."""
        def pod(armed: bool, started: bool) -> dict[str, Any]:
            env = [{"name": "UNINSTALL_ON_STOP", "value": "true" if armed else "false"}]
            state = {"running": {}} if started else {"waiting": {"reason": "ContainerCreating"}}
            return {"metadata": {}, "spec": {"containers": [{"name": "installer", "env": env}]},
                    "status": {"containerStatuses": [{"name": "installer", "ready": False, "started": started,
                                                      "state": state}]}}  # fmt: skip

        if not self.patches:
            return [pod(False, True) for _ in range(self.nodes)]
        if self.gets_since_patch < self.rolls_after:
            return [pod(True, False)] + [pod(False, True) for _ in range(self.nodes - 1)]
        return [pod(True, True) for _ in range(self.nodes)]


@contextlib.contextmanager
def fake_api_server(tmp_path: Path) -> Iterator[tuple[FakeApi, str, Path]]:
    """A fake API server on 127.0.0.1 playing the DaemonSet controller, its URL and a token file."""
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            fake.auth.add(self.headers.get("Authorization", ""))
            selector = "app.kubernetes.io%2Fname%3Doci-device-hook"
            if self.path == f"/api/v1/namespaces/gpu-guard/pods?labelSelector={selector}":
                self._send(200, {"items": fake.pods()})
                return
            if self.path != PATH or not fake.exists:
                self._send(404, {"kind": "Status", "code": 404})
                return
            if fake.patches:
                fake.gets_since_patch += 1
            self._send(200, fake.ds())

        def do_PATCH(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.patches.append((self.headers["Content-Type"], body))
            fake.generation += 1
            self._send(200, {"metadata": {"generation": fake.generation}})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}", token
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApi, str, Path]]:
    with fake_api_server(tmp_path) as got:
        yield got


def test_teardown_arms_the_prestop_and_waits_for_every_pod(
    api: tuple[FakeApi, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake, url, token = api
    assert teardown("gpu-guard", "oci-device-hook", 30, url, str(token), poll=0.01) == 0
    (kind, body), = fake.patches
    assert kind == "application/strategic-merge-patch+json"
    (container,) = body["spec"]["template"]["spec"]["containers"]
    assert container == {"name": "installer", "env": [{"name": "UNINSTALL_ON_STOP", "value": "true"}]}
    assert fake.gets_since_patch >= fake.rolls_after  # it waited for the rollout, not just the patch
    assert fake.auth == {"Bearer s3cret"}
    err = capsys.readouterr().err
    assert "UNINSTALL_ON_STOP=true; waiting for the rollout" in err
    assert "3 of 3 pod(s) armed and running, 0 old, 0 starting: deleting it now uninstalls every node" in err


def test_teardown_of_a_daemonset_that_is_not_there_is_nothing_to_do(api: tuple[FakeApi, str, Path]) -> None:
    fake, url, token = api
    fake.exists = False
    assert teardown("gpu-guard", "oci-device-hook", 30, url, str(token), poll=0.01) == 0
    assert fake.patches == []


def test_teardown_fails_when_the_rollout_does_not_finish(api: tuple[FakeApi, str, Path]) -> None:
    """helm uninstall then stops before it deletes the DaemonSet: no node is left registered by
    a delete that could not uninstall it."""
    fake, url, token = api
    fake.rolls_after = 10**9
    why = r"rollout not done after 0 s \(0 of 3 pod\(s\) armed and running, 2 old, 1 starting\)"
    with pytest.raises(InputError, match=why):
        teardown("gpu-guard", "oci-device-hook", 0.2, url, str(token), poll=0.05)


def test_the_installer_runs_teardown(api: tuple[FakeApi, str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    fake, url, token = api
    monkeypatch.setattr("hook.tools.install.teardown.SA", token.parent)
    token.rename(token.parent / "token")
    args = ["--src", str(token.parent), "--api", url]
    assert main(["teardown", "--daemonset", "gpu-guard/oci-device-hook", "--timeout", "30", *args]) == 0
    assert len(fake.patches) == 1
    fake.exists = False
    assert main(["teardown", "--daemonset", "gpu-guard/other", *args]) == 0
