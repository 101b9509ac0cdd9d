"""The test-support host tree itself (tests/hosttree.py): real nodes and the documented facts."""

from __future__ import annotations

import os
import stat

from hook.nvidia import inventory
from hook.nvidia.hostcheck import verify_host_node


def test_real_nodes_match_the_inventory(real_host) -> None:
    root, spec = real_host("8x-mig")
    inv = inventory.load(root, None, None, need_migs=False)
    for gpu in inv.gpus:
        verify_host_node(root / f"dev/nvidia{gpu.minor}", inv.majors.nvidia, gpu.minor)
    verify_host_node(root / "dev/nvidiactl", 195, 255)
    verify_host_node(root / "dev/nvidia-uvm-tools", 511, 1)
    for cap in (*inv.caps.gi.values(), *inv.caps.ci.values(), inv.caps.config, inv.caps.monitor):
        st = verify_host_node(root / f"dev/nvidia-caps/nvidia-cap{cap.minor}", 237, cap.minor)
        assert stat.S_IMODE(st.st_mode) == cap.mode
    assert inv.gpus[1].uuid.startswith("GPU-a158631e") and len(spec.migs) == 2


def test_plain_file_mode(tmp_path) -> None:
    from tests.hosttree import make_host_tree

    make_host_tree(tmp_path, "1x", mknod=False)
    st = os.lstat(tmp_path / "dev/nvidia0")
    assert stat.S_ISREG(st.st_mode)
    assert sorted(p.name for p in (tmp_path / "dev/nvidia-caps").iterdir()) == ["nvidia-cap1", "nvidia-cap2"]
