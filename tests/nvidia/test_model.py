"""hook.sources.nvidia.model: the inventory's values are frozen and looked up by minor, not by index."""

from __future__ import annotations

import pytest

from hook.sources.nvidia.model import CapNode, CapTable, Gpu, Inventory


def test_cap_table_maps_are_frozen_sorted_copies() -> None:
    gi = {(1, 2): CapNode(minor=21), (0, 1): CapNode(minor=12)}
    ci = {(0, 1, 0): CapNode(minor=13)}
    table = CapTable(gi=gi, ci=ci)
    gi[(3, 1)] = CapNode(minor=30)
    assert list(table.gi) == [(0, 1), (1, 2)]
    with pytest.raises(TypeError):
        table.gi[(4, 1)] = CapNode(minor=40)  # type: ignore[index]
    with pytest.raises(TypeError):
        table.ci[(4, 1, 0)] = CapNode(minor=41)  # type: ignore[index]


def test_gpu_by_minor_is_by_minor_not_by_index() -> None:
    gpus = (
        Gpu(index=0, minor=3, uuid="GPU-a", pci_bus_id="0000:18:00.0"),
        Gpu(index=1, minor=0, uuid="GPU-b", pci_bus_id="0000:3b:00.0"),
    )
    inv = Inventory(driver_version="550.54.15", gpus=gpus)
    assert inv.gpu_by_minor(0) == gpus[1]
    assert inv.gpu_by_minor(3) == gpus[0]
    assert inv.gpu_by_minor(1) is None
