"""What the per-start process imports while the decider decides (``client.ask``'s ``meanwhile``):
the modules acting on any answer loads, and for a live one the apply step every plan with a change
runs; never the node helper, v2's writer or a decision module. Run in a fresh interpreter, so
the set is what that one call loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from hook.core import version  # the real client has it loaded (its VERSION)
from hook.routes import client, offer, wire
from hook.routes.act import Session
offer.decider_setting = lambda path: ""
wire.fingerprint = lambda opts, path: b""
loaded = []
def ask(route, fp, parts, timeout=None, meanwhile=None):
    before = set(sys.modules)
    meanwhile()
    loaded.extend(sorted(m for m in set(sys.modules) - before if m.startswith("hook.")))
    return "", ""
client.ask = ask
offer._offer(sys.argv[1].encode(), {}, [], Session("x"))
print(json.dumps(loaded))
"""

ANSWER = {
    "hook.adapters", "hook.adapters.log", "hook.routes.decision", "hook.core.record", "hook.routes.logrecord",
    "hook.sources.kubelet", "hook.sources.kubelet.podid", "hook.core.kubelet",
}  # fmt: skip
APPLY = {
    "hook.adapters.apply", "hook.adapters.apply.locate", "hook.adapters.apply.transaction",
    "hook.adapters.apply.cgroup_v1", "hook.core.kpath", "hook.core.errors", "hook.core.plainplan",
}  # fmt: skip


@pytest.mark.parametrize("route", ["live", "precreate"])
def test_meanwhile_loads_what_every_answer_of_the_route_needs(route: str) -> None:
    got = subprocess.run([sys.executable, "-I", "-c", PROBE, route], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    loaded = set(json.loads(got.stdout))
    assert loaded == (ANSWER | APPLY if route == "live" else ANSWER), sorted(loaded)
