"""``ids.resolve_one`` looks IDs up in an index of the inventory; it must name exactly the devices,
in exactly the order, that a pass over the inventory's lists names (the scans kept here as the
oracle), on inventories with repeated indexes, UUIDs, buses and (gi, ci) under several parents."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hook.core.errors import InputError
from hook.sources.nvidia.ids import normalize_bus_id, parse_mig_index, parse_old_mig, resolve_one
from hook.sources.nvidia.model import Gpu, Inventory, MigDevice

UUIDS = ("GPU-aa", "GPU-bb", "gpu-AA")  # the third is the first, case aside
MIG_UUIDS = ("MIG-cc", "MIG-dd", None)
BUSES = ("0000:2a:00.0", "0000:3b:00.0")


def scan(inv: Inventory, token: str) -> tuple[Gpu | MigDevice, ...] | str:
    """The devices ``token`` names, by passes over every device (or the refusal's text)."""
    low = token.strip().lower()
    if low == "all":
        return (*inv.gpus, *inv.migs)
    if low.isdecimal():
        return tuple(g for g in inv.gpus if g.index == int(low))
    if (parsed := parse_mig_index(low)) is not None:
        found = tuple(m for m in inv.migs if (m.parent_index, m.index) == parsed)
        if any(m.uuid is None for m in found):
            return "refused"
        if found:
            return found
    if low.startswith("gpu-"):
        return tuple(g for g in inv.gpus if g.uuid.lower() == low)
    if old := parse_old_mig(low):
        parents = {g.minor for g in inv.gpus if g.uuid.lower() == old[0]}
        return tuple(m for m in inv.migs if m.parent_minor in parents and (m.gi, m.ci) == old[1:])
    if low.startswith("mig-"):
        return tuple(m for m in inv.migs if m.uuid is not None and m.uuid.lower() == low)
    try:
        bus = normalize_bus_id(low)
    except ValueError:
        return ()
    return tuple(g for g in inv.gpus if g.pci_bus_id == bus)


small = st.integers(0, 2)
gpu_st = st.builds(
    Gpu, index=small, minor=small, uuid=st.sampled_from(UUIDS), pci_bus_id=st.sampled_from(BUSES)
)
mig_st = st.builds(
    MigDevice,
    uuid=st.sampled_from(MIG_UUIDS),
    parent_minor=small,
    parent_index=small,
    gi=small,
    ci=small,
    index=small,
)
token_st = st.one_of(
    st.sampled_from(
        ["all", "0", "1", "2", " 1 ", "0:1", "1:0", "2:2", "3b:00.0", "00000000:2A:00.0", "nothing"]
    ),
    st.sampled_from([*UUIDS, "GPU-zz", "MIG-CC", "mig-dd", "MIG-zz"]),
    st.builds(lambda u, gi, ci: f"MIG-{u}/{gi}/{ci}", st.sampled_from(UUIDS), small, small),
)


@settings(max_examples=500, deadline=None)
@example(  # one UUID on two parents (case aside), the later parent's instance listed first
    gpus=[
        Gpu(index=0, minor=0, uuid="GPU-aa", pci_bus_id=BUSES[0]),
        Gpu(index=1, minor=2, uuid="gpu-AA", pci_bus_id=BUSES[1]),
    ],
    migs=[
        MigDevice(uuid="MIG-cc", parent_minor=2, parent_index=1, gi=1, ci=0),
        MigDevice(uuid="MIG-dd", parent_minor=0, parent_index=0, gi=1, ci=0),
    ],
    tokens=["MIG-GPU-aa/1/0"],
)
@given(
    gpus=st.lists(gpu_st, max_size=5),
    migs=st.lists(mig_st, max_size=6),
    tokens=st.lists(token_st, max_size=6),
)
def test_indexed_lookup_names_what_the_scan_names(
    gpus: list[Gpu], migs: list[MigDevice], tokens: list[str]
) -> None:
    inv = Inventory(driver_version="1", gpus=tuple(gpus), migs=tuple(migs))
    for token in tokens:
        try:
            got: tuple[Gpu | MigDevice, ...] | str = resolve_one(inv, token)
        except InputError:
            got = "refused"
        assert got == scan(inv, token), token
