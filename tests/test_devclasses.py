"""NVIDIA device classes: majors by name from /proc/devices, nodes classified, what narrowing keeps."""

from __future__ import annotations

from typing import Any

from hook.core.devclasses import ClassKind, HostClasses, class_majors, keeps, whole_gpus
from hook.core.plan import Node

# A 570-series HGX node as the driver registers it (open-gpu-kernel-modules names; dynamic majors).
PROC_DEVICES = """Character devices:
  1 mem
 10 misc
195 nvidia
195 nvidia-modeset
195 nvidiactl
226 drm
234 nvidia-caps-imex-channels
236 nvidia-nvlink
237 nvidia-caps
238 nvidia-nvswitch
511 nvidia-uvm

Block devices:
  8 sd
236 nvidia-nvlink
"""

MAJORS = {
    "nvidia": 195,
    "nvidia-caps-imex-channels": 234,
    "nvidia-nvlink": 236,
    "nvidia-caps": 237,
    "nvidia-nvswitch": 238,
    "nvidia-uvm": 511,
}
CLASSES = HostClasses(
    majors=MAJORS, drm={("c", 226, 1): 0, ("c", 226, 128): 0, ("c", 226, 2): 1}, fabric=frozenset({0})
)


def test_majors_come_from_the_names_the_driver_registers() -> None:
    assert class_majors(PROC_DEVICES) == {**MAJORS, "drm": 226}


def test_drivers_before_550_name_195_nvidia_frontend() -> None:
    assert class_majors("Character devices:\n195 nvidia-frontend\n510 nvidia-uvm\n") == {
        "nvidia": 195,
        "nvidia-uvm": 510,
    }


def test_a_block_major_or_an_odd_line_is_no_class() -> None:
    text = "Block devices:\n195 nvidia\nCharacter devices:\nx nvidia-uvm\n 12 nvidia-uvm-extra\n"
    assert class_majors(text) == {}


def test_every_node_of_the_driver_has_its_class() -> None:
    c = CLASSES.classify
    assert c(("c", 195, 3)) == (ClassKind.GPU, 3)
    assert c(("c", 195, 255)) == (ClassKind.CTL, None)
    assert c(("c", 195, 254)) == (ClassKind.MODESET, None)
    assert c(("c", 511, 1)) == (ClassKind.UVM, None)
    assert c(("c", 237, 12)) == (ClassKind.CAP, None)
    assert c(("c", 237, 0)) == (ClassKind.FABRIC, None)
    assert c(("c", 234, 7)) == (ClassKind.IMEX, None)
    assert c(("c", 236, 0)) == (ClassKind.NVLINK, None)
    assert c(("c", 238, 255)) == (ClassKind.NVSWITCH, None)
    assert c(("c", 226, 128)) == (ClassKind.DRM, 0)


def test_other_vendors_and_host_devices_have_no_class() -> None:
    assert CLASSES.classify(("c", 226, 0)) is None  # a DRM node sysfs puts on no NVIDIA GPU
    assert CLASSES.classify(("c", 10, 229)) is None  # /dev/fuse
    assert CLASSES.classify(("b", 195, 0)) is None
    assert HostClasses().classify(("c", 195, 0)) is None  # no driver: no class


def test_a_gpu_reached_through_a_mig_instance_is_not_whole() -> None:
    whole_gpu = [("c", 195, 1)]
    mig = [("c", 195, 0), ("c", 237, 12), ("c", 237, 13)]
    assert whole_gpus(CLASSES, [whole_gpu, mig]) == {1}
    assert whole_gpus(CLASSES, [[("c", 195, 255), ("c", 511, 0)]]) == set()


def test_what_a_narrowed_container_keeps_beyond_its_grants() -> None:
    whole = {0}
    kept = {kind for kind in ClassKind for gpu in (0, 5, None) if keeps((kind, gpu), whole, management=False)}
    assert kept == {ClassKind.CTL, ClassKind.MODESET, ClassKind.UVM, ClassKind.DRM}
    assert not keeps((ClassKind.DRM, 5), whole, management=False)  # another GPU's DRM node
    mgmt = {kind for kind in ClassKind if keeps((kind, None), (), management=True)}
    assert mgmt == {
        ClassKind.CTL,
        ClassKind.MODESET,
        ClassKind.UVM,
        ClassKind.NVLINK,
        ClassKind.NVSWITCH,
        ClassKind.FABRIC,
    }


def test_a_drm_node_sysfs_ties_to_no_other_vendor_is_nvidias_gpu_unknown() -> None:
    """Where the hook cannot tell whose a DRM node is, it is narrowed as an unknown GPU's."""
    classes = HostClasses(
        majors=MAJORS, drm={("c", 226, 1): 0}, drm_major=226, foreign=frozenset({("c", 226, 0)})
    )
    assert classes.classify(("c", 226, 1)) == (ClassKind.DRM, 0)
    assert classes.classify(("c", 226, 0)) is None  # the BMC's, by its PCI vendor id
    assert classes.classify(("c", 226, 9)) == (ClassKind.DRM, None)
    assert not keeps((ClassKind.DRM, None), {0, 1, 2}, management=True)


def test_driver_nodes_are_made_once_per_distinct_set_and_anew_for_any_change() -> None:
    """A resident decider reads the classes anew per container: the same set gives the very same
    nodes (none made again); a MIG capability, a GPU, a DRM node or a major that changed gives the
    nodes of the new set (issue 34 item 8; seen failing with the kept set dropped, and with the key
    missing each field)."""
    base: dict[str, Any] = {
        "majors": {"nvidia": 195, "nvidia-caps": 237},
        "drm": {("c", 226, 0): 0},
        "gpu_minors": frozenset({0, 1}),
        "cap_minors": frozenset({1, 2, 12}),
    }
    first = HostClasses(**base).driver_nodes()
    assert HostClasses(**base).driver_nodes() is first
    changes: list[dict[str, Any]] = [
        {"cap_minors": frozenset({1, 2, 13})},
        {"gpu_minors": frozenset({0, 2})},
        {"drm": {("c", 226, 128): 0}},
        {"majors": {"nvidia": 195, "nvidia-caps": 238}},
        {"majors": {"nvidia": 196, "nvidia-caps": 237}},
    ]
    for change in changes:
        assert HostClasses(**base).driver_nodes() == first  # the base set kept, then one change
        classes = HostClasses(**{**base, **change})
        made = classes.driver_nodes()
        assert made != first, change
        assert {(n.path, n.major, n.minor) for n in made} == {
            (n.path, n.major, n.minor) for n in _driver_nodes_made(classes)
        }, change


def _driver_nodes_made(classes: HostClasses) -> tuple[Node, ...]:
    from hook.core import devclasses

    devclasses._driver_nodes.clear()
    return classes.driver_nodes()
