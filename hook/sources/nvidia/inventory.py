"""The host's NVIDIA inventory: one ``load`` that asks the cheapest source able to answer.

Rule: ``--inventory FILE`` wins; then the cache, valid only for the same boot id, driver
version, GPU set and MIG instances, each instance by its incarnation (the identity, ctime
included, of its GI and CI capability files: an instance destroyed and made again with the same
GI/CI ids is a new one, with a new UUID); then /proc. NVML is asked only when /proc cannot list the
GPUs (or their UUIDs), or when MIG devices exist whose UUIDs are needed. Majors and capability
nodes always come from /proc of this boot, never from the cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from hook.core.errors import InputError
from hook.core.record import record, replace
from hook.sources import cachefile
from hook.sources.nvidia import procfs
from hook.sources.nvidia.model import CapNode, CapTable, Gpu, Inventory, Majors, MigDevice
from hook.sources.nvidia.snapshot import SNAPSHOT_VERSION, inventory_from_json, inventory_to_json

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any, Final

    from hook.sources.nvidia import nvml
    from hook.sources.nvidia.migminors import MigMinors

__all__ = [
    "CACHE_NAME",
    "DEFAULT_CACHE_DIR",
    "CapNode",
    "CapTable",
    "Gpu",
    "Inventory",
    "Majors",
    "MigDevice",
    "cache_key",
    "dumps",
    "load",
    "read_cache",
    "read_snapshot",
    "write_cache",
]

DEFAULT_CACHE_DIR: Final = Path("/run/oci-device-hook")
CACHE_NAME: Final = "inventory.json"
CACHE_FORMAT: Final = 2  # 2: MIG instances keyed by incarnation
MAX_CACHE_BYTES: Final = 16 << 20


@record
class _Proc:
    """Everything read from /proc for one load."""

    majors: Majors
    driver_version: str | None
    infos: tuple[procfs.GpuInfo, ...] | None
    caps: CapTable
    boot_id: str | None
    warnings: tuple[str, ...]
    driver_root: str = ""


def dumps(inv: Inventory) -> str:
    return json.dumps(inventory_to_json(inv), sort_keys=True, indent=2) + "\n"


def read_snapshot(path: Path) -> Inventory:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), "", f"cannot read inventory: {exc.strerror or exc}") from None
    return replace(inventory_from_json(data, str(path)), source="file")


MINORS_CACHE_NAME: Final = "mig-minors.json"
_MINORS_CACHE_VERSION: Final = 1


def _minors_key(driver_root: Path, boot_id: str | None, version_text: str | None) -> list[object] | None:
    """What the mig-minors table depends on: the driver build (its whole version text) in this boot.

    The driver prints the same fixed table for every load of one build; a new build changes the
    version text, a reboot the boot id. ``None`` (no caching) when either is unknown.
    """
    if not boot_id or not version_text:
        return None
    return [_MINORS_CACHE_VERSION, str(driver_root), boot_id, version_text]


def _cached_minors(cache_dir: Path, key: list[object]) -> MigMinors | None:
    """The cached table for ``key``, or None on a miss or anything malformed (then /proc is read)."""
    from hook.sources.nvidia.migminors import MigMinors

    data = cachefile.read(str(cache_dir), MINORS_CACHE_NAME, MAX_CACHE_BYTES)
    if data is None:
        return None
    try:
        doc = json.loads(data)
        ok = cachefile.current(doc, "mig-minors", _MINORS_CACHE_VERSION)
        by_name = doc["by_name"] if ok and doc["key"] == key else None
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(by_name, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in by_name.items()
    ):
        return None
    return MigMinors(by_name=by_name)


def _mig_minors(
    driver_root: Path, cache_dir: Path | None, key: list[object] | None
) -> tuple[MigMinors | None, str]:
    """mig-minors from the cache when its key matches, else parsed from /proc (and cached if clean).

    The decider keeps the table under the same key (``hook.sources.warm``): one driver build in one boot.
    """
    if key is not None:
        from hook.sources import warm

        slot = ("mig-minors", str(driver_root), str(cache_dir))
        return warm.remembered(slot, json.dumps(key), lambda: _minors_now(driver_root, cache_dir, key))
    return _minors_now(driver_root, cache_dir, key)


def _minors_now(
    driver_root: Path, cache_dir: Path | None, key: list[object] | None
) -> tuple[MigMinors | None, str]:
    if cache_dir is not None and key is not None:
        cached = _cached_minors(cache_dir, key)
        if cached is not None:
            return cached, ""
    minors = procfs.read_mig_minors(driver_root)
    note = ""
    if cache_dir is not None and key is not None and minors is not None and not minors.warnings:
        record = {**cachefile.stamp("mig-minors", _MINORS_CACHE_VERSION), "key": key}
        payload = json.dumps({**record, "by_name": dict(minors.by_name)}).encode()
        note = _write_atomic(cache_dir, MINORS_CACHE_NAME, payload) or ""
    return minors, note


def _read_proc(driver_root: Path, cache_dir: Path | None = None) -> _Proc:
    boot_id = procfs.read_boot_id(driver_root)
    version_text = procfs.read_text(driver_root, procfs.VERSION_PATH, required=False)
    driver_version = (
        None
        if version_text is None
        else procfs.parse_driver_version(version_text, str(driver_root / procfs.VERSION_PATH))
    )
    minors, note = _mig_minors(driver_root, cache_dir, _minors_key(driver_root, boot_id, version_text))
    caps, warnings = procfs.read_cap_table(driver_root, minors)
    return _Proc(
        majors=procfs.read_majors(driver_root),
        driver_version=driver_version,
        infos=procfs.read_gpu_infos(driver_root),
        caps=caps,
        boot_id=boot_id,
        warnings=warnings + ((note,) if note else ()),
        driver_root=str(driver_root),
    )


def cache_key(proc: _Proc) -> dict[str, Any] | None:
    """What must not change for a cached inventory to stay true; ``None``: do not cache."""
    if proc.boot_id is None or proc.driver_version is None or proc.infos is None:
        return None
    migs = incarnations(proc.driver_root, proc.caps.instances())
    if migs is None:
        return None
    return {
        "version": SNAPSHOT_VERSION,
        "boot_id": proc.boot_id,
        "driver_version": proc.driver_version,
        "gpus": sorted(info.pci_bus_id for info in proc.infos),
        "mig_instances": migs,
    }


def incarnations(driver_root: str, instances: Iterable[tuple[int, int, int]]) -> list[list[int]] | None:
    """Each MIG instance with the identity of its GI and CI capability files: ``[gpu minor, gi, ci,
    then (dev, inode, size, mtime_ns, ctime_ns) of each]``. The driver makes those files when it
    makes the instance, so ids that come back after a destroy come with new identities (ctime
    moves even where an inode number is reused). ``None`` (do not cache) when one cannot be stat'ed."""
    from hook.sources.nvidia.migminors import proc_cap_path

    out: list[list[int]] = []
    for minor, gi, ci in instances:
        row = [minor, gi, ci]
        for name in (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"):
            try:
                st = os.stat(os.path.join(driver_root, proc_cap_path(name)))
            except (OSError, ValueError):
                return None
            row += [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        out.append(row)
    return out


def read_cache(cache_dir: Path, key: dict[str, Any]) -> tuple[Inventory | None, str | None]:
    """The cached inventory if its key matches; anything odd (see ``hook.sources.cachefile``) is a miss.

    A record of another format or hook version is a silent miss (it is rewritten); one of this
    version that does not parse is a miss plus a warning.
    """
    path = cache_dir / CACHE_NAME
    data = cachefile.read(str(cache_dir), CACHE_NAME, MAX_CACHE_BYTES)
    if data is None:
        return None, None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        return None, f"{path}: ignored unreadable cache: {exc}"
    if not cachefile.current(doc, "inventory", CACHE_FORMAT) or doc.get("key") != key:
        return None, None
    try:
        return inventory_from_json(doc.get("inventory"), str(path)), None
    except (InputError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return None, f"ignored corrupt cache: {exc}"


def write_cache(cache_dir: Path, key: dict[str, Any], inv: Inventory) -> str | None:
    """Write through ``hook.sources.cachefile`` (0700 dir, O_EXCL temp file, rename); a failure is a
    warning."""
    record = {**cachefile.stamp("inventory", CACHE_FORMAT), "key": key, "inventory": inventory_to_json(inv)}
    return _write_atomic(cache_dir, CACHE_NAME, json.dumps(record, sort_keys=True).encode())


def _write_atomic(cache_dir: Path, name: str, payload: bytes) -> str | None:
    return cachefile.write(str(cache_dir), name, payload)


def _proc_migs(
    caps: CapTable, gpus: tuple[Gpu, ...], skip: set[tuple[int, int, int]]
) -> tuple[MigDevice, ...]:
    """MIG devices known only from capability nodes (no UUID), numbered per parent by (gi, ci)."""
    out: list[MigDevice] = []
    taken: dict[int, int] = {}
    for key in skip:
        taken[key[0]] = taken.get(key[0], 0) + 1
    by_gpu: dict[int, list[tuple[int, int, int]]] = {}
    for key in caps.instances():  # once, grouped by parent: linear in GPUs + instances
        if key not in skip:
            by_gpu.setdefault(key[0], []).append(key)
    for gpu in gpus:
        first = taken.get(gpu.minor, 0)
        for n, (minor, gi, ci) in enumerate(sorted(by_gpu.get(gpu.minor, ()))):
            out.append(
                MigDevice(
                    uuid=None, parent_minor=minor, parent_index=gpu.index, gi=gi, ci=ci, index=first + n
                )
            )
    return tuple(out)


def _from_proc(proc: _Proc) -> Inventory | None:
    """The inventory /proc alone gives, or ``None`` if it cannot list every GPU with its UUID."""
    if proc.infos is None or proc.driver_version is None or any(i.uuid is None for i in proc.infos):
        return None
    mig_minors = {key[0] for key in proc.caps.gi}
    gpus = tuple(
        Gpu(
            index=n,
            minor=i.minor,
            uuid=i.uuid or "",
            pci_bus_id=i.pci_bus_id,
            name=i.model,
            mig_enabled=i.minor in mig_minors,
        )
        for n, i in enumerate(proc.infos)
    )
    return Inventory(
        driver_version=proc.driver_version,
        majors=proc.majors,
        gpus=gpus,
        migs=_proc_migs(proc.caps, gpus, set()),
        caps=proc.caps,
        source="proc",
        warnings=proc.warnings,
    )


def _with_nvml(proc: _Proc, result: nvml.NvmlResult) -> Inventory:
    """NVML's GPUs and MIG devices; instances /proc shows but NVML did not describe keep no UUID."""
    described = {(m.parent_minor, m.gi, m.ci) for m in result.migs}
    extra = _proc_migs(proc.caps, result.gpus, described)
    return Inventory(
        driver_version=proc.driver_version or result.driver_version,
        majors=proc.majors,
        gpus=result.gpus,
        migs=result.migs + extra,
        caps=proc.caps,
        source="proc+nvml",
        warnings=proc.warnings + result.warnings,
    )


def load(
    driver_root: Path,
    inventory_file: Path | None,
    cache_dir: Path | None,
    need_migs: bool,
    *,
    nvml_module: ModuleType | Any | None = None,
    fresh: bool = False,
) -> Inventory:
    """The host inventory: file > cache > /proc > NVML (see the module rule). ``fresh``: never from
    the cache (a MIG UUID the cached inventory does not know is looked for again once, this way,
    before it is refused), which it then rewrites."""
    from hook.sources import warm

    if inventory_file is not None:  # the decider keeps it while the file keeps its identity
        path = inventory_file
        return warm.remembered(("inventory", str(path)), warm.identity(path), lambda: read_snapshot(path))
    if fresh or nvml_module is not None or not warm.enabled():
        return _load(driver_root, cache_dir, need_migs, nvml_module, fresh)
    # a resident process keeps the whole load while everything it reads keeps its identity
    # (hook.sources.nvidia.procid); what NVML said is not a file's, so it is never kept
    from hook.sources.nvidia.procid import fingerprint

    boot_id = procfs.read_boot_id(driver_root)
    version = procfs.read_text(driver_root, procfs.VERSION_PATH, required=False)
    minors_key = _minors_key(driver_root, boot_id, version)
    if minors_key is None:  # no boot id or driver version: nothing to key mig-minors by, none kept
        return _load(driver_root, cache_dir, need_migs, None, False)
    minors = _mig_minors(driver_root, cache_dir, minors_key)[0]
    cache_file = None if cache_dir is None else os.path.join(cache_dir, CACHE_NAME)
    seen = fingerprint(str(driver_root), cache_file, None if minors is None else minors.by_name)
    return warm.remembered(
        ("inventory-load", str(driver_root), str(cache_dir), need_migs),
        seen,
        lambda: _load(driver_root, cache_dir, need_migs, None, False),
        keep=lambda inv: inv.source != "proc+nvml",
    )


def _load(
    driver_root: Path, cache_dir: Path | None, need_migs: bool, nvml_module: ModuleType | Any | None,
    fresh: bool,
) -> Inventory:  # fmt: skip
    from hook.sources import warm

    proc = _read_proc(driver_root, cache_dir)
    key = cache_key(proc) if cache_dir is not None else None
    notes: tuple[str, ...] = ()
    if cache_dir is not None and key is not None and not fresh:
        where = cache_dir
        seen = (json.dumps(key, sort_keys=True), warm.identity(where / CACHE_NAME))
        cached, note = warm.remembered(("inventory-cache", str(where)), seen, lambda: read_cache(where, key))
        if cached is not None:
            return replace(cached, majors=proc.majors, caps=proc.caps, source="cache", warnings=proc.warnings)
        notes = (note,) if note else ()
    from_proc = _from_proc(proc)
    if from_proc is not None and not (need_migs and any(m.uuid is None for m in from_proc.migs)):
        return replace(from_proc, warnings=from_proc.warnings + notes)
    try:
        from hook.sources.nvidia import nvml  # only when /proc and the cache cannot answer

        result = nvml.query(nvml_module, need_migs=need_migs)
    except InputError as exc:
        if from_proc is None:
            exc.add_note(f"/proc under {driver_root} could not list the GPUs either")
            raise
        why = f"{exc}; MIG device UUIDs are unknown, only /proc capabilities were used"
        return replace(from_proc, warnings=from_proc.warnings + notes + (why,))
    inv = _with_nvml(proc, result)
    if cache_dir is not None and key is not None and not result.warnings:
        note = write_cache(cache_dir, key, inv)
        notes += (note,) if note else ()
    return replace(inv, warnings=inv.warnings + notes)
