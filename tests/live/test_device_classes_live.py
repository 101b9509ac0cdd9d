"""Every NVIDIA device class narrowed, under runc: a privileged slice pod on an HGX board.

The node is ``8x-hgx`` (tests/hosttree.py): DRM nodes tied to their GPU's PCI address in sysfs,
the BMC's card0, IMEX channels, NVSwitches, NVLink, the fabric-mgmt cap. Inside the container
each probe both ``mknod``s the node's numbers (the cgroup's ``m``) and opens the node runc made
(or one planted in the rootfs before start, so the open shows the cgroup alone): EPERM = denied,
ENXIO = allowed (a fake node with no driver behind it), ENOENT = removed.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.hosttree import DRM_MAJOR, NVLINK_MAJOR, NVSWITCH_MAJOR, drm_card, drm_render, make_host_tree
from tests.live.livekit import Bundle, build_bundle, char_device, hook, parse_probe, run_container

SLICE_INDEX = 1
CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_MKNOD", "CAP_SETGID", "CAP_SETUID", "CAP_KILL"]


def _node(tmp_path: Path, topology: str) -> dict[str, Path]:
    """A driver root of ``topology`` (fake nodes), no CDI specs, settings with a log and cache here."""
    root = tmp_path / "driver-root"
    make_host_tree(root, topology, mknod=True)
    empty = tmp_path / "no-cdi"
    empty.mkdir()
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"log_file: {tmp_path}/hook.log\ncache_dir: {tmp_path}/cache\n")
    return {"root": root, "no_cdi": empty, "settings": settings}


@pytest.fixture
def board(tmp_path: Path) -> dict[str, Path]:
    return _node(tmp_path, "8x-hgx")


def _slice_pod(bundle_dir: Path, node: dict[str, Path], script: list[str], uuid: str, *env: str) -> Bundle:
    """A privileged pod (every host node, allow-all, SYS_ADMIN) given one card by a corroborated
    env, with the real hook at prestart."""
    args = [sys.executable, "-I", "-m", "hook", "prestart", "--driver-root", str(node["root"])]
    args += ["--config", str(node["settings"]), "--cdi-spec-dir", str(node["no_cdi"])]
    b = build_bundle(
        bundle_dir,
        script,
        hooks={"prestart": [hook(sys.executable, args)]},
        devices=_host_nodes(node["root"]),
        cgroup_devices=[{"allow": True, "access": "rwm"}],
        env=["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={uuid}", "CUDA_DEVICE_MEMORY_LIMIT_0=40g", *env],
    )
    caps = [*CAPS, "CAP_SYS_ADMIN"]
    b.config["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    return b.write()


def _host_nodes(root: Path) -> list[dict[str, object]]:
    """Every char node of the board's /dev: what an engine puts in a privileged config."""
    out = []
    for dirpath, _dirs, files in os.walk(root / "dev"):
        for name in sorted(files):
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISCHR(st.st_mode):
                path = "/" + os.path.relpath(os.path.join(dirpath, name), root)
                out.append(char_device(path, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


def _script(opens: list[str], mknods: dict[str, tuple[int, int]]) -> list[str]:
    """Open each path; mknod each name's numbers under /tmp inside the container, then open it."""
    lines = [f'out=$(cat {p} 2>&1 </dev/null | head -c 200); echo "PROBE {p} ${{out:-OK}}"' for p in opens]
    for name, (major, minor) in mknods.items():
        node = f"/tmp/mk-{name}"
        lines.append(f'out=$(mknod {node} c {major} {minor} 2>&1); echo "MKNOD {node} ${{out:-OK}}"')
        lines.append(f'out=$(cat {node} 2>&1 </dev/null | head -c 200); echo "PROBE {node} ${{out:-OK}}"')
    return ["/bin/sh", "-c", "; ".join(lines)]


def _mknod_results(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("MKNOD "):
            _, path, rest = line.split(" ", 2)
            out[path] = "OK" if rest == "OK" else ("EPERM" if "not permitted" in rest else rest)
    return out


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_hgx_slice_pod_keeps_its_drm_nodes_and_loses_fabric_imex_and_other_drm(
    bundle_dir: Path, board: dict[str, Path], cgroup2: bool
) -> None:
    from tests.hosttree import TOPOLOGIES

    spec = TOPOLOGIES["8x-hgx"]
    mine, other = spec.gpus[SLICE_INDEX], spec.gpus[0]
    own_card, own_render = f"/dev/dri/card{drm_card(mine)}", f"/dev/dri/renderD{drm_render(mine)}"
    other_card = f"/dev/dri/card{drm_card(other)}"
    assert spec.imex_major is not None
    opens = [
        f"/dev/nvidia{mine.minor}", own_card, own_render, "/dev/nvidiactl", "/dev/dri/card0",
        other_card, "/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch0", "/dev/nvidia-nvlink",
        "/dev/nvidia-caps-imex-channels/channel0", "/dev/nvidia-caps/nvidia-cap0",
    ]  # fmt: skip
    mknods = {
        "own-card": (DRM_MAJOR, drm_card(mine)),
        "other-card": (DRM_MAJOR, drm_card(other)),
        "other-render": (DRM_MAJOR, drm_render(other)),
        "nvswitchctl": (NVSWITCH_MAJOR, 255),
        "nvlink": (NVLINK_MAJOR, 0),
        "imex0": (spec.imex_major, 0),
    }
    b = _slice_pod(bundle_dir, board, _script(opens, mknods), mine.uuid)
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert {p: seen[p] for p in opens} == {
        f"/dev/nvidia{mine.minor}": "ENXIO",  # its card...
        own_card: "ENXIO",  # ...and that card's DRM nodes (EGL, Vulkan)
        own_render: "ENXIO",
        "/dev/nvidiactl": "ENXIO",
        "/dev/dri/card0": "ENXIO",  # the BMC's: another vendor's, privileged semantics
        other_card: "ENOENT",  # another GPU's DRM node: removed...
        "/dev/nvidia-nvswitchctl": "ENOENT",  # NVSwitch, NVLink, IMEX, fabric-mgmt: removed
        "/dev/nvidia-nvswitch0": "ENOENT",
        "/dev/nvidia-nvlink": "ENOENT",
        "/dev/nvidia-caps-imex-channels/channel0": "ENOENT",
        "/dev/nvidia-caps/nvidia-cap0": "ENOENT",
    }
    made = _mknod_results(res.stdout)
    assert made == {  # ...and denied: mknod of the same numbers inside the container fails
        "/tmp/mk-own-card": "OK",
        "/tmp/mk-other-card": "EPERM",
        "/tmp/mk-other-render": "EPERM",
        "/tmp/mk-nvswitchctl": "EPERM",
        "/tmp/mk-nvlink": "EPERM",
        "/tmp/mk-imex0": "EPERM",
    }, res.stdout
    assert seen["/tmp/mk-own-card"] == "ENXIO"


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_a_planted_fabric_or_foreign_drm_node_opens_only_where_the_cgroup_allows(
    bundle_dir: Path, board: dict[str, Path], cgroup2: bool
) -> None:
    """Nodes made in the rootfs before start (no mknod needed): open shows the cgroup's verdict alone."""
    from tests.hosttree import TOPOLOGIES

    spec = TOPOLOGIES["8x-hgx"]
    mine, other = spec.gpus[SLICE_INDEX], spec.gpus[0]
    planted = {
        "/tmp/p-own-render": (DRM_MAJOR, drm_render(mine)),
        "/tmp/p-other-render": (DRM_MAJOR, drm_render(other)),
        "/tmp/p-nvswitch1": (NVSWITCH_MAJOR, 1),
        "/tmp/p-nvlink": (NVLINK_MAJOR, 0),
    }
    b = _slice_pod(bundle_dir, board, _script(list(planted), {}), mine.uuid)
    for path, (major, minor) in planted.items():
        os.mknod(b.rootfs / path.lstrip("/"), 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {
        "/tmp/p-own-render": "ENXIO",
        "/tmp/p-other-render": "EPERM",
        "/tmp/p-nvswitch1": "EPERM",
        "/tmp/p-nvlink": "EPERM",
    }


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_a_management_pod_keeps_the_fabric_nodes(
    bundle_dir: Path, board: dict[str, Path], cgroup2: bool
) -> None:
    """Granted the MIG config cap (SYS_ADMIN, the default mig_management), the same pod keeps the
    NVSwitch, NVLink and fabric-mgmt nodes by policy; other GPUs' DRM nodes still go."""
    from tests.hosttree import TOPOLOGIES

    spec = TOPOLOGIES["8x-hgx"]
    mine, other = spec.gpus[SLICE_INDEX], spec.gpus[0]
    opens = [
        "/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch3", "/dev/nvidia-nvlink",
        "/dev/nvidia-caps/nvidia-cap0", "/dev/nvidia-caps/nvidia-cap1", f"/dev/dri/card{drm_card(other)}",
    ]  # fmt: skip
    script = _script(opens, {"other-card": (DRM_MAJOR, drm_card(other))})
    b = _slice_pod(bundle_dir, board, script, mine.uuid, "NVIDIA_MIG_CONFIG_DEVICES=all")
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert {p: seen[p] for p in opens} == {
        "/dev/nvidia-nvswitchctl": "ENXIO",
        "/dev/nvidia-nvswitch3": "ENXIO",
        "/dev/nvidia-nvlink": "ENXIO",
        "/dev/nvidia-caps/nvidia-cap0": "ENXIO",
        "/dev/nvidia-caps/nvidia-cap1": "ENXIO",  # the config cap it asked for
        f"/dev/dri/card{drm_card(other)}": "ENOENT",
    }
    assert _mknod_results(res.stdout) == {"/tmp/mk-other-card": "EPERM"}


# --- issue 36 item 5: no whole major stays open for a class the container was not given ----------------


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_a_narrowed_privileged_container_cannot_make_a_node_of_a_class_it_was_not_given(
    bundle_dir: Path, tmp_path: Path, cgroup2: bool
) -> None:
    """The ``8x`` node's /proc/devices names drm, nvidia-caps-imex-channels and nvidia-nvlink, and
    its /dev has no node of them (nor of GPU 5, which the driver lists): a narrowed privileged
    slice pod used to keep ``c 226:*``, ``c 234:*``, ``c 236:*`` and ``c 195:5`` through its
    allow-all, and with CAP_MKNOD made such a node and opened it (ENXIO: allowed). Now each is
    EPERM; its own card and the control node still open."""
    from tests.hosttree import CAPS_MAJOR, IMEX_MAJOR, NVIDIA_MAJOR, TOPOLOGIES, UVM_MAJOR

    mine = TOPOLOGIES["8x"].gpus[SLICE_INDEX]
    node = _node(tmp_path, "8x")
    (node["root"] / "dev/nvidia5").unlink()  # nvidia-modprobe has not made it yet: the driver lists it
    mknods = {
        "gpu5": (NVIDIA_MAJOR, 5),  # another GPU, no node on the host
        "drm-card1": (DRM_MAJOR, 1),  # DRM: no node on the host, no GPU of this pod's
        "drm-render128": (DRM_MAJOR, 128),
        "imex5": (IMEX_MAJOR, 5),  # an IMEX channel it did not ask for
        "nvlink": (NVLINK_MAJOR, 0),
        "cap-77": (CAPS_MAJOR, 77),  # a MIG cap no node names: it holds no MIG instance
        "own-gpu": (NVIDIA_MAJOR, mine.minor),
        "ctl": (NVIDIA_MAJOR, 255),
        "uvm": (UVM_MAJOR, 0),
    }
    b = _slice_pod(bundle_dir, node, _script([], mknods), mine.uuid)
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    made = {f"/tmp/mk-{n}" for n in mknods}
    denied = {f"/tmp/mk-{n}" for n in ("gpu5", "drm-card1", "drm-render128", "imex5", "nvlink", "cap-77")}
    assert {p: _mknod_results(res.stdout)[p] for p in denied} == dict.fromkeys(denied, "EPERM"), res.stdout
    # mknod refused: nothing to open (a node made anyway would be EPERM too: the rule is rwm)
    assert {seen[p] for p in denied} <= {"ENOENT", "EPERM"}, seen
    assert {seen[p] for p in made - denied} == {"ENXIO"}, seen  # its card, nvidiactl, nvidia-uvm: opened


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_a_pod_given_an_imex_channel_cannot_make_another(
    bundle_dir: Path, tmp_path: Path, cgroup2: bool
) -> None:
    """The same slice pod given IMEX channel 0 keeps the channel major (its own channel), so the
    major cannot be denied whole: it used to keep every other channel through its allow-all, and
    mknod-ed channel 5 (no node on the host; the driver has channels 0..ImexChannelCount-1) and
    opened it (ENXIO: allowed). Every other channel the driver has is now denied (EPERM): 2,047
    rules, one write each on v1 and two range blocks in the v2 program."""
    from tests.hosttree import IMEX_MAJOR, TOPOLOGIES

    mine = TOPOLOGIES["8x"].gpus[SLICE_INDEX]
    node = _node(tmp_path, "8x")
    (node["root"] / "proc/driver/nvidia/params").write_text("ImexChannelCount: 2048\n")
    mknods = {"imex0": (IMEX_MAJOR, 0), "imex5": (IMEX_MAJOR, 5), "imex2047": (IMEX_MAJOR, 2047)}
    script = _script(["/dev/nvidia-caps-imex-channels/channel0"], mknods)
    b = _slice_pod(bundle_dir, node, script, mine.uuid, "NVIDIA_IMEX_CHANNELS=0")
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    made = _mknod_results(res.stdout)
    assert {p: made[p] for p in ("/tmp/mk-imex5", "/tmp/mk-imex2047")} == dict.fromkeys(
        ("/tmp/mk-imex5", "/tmp/mk-imex2047"), "EPERM"
    ), res.stdout
    assert {seen["/tmp/mk-imex5"], seen["/tmp/mk-imex2047"]} <= {"ENOENT", "EPERM"}, seen
    # its own channel: the node the hook made, and the same numbers made again, both open
    assert made["/tmp/mk-imex0"] == "OK", res.stdout
    assert (seen["/dev/nvidia-caps-imex-channels/channel0"], seen["/tmp/mk-imex0"]) == ("ENXIO", "ENXIO"), (
        seen
    )
