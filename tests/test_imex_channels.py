"""Issue 36 item 5, the IMEX channel major: a pod given some channels keeps no other.

A narrowed privileged pod given IMEX channel 0 keeps the ``nvidia-caps-imex-channels`` major (its
own channel), so that major cannot be denied whole; it used to keep every other channel minor
through its allow-all, and with CAP_MKNOD it could make ``c 234:5`` (no host node: the driver
has channels up to ``NVreg_ImexChannelCount`` whether or not ``/dev`` has their nodes) and open
it. Every channel minor below the driver's count that the pod was not given is now denied
exactly; the count is what ``/proc/driver/nvidia/params`` says (``ImexChannelCount: N``), or,
where it does not say, the driver's documented default, 2048, with a warning. Expectations come
from the tree's spec (tests/hosttree.py) and the driver's numbers, never from the decision.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hook.core.rules import DeviceType, Verdicts
from tests.bundles import ALLOW_ALL, PRIVATE_RUN, _hook_exe, alloc_resp, checkpoint, settings_file
from tests.hosttree import IMEX_MAJOR, TOPOLOGIES, make_host_tree
from tests.k8s_shapes import GPUS, control_devs, gpu_dev, write_cdi
from tests.test_k8s import gpu_entry, pod_config, run
from tests.test_whole_majors import _rule, opens

SPEC = TOPOLOGIES["4x-k8s"]
UUID2 = GPUS[2].uuid
DEFAULT_COUNT = 2048  # nv-reg.h: NVreg_ImexChannelCount's default


def _node(base: Path, params: str | None) -> dict[str, Path]:
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    if params is not None:
        (base / "root/proc/driver/nvidia/params").write_text(params)
    return {"root": base / "root", "cdi": write_cdi(base / "cdi")}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 4x-k8s node, whose driver says it has 8 IMEX channels (no channel node in /dev)."""
    return _node(tmp_path_factory.mktemp("imex8"), "ResmanDebugLevel: 4294967295\nImexChannelCount: 8\n")


@pytest.fixture(scope="module")
def unsaid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same node whose driver params file does not exist (the count is not known)."""
    return _node(tmp_path_factory.mktemp("imex-unsaid"), None)


def imex_pod(channels: str = "0") -> dict[str, Any]:
    """A privileged pod the kubelet allocated GPU 2 and IMEX ``channels``, every GPU in linux.devices."""
    cfg = pod_config(rules=ALLOW_ALL, devices=[*(gpu_dev(i) for i in GPUS), *control_devs()])
    cfg["process"]["env"] += [f"NVIDIA_VISIBLE_DEVICES={UUID2}", f"NVIDIA_IMEX_CHANNELS={channels}"]
    return cfg


def allocation(channels: str = "0") -> bytes:
    envs = {"NVIDIA_VISIBLE_DEVICES": UUID2, "NVIDIA_IMEX_CHANNELS": channels}
    return checkpoint([gpu_entry(alloc_resp(envs=envs))])


def test_a_pod_given_channel_0_keeps_no_other_channel_the_driver_has(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = imex_pod()
    rep = run(tmp_path, node, cfg, capsys, ckpt=allocation())
    assert rep["verdict"] == "apply", rep["reason"]
    assert opens(cfg, rep, IMEX_MAJOR, 0), rep["cgroup"]  # its own channel
    assert [m for m in range(1, 8) if opens(cfg, rep, IMEX_MAJOR, m)] == [], rep["cgroup"]
    assert opens(cfg, rep, SPEC.nvidia_major, GPUS[2].minor)
    assert not any("ImexChannelCount" in w for w in rep["warnings"]), rep["warnings"]
    # keeps: channel 0, and the major's minors from the count on, which the rules still open
    # (no channel is behind them: the driver registers exactly its count of minors)
    imex = [(e["minor"], e["path"]) for e in rep["keeps"] if e["major"] == IMEX_MAJOR]
    assert imex == [(0, "/dev/nvidia-caps-imex-channels/channel0"), (None, "*")], rep["keeps"]
    assert not opens(cfg, rep, IMEX_MAJOR, 7) and opens(cfg, rep, IMEX_MAJOR, 8)


def test_several_channels_keep_each_of_them_and_no_other(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = imex_pod("1,4")
    rep = run(tmp_path, node, cfg, capsys, ckpt=allocation("1,4"))
    assert [m for m in range(8) if opens(cfg, rep, IMEX_MAJOR, m)] == [1, 4], rep["cgroup"]


def test_where_the_driver_does_not_say_its_count_the_default_is_denied_and_a_warning_says_so(
    tmp_path: Path, unsaid: dict[str, Path], capsys: Any
) -> None:
    cfg = imex_pod()
    rep = run(tmp_path, unsaid, cfg, capsys, ckpt=allocation())
    assert rep["verdict"] == "apply", rep["reason"]
    assert opens(cfg, rep, IMEX_MAJOR, 0)
    rules = Verdicts([_rule(r) for r in [*cfg["linux"]["resources"]["devices"], *rep["cgroup"]]])
    still = [m for m in range(1, DEFAULT_COUNT) if rules.access(DeviceType.CHAR, IMEX_MAJOR, m) & 6]
    assert still == [], still[:8]
    assert rules.access(DeviceType.CHAR, IMEX_MAJOR, 0) == 7
    assert any("ImexChannelCount" in w and "2048" in w for w in rep["warnings"]), rep["warnings"]


def test_a_pod_given_no_channel_still_loses_the_whole_major(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """Nothing changes for a pod given no channel: ``c 234:*`` denied, no per-channel rule."""
    from tests.test_whole_majors import allocation as gpu_only
    from tests.test_whole_majors import privileged_pod

    rep = run(tmp_path, node, privileged_pod(), capsys, ckpt=gpu_only())
    imex = [r for r in rep["cgroup"] if r["major"] == IMEX_MAJOR]
    assert imex == [{"allow": False, "type": "c", "major": IMEX_MAJOR, "minor": None, "access": "rwm"}]


def test_spec_level_hands_the_runtime_only_the_channel_given(tmp_path: Path, node: dict[str, Path]) -> None:
    """``hook precreate``'s allow-list already opens no other channel (no gap there): confirmed."""
    ck = tmp_path / "ck"
    ck.write_bytes(allocation())
    args = ["precreate", "--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"])]
    args += ["--config", str(settings_file(tmp_path, kubelet_checkpoint=str(ck)))]
    res = subprocess.run(
        [*PRIVATE_RUN, *_hook_exe(), *args],
        input=json.dumps(imex_pod()).encode(),
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    rules = [_rule(r) for r in json.loads(res.stdout)["linux"]["resources"]["devices"]]
    verdicts = Verdicts(rules)
    probes = (*range(DEFAULT_COUNT + 1), (1 << 20) - 1)
    opened = [m for m in probes if verdicts.access(DeviceType.CHAR, IMEX_MAJOR, m) & 6]
    assert opened == [0]
