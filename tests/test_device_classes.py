"""Every NVIDIA device class narrowed, on an HGX board (``8x-hgx``): a narrowed container keeps
its GPU's DRM nodes and the control nodes, loses every other GPU's DRM nodes, the IMEX channels it
did not ask for and the NVSwitch/NVLink/fabric nodes (a management pod keeps those), and another
vendor's nodes and host devices keep what privileged mode gives them unless the kubelet's word
bounds every vendor. Expectations come from the tree's spec, never from the decision.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import (
    ALL_CAPS,
    POD_ANNOTATIONS,
    PRIVATE_RUN,
    _hook_exe,
    alloc_resp,
    checkpoint,
    checkpoint_entry,
    config,
    denied_among,
    deny_keys,
    settings_file,
    simulate,
    write_bundle,
)
from tests.hosttree import (
    BMC_BUS,
    DRM_MAJOR,
    FABRIC_MGMT_MINOR,
    IMEX_CHANNELS,
    NVLINK_MAJOR,
    NVSWITCH_MAJOR,
    NVSWITCHES,
    HostSpec,
    drm_card,
    drm_render,
    make_host_tree,
)

Key = tuple[str, int, int]
HAMI = "CUDA_DEVICE_MEMORY_LIMIT_0=40g"  # a plugin-only sibling: corroborates the env outside Kubernetes


class Board:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "driver-root"
        self.spec: HostSpec = make_host_tree(self.root, "8x-hgx", mknod=True)
        self.no_cdi = base / "no-cdi"
        self.no_cdi.mkdir()

    def gpu(self, index: int) -> Key:
        return ("c", self.spec.nvidia_major, self.spec.gpus[index].minor)

    def drm(self, index: int) -> set[Key]:
        g = self.spec.gpus[index]
        return {("c", DRM_MAJOR, drm_card(g)), ("c", DRM_MAJOR, drm_render(g))}

    def imex(self, channel: int) -> Key:
        assert self.spec.imex_major is not None
        return ("c", self.spec.imex_major, channel)

    @property
    def fabric(self) -> set[Key]:
        """NVSwitches, their control node, NVLink and the fabric-mgmt cap."""
        out = {("c", NVSWITCH_MAJOR, n) for n in range(NVSWITCHES)} | {("c", NVSWITCH_MAJOR, 255)}
        return out | {("c", NVLINK_MAJOR, 0), ("c", self.spec.caps_major, FABRIC_MGMT_MINOR)}

    @property
    def bmc(self) -> Key:
        return ("c", DRM_MAJOR, 0)

    def host_devices(self) -> list[dict[str, object]]:
        """What a privileged container's linux.devices holds: every char node of the host's /dev,
        plus /dev/fuse (a host device of no GPU)."""
        out: list[dict[str, object]] = []
        for dirpath, _dirs, files in os.walk(self.root / "dev"):
            for name in sorted(files):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISCHR(st.st_mode):
                    path = "/" + os.path.relpath(os.path.join(dirpath, name), self.root)
                    out.append(_dev(path, os.major(st.st_rdev), os.minor(st.st_rdev)))
        return [*out, _dev("/dev/fuse", 10, 229)]

    def decide(
        self,
        tmp: Path,
        cfg: dict[str, Any],
        capsys: pytest.CaptureFixture[str],
        *,
        ckpt: bytes = b"",
        **kw: Any,
    ) -> dict[str, Any]:
        bundle = write_bundle(tmp / "bundle", cfg)
        (tmp / "ckpt").write_bytes(ckpt)
        settings = settings_file(tmp, kubelet_checkpoint=str(tmp / "ckpt"), **kw)
        args = [
            "--driver-root",
            str(self.root),
            "--cdi-spec-dir",
            str(self.no_cdi),
            "--config",
            str(settings),
        ]
        rc, rep, err = simulate(bundle, *args, capsys=capsys)
        assert isinstance(rep, dict) and rc == (3 if rep["verdict"] == "deny" else 0), err
        return rep


def _dev(path: str, major: int, minor: int) -> dict[str, object]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0}


def kept(rep: dict[str, Any]) -> set[Key]:
    """The nodes the report keeps (not the majors whose rules still open minors no node names)."""
    return {(n["type"], n["major"], n["minor"]) for n in rep["keeps"] if n["minor"] is not None}


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Board:
    return Board(tmp_path_factory.mktemp("hgx"))


def slice_pod(board: Board, index: int, *env: str) -> dict[str, Any]:
    """A privileged pod allocated one card by a corroborated env (no Kubernetes: the evidence
    speaks for NVIDIA's devices only)."""
    uuid = board.spec.gpus[index].uuid
    return config(
        [f"NVIDIA_VISIBLE_DEVICES={uuid}", HAMI, *env],
        privileged=True,
        caps=ALL_CAPS,
        devices=board.host_devices(),
    )


def test_a_narrowed_pod_keeps_its_gpus_drm_nodes_and_loses_every_other_class_node(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rep = board.decide(tmp_path, slice_pod(board, 1), capsys)
    assert rep["verdict"] == "apply", rep["reason"]
    others = {board.gpu(i) for i in range(8) if i != 1} | {
        k for i in range(8) if i != 1 for k in board.drm(i)
    }
    imex = {board.imex(c) for c in range(IMEX_CHANNELS)}
    own = board.drm(1) | {board.gpu(1)}
    control = {("c", board.spec.nvidia_major, 255), ("c", board.spec.uvm_major, 0)}
    denied = denied_among(rep, others | board.fabric | imex | own | control)
    assert others <= denied  # every other GPU, and its card/renderD
    assert board.fabric <= denied  # NVSwitch, nvswitchctl, NVLink, fabric-mgmt: not this pod's
    assert imex <= denied  # it asked for no channel
    assert not own & denied  # its own card and DRM nodes (EGL, Vulkan)
    assert not control & denied
    assert "/dev/nvidia-nvswitchctl" in rep["nodes"]["remove"] and "/dev/dri/card1" in rep["nodes"]["remove"]
    assert f"/dev/dri/card{drm_card(board.spec.gpus[1])}" not in rep["nodes"]["remove"]
    # the report says what it keeps: its card, its DRM nodes, the control nodes; nothing of a class beyond
    own = {board.gpu(1), *board.drm(1)}
    control = {("c", board.spec.nvidia_major, 255), ("c", board.spec.nvidia_major, 254)}
    control |= {("c", board.spec.uvm_major, 0), ("c", board.spec.uvm_major, 1)}
    assert kept(rep) == own | control | {board.bmc}
    # ...and the majors it keeps a node of stay open for minors no node names (issue 36 item 5)
    still = {n["major"] for n in rep["keeps"] if n["minor"] is None and n["major"] is not None}
    assert still == {board.spec.nvidia_major, DRM_MAJOR, board.spec.uvm_major}


def test_another_vendors_node_and_host_devices_keep_privileged_semantics(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The BMC's card0 (sysfs: an ASPEED device) and /dev/fuse: an NVIDIA env speaks for neither."""
    rep = board.decide(tmp_path, slice_pod(board, 1), capsys)
    assert board.bmc not in deny_keys(rep) and ("c", 10, 229) not in deny_keys(rep)
    assert "/dev/dri/card0" not in rep["nodes"]["remove"] and "/dev/fuse" not in rep["nodes"]["remove"]


def test_the_kubelets_allocation_bounds_every_vendor(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint lists every resource of the pod: another vendor's DRM node it does not list is
    an over-grant too; the allocated card keeps its DRM nodes."""
    uuid = board.spec.gpus[3].uuid
    ck = checkpoint(
        [checkpoint_entry("nvidia.com/gpu", [uuid], alloc_resp({"NVIDIA_VISIBLE_DEVICES": uuid}))]
    )
    cfg = config(privileged=True, caps=ALL_CAPS, devices=board.host_devices(), annotations=POD_ANNOTATIONS)
    rep = board.decide(tmp_path, cfg, capsys, ckpt=ck)
    assert rep["verdict"] == "apply", rep["reason"]
    assert denied_among(rep, {board.bmc, *board.fabric}) == {board.bmc, *board.fabric}
    assert not (board.drm(3) | {board.gpu(3)}) & deny_keys(rep)
    assert ("c", 10, 229) not in deny_keys(rep)  # a host device is no accelerator


def test_the_imex_channel_it_asked_for_is_kept_the_others_denied(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rep = board.decide(tmp_path, slice_pod(board, 2, "NVIDIA_IMEX_CHANNELS=1"), capsys)
    assert board.imex(1) not in deny_keys(rep) and board.imex(1) in kept(rep)
    assert {board.imex(c) for c in (0, 2, 3)} <= deny_keys(rep)


def test_a_management_pod_keeps_the_fabric_nodes(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Granted the MIG config cap by the mig_management policy, it keeps NVSwitch/NVLink/fabric too."""
    rep = board.decide(tmp_path, slice_pod(board, 1, "NVIDIA_MIG_CONFIG_DEVICES=all"), capsys)
    assert rep["verdict"] == "apply", rep["reason"]
    assert not board.fabric & deny_keys(rep)
    assert board.fabric <= kept(rep)


def test_a_management_pod_the_policy_refuses_gets_nothing(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rep = board.decide(
        tmp_path, slice_pod(board, 1, "NVIDIA_MIG_CONFIG_DEVICES=all"), capsys, mig_management="never"
    )
    assert rep["verdict"] == "deny" and rep["keeps"] == []


def test_a_mig_instance_gives_no_drm_node_of_its_parent(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 3g.40gb of card 0 keeps /dev/nvidia0 and its caps, not card 0's DRM nodes: those are the
    whole card's (NVIDIA gives MIG devices DRM nodes only for gfx profiles)."""
    mig = board.spec.migs[0]
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    caps = board.spec.caps_major
    nodes = [("/dev/nvidia0", board.gpu(0))]
    nodes += [(f"/dev/nvidia-caps/nvidia-cap{m}", ("c", caps, m)) for m in (12, 13)]
    device = {
        "name": mig.uuid,
        "containerEdits": {
            "deviceNodes": [{"path": p, "type": "c", "major": k[1], "minor": k[2]} for p, k in nodes]
        },
    }
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [device]}
    (cdi / "nvidia.json").write_text(json.dumps(spec))
    cfg = config(
        privileged=True,
        caps=ALL_CAPS,
        devices=board.host_devices(),
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": f"nvidia.com/gpu={mig.uuid}"},
    )
    bundle = write_bundle(tmp_path / "bundle", cfg)
    args = [
        "--driver-root",
        str(board.root),
        "--cdi-spec-dir",
        str(cdi),
        "--config",
        str(settings_file(tmp_path)),
    ]
    rc, rep, err = simulate(bundle, *args, capsys=capsys)
    assert rc == 0, err
    assert board.gpu(0) not in deny_keys(rep) and ("c", caps, 12) not in deny_keys(rep)
    assert board.drm(0) <= deny_keys(rep)


def test_without_sysfs_no_drm_node_is_anyones_so_all_are_narrowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where sysfs cannot tell whose a DRM node is, the hook narrows: the pod loses its own card's
    DRM nodes (as before this change) and the BMC's, never keeps another GPU's."""
    board = Board(tmp_path / "node")
    shutil.rmtree(board.root / "sys")
    rep = board.decide(tmp_path, slice_pod(board, 1), capsys)
    drm = board.drm(1) | board.drm(0) | {board.bmc}
    assert denied_among(rep, drm) == drm
    assert BMC_BUS  # the BMC's address is sysfs's word only


def test_the_text_report_lists_what_the_container_keeps(
    board: Board, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = write_bundle(tmp_path / "bundle", slice_pod(board, 1))
    args = ["--driver-root", str(board.root), "--cdi-spec-dir", str(board.no_cdi)]
    args += ["--config", str(settings_file(tmp_path))]
    rc, text, err = simulate(bundle, *args, capsys=capsys, fmt="text")
    assert rc == 0, err
    lines = text.splitlines()
    keeps = lines[lines.index("keeps:") + 1 :]
    card = drm_card(board.spec.gpus[1])
    assert f"  {'/dev/dri/card' + str(card):<44} {f'c {DRM_MAJOR}:{card}':<12} rwm" in keeps
    assert not any("nvswitch" in line or "nvlink" in line for line in keeps)


def test_spec_level_allow_list_holds_its_drm_nodes_and_no_fabric_major(board: Board, tmp_path: Path) -> None:
    """``hook precreate`` hands the runtime an allow-list: the pod's card and DRM nodes, the control
    nodes and the BMC's card0 are allowed; no NVSwitch, NVLink or IMEX minor, and no other GPU's."""
    (tmp_path / "no-cdi").mkdir()
    cfg = slice_pod(board, 1)
    args = ["precreate", "--driver-root", str(board.root), "--config", str(settings_file(tmp_path))]
    args += ["--cdi-spec-dir", str(tmp_path / "no-cdi")]
    res = subprocess.run(  # its fast-path record goes to a private /run
        [*PRIVATE_RUN, *_hook_exe(), *args], input=json.dumps(cfg).encode(), capture_output=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "type": "a", "major": None, "minor": None, "access": "rwm"}
    allowed = {(r["major"], r["minor"]) for r in rules[1:] if r["type"] == "c"}
    assert {(DRM_MAJOR, drm_card(board.spec.gpus[1])), (DRM_MAJOR, drm_render(board.spec.gpus[1]))} <= allowed
    assert (DRM_MAJOR, 0) in allowed and (board.spec.nvidia_major, 1) in allowed
    assert not {m for m, _ in allowed} & {NVSWITCH_MAJOR, NVLINK_MAJOR, board.spec.imex_major}
    assert not {(DRM_MAJOR, drm_card(g)) for g in board.spec.gpus if g.index != 1} & allowed
    paths = {d["path"] for d in out["linux"]["devices"]}
    assert "/dev/nvidia-nvswitchctl" not in paths and f"/dev/dri/card{drm_card(board.spec.gpus[1])}" in paths


def test_another_gpus_drm_node_the_host_has_not_made_is_denied_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sysfs ties card/renderD numbers to GPU 0 but udev never made the nodes: the pod keeps the
    drm major for its own card (and the BMC's), so GPU 0's numbers are denied exactly (issue 36
    item 5: a privileged container holding CAP_MKNOD could make them)."""
    board = Board(tmp_path / "node")
    for key in board.drm(0):
        name = f"card{key[2]}" if key[2] < 128 else f"renderD{key[2]}"
        (board.root / "dev/dri" / name).unlink()
    rep = board.decide(tmp_path, slice_pod(board, 1), capsys)
    assert rep["verdict"] == "apply", rep["reason"]
    assert denied_among(rep, board.drm(0)) == board.drm(0)
    assert not denied_among(rep, board.drm(1) | {board.bmc})
