"""Issue 21, items 1-4, with real runc: the hook reads each field the way runc and the engine do.

Every container runs through ``livekit`` (``unshare -m``, private ``/dev``, ``/run`` and
``/var/log``, a scratch cgroup). Spec-level cases run ``hook precreate`` in a private ``/run``
first and hand runc only the decided config (no hook in it), as the runtime wrapper does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.live.isolation import listing, run_isolated
from tests.live.livekit import Bundle, parse_probe, run_container
from tests.live.test_blast_radius import fake_host_dev, host_dev_bundle
from tests.live.test_hook_scenarios import slice_pod

V1V2 = pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
PRIVATE_RUN = 'mount -t tmpfs -o mode=0755 tmpfs /run && mkdir /run/oci-device-hook && exec "$@"'


def precreate(host: dict[str, Path], config: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    """``hook precreate`` on ``config`` in a private /run; returns the completed process."""
    args = [sys.executable, "-I", "-m", "hook", "precreate", "--driver-root", str(host["root"])]
    args += ["--config", str(host["settings"]), "--cdi-spec-dir", str(host["no_cdi"])]
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE_RUN, "sh", *args]
    return subprocess.run(
        cmd, input=json.dumps(config).encode(), capture_output=True, timeout=60, env=env
    )


def decided(b: Bundle, host: dict[str, Path], env: dict[str, str] | None = None) -> Bundle:
    """The bundle with its config replaced by what ``hook precreate`` decided (and no hook left)."""
    b.config["hooks"] = {}
    res = precreate(host, b.config, env)
    assert res.returncode == 0, res.stderr
    b.config = json.loads(res.stdout)
    return b.write()


# --- item 2: -1 is a wildcard ---------------------------------------------------------------------


@V1V2
def test_a_minus_one_wildcard_is_never_handed_back_to_runc(
    bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    """The slice pod with moby's ``c -1:-1 rwm`` (its spelling of ``c *:* rwm``): the decided
    allow-list used to carry it on, and runc opened card 0 of a config the log called narrowed."""
    b = slice_pod(bundle_dir, host, ["/dev/nvidia1", "/dev/nvidia0", "/tmp/n0"])
    b.config["linux"]["resources"]["devices"].append(
        {"allow": True, "type": "c", "major": -1, "minor": -1, "access": "rwm"}
    )
    b = decided(b, host)
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
    rules = b.config["linux"]["resources"]["devices"]
    assert all((r.get("major") or 0) >= 0 and (r.get("minor") or 0) >= 0 for r in rules), rules


# --- item 4: //dev is the host's /dev -------------------------------------------------------------


@V1V2
def test_a_double_slash_host_dev_bind_is_known_from_the_config(
    tmp_path: Path, bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    """``//<driver-root>/dev`` bound at ``//dev``: the decision drops every node change there
    (before, only the adapter's ``st_dev`` check stopped it), the cgroup still narrows."""
    dev = host["root"] / "dev"
    b = host_dev_bundle(bundle_dir, host, Path("/" + str(dev)))
    for m in b.config["mounts"]:
        if m["destination"] == "/dev":
            m["source"], m["destination"] = "/" + str(dev), "//dev"
    b.write()
    before, after = tmp_path / "before", tmp_path / "after"
    setup = fake_host_dev(host, tmp_path)
    res = run_isolated(b, setup=[*setup, listing(dev, before)], after=[listing(dev, after)], cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert after.read_text() == before.read_text()
    seen = parse_probe(res.stdout)
    assert (seen["/dev/nvidia1"], seen["/dev/nvidia0"], seen["/tmp/n0"]) == ("ENXIO", "EPERM", "EPERM")
    record = json.loads(host["log"].read_text().splitlines()[-1])
    assert record["verdict"] == "apply" and record["nodes"]["remove"] == [], record
    assert any("is the host's /dev" in w and "cgroup-only" in w for w in record["warnings"])
