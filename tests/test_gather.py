"""hook.routes.gather: the shell that reads what a decision needs, and only that."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from hook.core.settings import Settings
from hook.routes.gather import Options, load_inputs, scan_accelerators, state_from_bundle

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "examples" / "node" / "inventory.json"


def bundle(tmp: Path, env: list[str]) -> Path:
    b = tmp / "bundle"
    b.mkdir()
    (b / "config.json").write_text(json.dumps({"process": {"env": env}, "root": {"path": "rootfs"}}))
    return b


def test_a_broken_spec_is_skipped_and_reported(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "broken.json").write_text(
        '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [], "x": 1}'
    )
    opts = Options(spec_dirs=(cdi,), inventory_file=INVENTORY, use_cache=False, settings=Settings())
    inputs = load_inputs(state_from_bundle(bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])), opts)
    assert [w for w in inputs.warnings if w.startswith("CDI spec skipped:")] == [
        f"CDI spec skipped: {cdi}/broken.json: x: unknown field 'x'",
        f"CDI spec skipped: {cdi}/broken.json: devices: a spec needs at least one device",
    ]
    assert {g.node.path for gs in inputs.grants.values() for g in gs} >= {
        "/dev/nvidia0"
    }  # inventory answered


def test_spec_less_node_never_imports_the_cdi_engine(tmp_path: Path) -> None:
    empty = tmp_path / "cdi"
    empty.mkdir()
    b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"])
    code = (
        "import sys; from pathlib import Path; from hook.core.settings import Settings; "
        "from hook.routes.gather import Options, load_inputs, state_from_bundle; "
        f"o = Options(spec_dirs=(Path({str(empty)!r}),), inventory_file=Path({str(INVENTORY)!r}), "
        "use_cache=False, settings=Settings()); "
        f"load_inputs(state_from_bundle(Path({str(b)!r})), o); "
        "print(sorted(m for m in sys.modules if m.startswith(('hook.sources.cdi', 'yaml', 'pynvml'))))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_scan_finds_accelerator_char_nodes_only(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    (dev / "nvidia-caps").mkdir()
    for rel, major, minor in [
        ("nvidia3", 195, 3),
        ("nvidiactl", 195, 255),
        ("dri/renderD128", 226, 128),
        ("nvidia-caps/nvidia-cap2", 237, 2),
        ("null", 1, 3),
    ]:
        os.mknod(dev / rel, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    (dev / "nvidia9").write_text("a plain file is no device")
    (dev / "nvidia8").symlink_to("nvidia3")
    found = scan_accelerators(tmp_path, Settings().accelerator_nodes)
    assert [(n.path, n.major, n.minor) for n in found] == [
        ("/dev/nvidia3", 195, 3),
        ("/dev/dri/renderD128", 226, 128),
        ("/dev/nvidia-caps/nvidia-cap2", 237, 2),
    ]
