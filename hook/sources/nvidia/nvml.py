"""NVML, asked only when /proc and the cache cannot answer (MIG UUIDs, hidden GPU UUIDs).

Rule: ``pynvml`` is imported lazily inside ``query`` (or passed in as ``nvml_module``), NVML is
always shut down again, and every NVML failure becomes one ``InputError`` a person can act on.
A MIG device NVML refuses to describe ("Insufficient Permissions") is reported, not guessed.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from types import ModuleType

from hook.core.errors import InputError
from hook.core.record import record
from hook.sources.nvidia.ids import normalize_bus_id
from hook.sources.nvidia.model import Gpu, MigDevice

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any, Final

__all__ = ["NVML_SOURCE", "NvmlResult", "query"]

NVML_SOURCE: Final = "NVML"
_MIG_PROFILE_RE: Final = re.compile(r"\bMIG\s+(\S+)\s*$")
_NVML_ERROR_NAMES: Final = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found; is the NVIDIA driver installed?",
    "NVML_ERROR_NO_PERMISSION": "Insufficient Permissions (run as root, or grant access to the device nodes)",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "NVML and the kernel driver versions differ; reload the driver",
}


@record
class NvmlResult:
    driver_version: str
    gpus: tuple[Gpu, ...]
    migs: tuple[MigDevice, ...]
    warnings: tuple[str, ...] = ()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _explain(nv: Any, exc: BaseException, what: str) -> InputError:
    """One readable ``InputError`` for an NVML failure while doing ``what``."""
    value = getattr(exc, "value", None)
    for name, text in _NVML_ERROR_NAMES.items():
        if value is not None and value == getattr(nv, name, object()):
            return InputError(NVML_SOURCE, what, text)
    return InputError(NVML_SOURCE, what, f"NVML error: {exc}")


def _is(nv: Any, exc: BaseException, name: str) -> bool:
    return getattr(exc, "value", None) == getattr(nv, name, object())


def _import(nvml_module: ModuleType | Any | None) -> Any:
    if nvml_module is not None:
        return nvml_module
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise InputError(
            NVML_SOURCE,
            "pynvml",
            "the nvidia-ml-py package is not installed; install it or pass --inventory FILE",
        ) from None


def _gpu(nv: Any, index: int) -> tuple[Gpu, Any]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    mig_enabled = False
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
        mig_enabled = current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
    except nv.NVMLError as exc:
        if not _is(nv, exc, "NVML_ERROR_NOT_SUPPORTED"):
            raise
    gpu = Gpu(
        index=index,
        minor=int(nv.nvmlDeviceGetMinorNumber(handle)),
        uuid=_text(nv.nvmlDeviceGetUUID(handle)),
        pci_bus_id=normalize_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId)),
        name=_text(nv.nvmlDeviceGetName(handle)),
        mig_enabled=mig_enabled,
    )
    return gpu, handle


def _profile(nv: Any, handle: Any) -> str:
    try:
        match = _MIG_PROFILE_RE.search(_text(nv.nvmlDeviceGetName(handle)))
    except nv.NVMLError:
        return ""
    return match[1] if match else ""


def _migs(nv: Any, gpu: Gpu, handle: Any) -> tuple[MigDevice, ...]:
    """The MIG devices of one MIG-enabled GPU; empty slots (NOT_FOUND) are skipped."""
    out: list[MigDevice] = []
    for slot in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nv.NVMLError as exc:
            if _is(nv, exc, "NVML_ERROR_NOT_FOUND") or _is(nv, exc, "NVML_ERROR_INVALID_ARGUMENT"):
                continue
            raise
        out.append(
            MigDevice(
                uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                parent_minor=gpu.minor,
                parent_index=gpu.index,
                gi=int(nv.nvmlDeviceGetGpuInstanceId(mig)),
                ci=int(nv.nvmlDeviceGetComputeInstanceId(mig)),
                profile=_profile(nv, mig),
                index=len(out),
            )
        )
    return tuple(out)


def _collect(nv: Any, need_migs: bool) -> NvmlResult:
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        pairs = [_gpu(nv, i) for i in range(int(nv.nvmlDeviceGetCount()))]
    except nv.NVMLError as exc:
        raise _explain(nv, exc, "GPUs") from exc
    migs: list[MigDevice] = []
    warnings: list[str] = []
    for gpu, handle in pairs:
        if not (need_migs and gpu.mig_enabled):
            continue
        try:
            migs.extend(_migs(nv, gpu, handle))
        except nv.NVMLError as exc:
            warnings.append(f"{_explain(nv, exc, f'MIG devices of GPU {gpu.index} ({gpu.uuid})')}")
    return NvmlResult(
        driver_version=driver, gpus=tuple(g for g, _ in pairs), migs=tuple(migs), warnings=tuple(warnings)
    )


def query(nvml_module: ModuleType | Any | None = None, *, need_migs: bool = True) -> NvmlResult:
    """Ask NVML for the driver version, every GPU and (if ``need_migs``) every MIG device.

    Raises ``InputError`` (file ``NVML``) when the library is missing, refuses, or fails; a
    failure on one GPU's MIG devices is a warning in the result instead.
    """
    nv = _import(nvml_module)
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise _explain(nv, exc, "nvmlInit") from exc
    try:
        return _collect(nv, need_migs)
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
