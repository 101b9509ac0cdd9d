"""Start reuses create's decision only for the very same config (issue 34 item 8): the config NRI's
container makes with the bounding set read from the started process, under the same settings, no
more than ``REUSE_SECONDS`` after create. Anything else is decided again, as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hook.core.record import replace
from hook.routes.nri import messages as m
from hook.routes.nri import verdicts as v
from hook.routes.nri.plugin import MAX_DECIDED, Plugin
from hook.routes.nri.spec import SYS_ADMIN, oci_config
from hook.routes.options import Options
from hook.sources.settingsfile import load_settings
from tests import nrifake as f
from tests.bundles import CONTAINER, POD_UID, checkpoint, checkpoint_entry, settings_file
from tests.hosttree import make_host_tree


@pytest.fixture
def config(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    make_host_tree(root, "8x-mig", mknod=False)
    ck = tmp_path / "kubelet_internal_checkpoint"
    ck.write_bytes(checkpoint([checkpoint_entry("nvidia.com/gpu", ["1"])]))
    return settings_file(tmp_path, driver_root=str(root), kubelet_checkpoint=str(ck))


def _privileged(cid: str = "c" * 64, env: tuple[str, ...] = (), namespace: str = "ml") -> bytes:
    devices = [f.device(f"/dev/nvidia{i}", "c", 195, i) for i in range(8)]
    pod = f.pod(uid=POD_UID, name="trainer", namespace=namespace)
    return f.event(pod, f.container(cid, name=CONTAINER, rules=[f.rule(True)], devices=devices, env=env))


def _created(config: Path) -> tuple[m.Event, v.Answer]:
    ev = m.event(m.CREATE_CONTAINER, _privileged())
    a = v.on_create(ev.pod, ev.container, v.Ctx(options=Options(settings_file=config)))
    assert a.code == 0 and a.decided is not None and a.decided.plan.remove  # the over-grant, decided
    return ev, a


def test_the_same_config_under_the_same_settings_reuses_creates_decision(config: Path) -> None:
    ev, a = _created(config)
    assert a.decided is not None
    settings = load_settings(config)
    doc = oci_config(ev.pod, ev.container, frozenset({SYS_ADMIN}), settings.cdi_annotation_prefixes[0])
    assert v._reusable(a.decided, doc, settings)
    assert "stage" not in a.decided.report and "duration_ms" not in a.decided.report  # create's own


def test_another_bounding_another_container_other_settings_or_an_old_decision_decide_again(
    config: Path,
) -> None:
    ev, a = _created(config)
    decided = a.decided
    assert decided is not None
    settings = load_settings(config)
    prefix = settings.cdi_annotation_prefixes[0]
    same = oci_config(ev.pod, ev.container, frozenset({SYS_ADMIN}), prefix)
    without = oci_config(ev.pod, ev.container, frozenset(), prefix)  # the process lacks CAP_SYS_ADMIN
    assert not v._reusable(decided, without, settings)
    other = m.event(m.START_CONTAINER, _privileged(env=("NVIDIA_VISIBLE_DEVICES=all",)))
    assert not v._reusable(
        decided, oci_config(other.pod, other.container, frozenset({SYS_ADMIN}), prefix), settings
    )
    changed: dict[str, Any] = json.loads(config.read_text())
    config.write_text(json.dumps({**changed, "cap_access": "rw"}) + "\n")
    assert not v._reusable(decided, same, load_settings(config))
    assert not v._reusable(replace(decided, at=decided.at - v.REUSE_SECONDS - 0.01), same, settings)


def test_a_decision_waits_for_its_own_start_only_and_memory_stays_bounded(config: Path) -> None:
    plugin = Plugin(v.Ctx(options=Options(settings_file=config)), lambda _a: None, lambda _s: None)
    for i in range(MAX_DECIDED + 10):
        assert plugin.call("CreateContainer", _privileged(f"{i:064x}"))[0] == 0
    assert len(plugin._decided) == MAX_DECIDED and f"{0:064x}" not in plugin._decided
    # the same id created again and refused: the earlier create's decision is not kept for it
    mgmt = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all")
    refused = _privileged(f"{MAX_DECIDED + 9:064x}", env=mgmt, namespace="gpu-operator")
    Path(config).write_text(json.dumps({**json.loads(config.read_text()), "mig_management": "never"}) + "\n")
    assert plugin.call("CreateContainer", refused)[0] == v.PERMISSION_DENIED
    assert f"{MAX_DECIDED + 9:064x}" not in plugin._decided
    plugin.call("StopContainer", _privileged(f"{MAX_DECIDED + 8:064x}"))
    assert len(plugin._decided) == MAX_DECIDED - 2
