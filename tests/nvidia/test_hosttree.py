"""The test-support host tree itself (tests/hosttree.py): real nodes and the documented facts."""

from __future__ import annotations

import os
import stat

import pytest

from hook.sources.nvidia import inventory
from hook.sources.nvidia.hostcheck import verify_host_node


@pytest.mark.parametrize("topology", ["8x-mig", "8x-shuffled"])
def test_real_nodes_match_the_inventory(real_host, topology: str) -> None:
    root, spec = real_host(topology)
    inv = inventory.load(root, None, None, need_migs=False)
    assert (inv.majors.nvidia, inv.majors.uvm, inv.majors.caps) == (
        spec.nvidia_major,
        spec.uvm_major,
        spec.caps_major,
    )
    assert [(g.index, g.minor, g.uuid) for g in inv.gpus] == [(g.index, g.minor, g.uuid) for g in spec.gpus]
    for gpu in inv.gpus:
        verify_host_node(root / f"dev/nvidia{gpu.minor}", inv.majors.nvidia, gpu.minor)
    verify_host_node(root / "dev/nvidiactl", spec.nvidia_major, 255)
    verify_host_node(root / "dev/nvidia-uvm-tools", spec.uvm_major, 1)
    for cap in (*inv.caps.gi.values(), *inv.caps.ci.values(), inv.caps.config, inv.caps.monitor):
        st = verify_host_node(root / f"dev/nvidia-caps/nvidia-cap{cap.minor}", spec.caps_major, cap.minor)
        assert stat.S_IMODE(st.st_mode) == cap.mode
    assert inv.gpus[1].uuid.startswith("GPU-a158631e") and len(spec.migs) == 2


def test_plain_file_mode(tmp_path) -> None:
    from tests.hosttree import make_host_tree

    make_host_tree(tmp_path, "1x", mknod=False)
    st = os.lstat(tmp_path / "dev/nvidia0")
    assert stat.S_ISREG(st.st_mode)
    assert sorted(p.name for p in (tmp_path / "dev/nvidia-caps").iterdir()) == ["nvidia-cap1", "nvidia-cap2"]
