"""``installer teardown``: make deleting the DaemonSet uninstall every node (Helm's pre-delete hook).

Rule: a rolling upgrade must not uninstall (the old pod's preStop runs while the new version
installs over it), so the DaemonSet's preStop uninstalls only under ``UNINSTALL_ON_STOP=true``.
This step sets that on the DaemonSet's ``installer`` container (a strategic merge patch) and
waits until the rollout has replaced every pod; when Helm then deletes the DaemonSet, each pod's
preStop runs ``installer uninstall`` with the prefix its record names. Nothing on a node is
changed here. A DaemonSet that is not there is nothing to do; a rollout that does not finish in
time is an error (one line), so ``helm uninstall`` stops before it leaves nodes registered.

Done means every pod of the DaemonSet runs the armed template with its ``installer`` container
started, not that it is ready: a node whose containerd was not restarted yet is not ready, and
must still be uninstalled.

Who can reach it: it runs in the pre-delete Job under a ServiceAccount whose Role allows ``get``
and ``patch`` on that one DaemonSet (``resourceNames``) and ``list`` on the namespace's pods, made
and deleted with the hook.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hook.core.errors import InputError
from hook.tools.install.node import say

__all__ = ["teardown"]

SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PATCH = {"spec": {"template": {"spec": {"containers": [
    {"name": "installer", "env": [{"name": "UNINSTALL_ON_STOP", "value": "true"}]}
]}}}}  # fmt: skip


def _api() -> str:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise InputError("KUBERNETES_SERVICE_HOST", "", "not in a pod: pass --api URL")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _call(url: str, token: str, method: str = "GET", body: Any = None) -> dict[str, Any] | None:
    """The object, or None for 404."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/strategic-merge-patch+json"
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context(cafile=str(SA / "ca.crt"))
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as res:
            got = json.loads(res.read(16 << 20))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise InputError(url, method, f"HTTP {exc.code}: {exc.read(512).decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InputError(url, method, str(getattr(exc, "reason", exc))) from None
    return got if isinstance(got, dict) else {}


def _armed(pod: dict[str, Any]) -> bool | None:
    """True: the pod runs the armed template and its installer has started (its preStop will
    uninstall); False: an old pod; None: armed but its installer not started yet."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    containers = (pod.get("spec") or {}).get("containers") or ()
    spec: dict[str, Any] = next((c for c in containers if c.get("name") == "installer"), {})
    env = {e.get("name"): e.get("value") for e in spec.get("env") or ()}
    if env.get("UNINSTALL_ON_STOP") != "true":
        return False
    statuses = (pod.get("status") or {}).get("containerStatuses") or ()
    state: dict[str, Any] = next((s for s in statuses if s.get("name") == "installer"), {})
    return True if state.get("started") or "running" in (state.get("state") or {}) else None


def _rolled(ds: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[bool, str]:
    """Every pod runs the armed template with its installer started: readiness is not asked for
    (a node whose containerd was not restarted yet is not ready, and must still be uninstalled)."""
    want = int((ds.get("status") or {}).get("desiredNumberScheduled") or 0)
    states = [_armed(p) for p in pods]
    armed, old, waiting = states.count(True), states.count(False), states.count(None)
    how = f"{armed} of {want} pod(s) armed and running, {old} old, {waiting} starting"
    return armed >= want and not old and not waiting, how


def teardown(namespace: str, name: str, timeout: float, api: str = "", token_file: str = "",
             poll: float = 5.0) -> int:  # fmt: skip
    """Arm the DaemonSet's preStop to uninstall and wait for the rollout; 0 when done."""
    base = (api or _api()).rstrip("/")
    token = Path(token_file or SA / "token").read_text().strip()
    url = f"{base}/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
    ds = _call(url, token)
    if ds is None:
        say(f"daemonset {namespace}/{name} not found: nothing to arm")
        return 0
    patched = _call(url, token, "PATCH", PATCH) or {}
    generation = int((patched.get("metadata") or {}).get("generation") or 0)
    say(f"daemonset {namespace}/{name}: UNINSTALL_ON_STOP=true; waiting for the rollout")
    deadline = time.monotonic() + timeout
    while True:
        ds = _call(url, token)
        if ds is None:
            say(f"daemonset {namespace}/{name} is gone")
            return 0
        seen = int((ds.get("status") or {}).get("observedGeneration") or 0) >= generation
        labels = ",".join(f"{k}={v}" for k, v in sorted(((ds.get("spec") or {}).get("selector") or {})
                                                         .get("matchLabels", {}).items()))  # fmt: skip
        pods = f"{base}/api/v1/namespaces/{namespace}/pods?labelSelector={quote(labels, safe='')}"
        listed = _call(pods, token)
        done, how = _rolled(ds, list((listed or {}).get("items") or ()))
        done = done and seen
        if done:
            say(f"daemonset {namespace}/{name}: {how}: deleting it now uninstalls every node")
            return 0
        if time.monotonic() >= deadline:
            why = f"rollout not done after {timeout:.0f} s ({how}); nodes not armed"
            raise InputError(url, "status", why)
        time.sleep(poll)
