"""#11 item 7: a node without the NVIDIA driver (a CPU node with the package installed).

``NVIDIA_VISIBLE_DEVICES=none``/``void`` need no driver; an env request nothing backs starts
with no GPU and a warning; only a request a plugin allocation or a CDI annotation made, and
that cannot be met, fails. Never "libnvidia-ml.so.1 not found". The driver root has a /proc
with no ``driver/nvidia`` (and NVML, if asked, would fail: it is never asked).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bundles import config, simulate, write_bundle


@pytest.fixture
def cpu_node(tmp_path: Path) -> list[str]:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "devices").write_text("Character devices:\n  1 mem\n")
    (tmp_path / "no-cdi").mkdir()
    (tmp_path / "settings.yaml").write_text("# defaults\n")
    return [
        "--driver-root",
        str(root),
        "--cdi-spec-dir",
        str(tmp_path / "no-cdi"),
        "--config",
        str(tmp_path / "settings.yaml"),
    ]


STARTS = {
    "none": config(["NVIDIA_VISIBLE_DEVICES=none"]),
    "void": config(["NVIDIA_VISIBLE_DEVICES=void"]),
    "all-unbacked": config(["NVIDIA_VISIBLE_DEVICES=all"]),
    "index-unbacked": config(["NVIDIA_VISIBLE_DEVICES=0,1"]),
    "all-privileged-unbacked": config(["NVIDIA_VISIBLE_DEVICES=all"], privileged=True),
    "mig-monitor": config(["NVIDIA_MIG_MONITOR_DEVICES=all"], privileged=True),
    "none-corroborated": config(["NVIDIA_VISIBLE_DEVICES=none", "CUDA_DEVICE_MEMORY_LIMIT_0=1g"]),
}


@pytest.mark.parametrize("name", list(STARTS))
def test_unbacked_requests_start_without_a_gpu(
    tmp_path: Path, cpu_node: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = write_bundle(tmp_path / "b", STARTS[name])
    rc, report, err = simulate(bundle, *cpu_node, capsys=capsys)
    assert rc == 0, err
    assert report["verdict"] == "none" and report["cgroup"] == [] and report["nodes"]["create"] == []
    assert "libnvidia-ml" not in err + str(report)
    if name not in ("void", "mig-monitor"):  # MIG management without a GPU is ignored anyway
        assert any("no NVIDIA driver on this node" in w for w in report["warnings"])
    if name not in ("void", "mig-monitor", "all-privileged-unbacked"):  # the last: privileged, left alone
        # issue 22, item 5: the reason says what happened, not "already has exactly what it asked for"
        assert report["reason"].startswith("no NVIDIA driver on this node: the container starts without"), (
            report["reason"]
        )
        assert "env:NVIDIA_VISIBLE_DEVICES=" in report["reason"]


FAILS = {
    "plugin-env": config(["NVIDIA_VISIBLE_DEVICES=GPU-1", "CUDA_DEVICE_MEMORY_LIMIT_0=1g"], privileged=True),
    # outside Kubernetes: in a pod, an annotation the kubelet did not write is no request (issue 28)
    "cdi-annotation": config([], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
    "volume-mount": config(
        [],
        mounts=[
            {
                "destination": "/var/run/nvidia-container-devices/0",
                "source": "/dev/null",
                "type": "bind",
                "options": ["bind"],
            }
        ],
    ),
}


@pytest.mark.parametrize("name", list(FAILS))
def test_backed_requests_that_cannot_be_met_fail_in_one_line(
    tmp_path: Path, cpu_node: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = write_bundle(tmp_path / "b", FAILS[name])
    rc, _, err = simulate(bundle, *cpu_node, capsys=capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "libnvidia-ml" not in err
