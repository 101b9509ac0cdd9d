"""A fake ``pynvml`` for tests: the real API's names, error classes and codes, one host's GPUs.

Rule: behave like nvidia-ml-py where the hook depends on it (errors are ``NVMLError`` with
``.value``, ``NVMLError(code)`` builds the matching subclass, calls before ``nvmlInit`` raise
``Uninitialized``, empty MIG slots raise ``NotFound``) and count ``nvmlInit`` calls. A
``FakeNvml`` instance stands in for the module; ``activate`` makes this module delegate to one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from tests.hosttree import HostSpec

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    _by_value: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int | None = None) -> NVMLError:
        if cls is NVMLError and value in NVMLError._by_value:
            cls = NVMLError._by_value[value]
        obj = Exception.__new__(cls)
        obj.value = value if value is not None else getattr(cls, "_value", NVML_ERROR_UNKNOWN)
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"Unknown Error ({self.value})")


def _subclass(name: str, value: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {"_value": value})
    NVMLError._by_value[value] = cls
    return cls


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_LibRmVersionMismatch = _subclass(
    "NVMLError_LibRmVersionMismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH
)

_CONSTANTS = {k: v for k, v in dict(globals()).items() if k.startswith(("NVML_", "NVMLError"))}
MAX_MIG_DEVICES = 7


@dataclass(eq=False)
class FakeNvml:
    """One fake NVML library for ``spec``; ``fail_*`` hold an NVML error code to raise."""

    spec: HostSpec
    fail_init: int | None = None
    fail_mig: int | None = None
    bytes_strings: bool = False
    init_calls: int = 0
    shutdown_calls: int = 0
    _live: int = field(default=0, repr=False)

    def __getattr__(self, name: str) -> Any:
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        raise AttributeError(name)

    def _s(self, text: str) -> str | bytes:
        return text.encode() if self.bytes_strings else text

    def _check(self) -> None:
        if self._live <= 0:
            raise NVMLError_Uninitialized()

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.fail_init is not None:
            raise NVMLError(self.fail_init)
        self._live += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.shutdown_calls += 1
        self._live -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check()
        return self._s(self.spec.driver_version)

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.spec.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        self._check()
        if not 0 <= index < len(self.spec.gpus):
            raise NVMLError_InvalidArgument()
        return ("gpu", index)

    def _gpu(self, handle: tuple[Any, ...]) -> Any:
        self._check()
        if handle[0] != "gpu":
            raise NVMLError_NotSupported()
        return self.spec.gpus[handle[1]]

    def _mig(self, handle: tuple[Any, ...]) -> Any:
        self._check()
        if handle[0] != "mig":
            raise NVMLError_InvalidArgument()
        return handle[2]

    def nvmlDeviceGetUUID(self, handle: tuple[Any, ...]) -> str | bytes:
        return self._s(self._gpu(handle).uuid if handle[0] == "gpu" else self._mig(handle).uuid)

    def nvmlDeviceGetMinorNumber(self, handle: tuple[Any, ...]) -> int:
        return self._gpu(handle).minor

    def nvmlDeviceGetPciInfo(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        bus = self._gpu(handle).bus  # NVML reports the 8-digit domain, upper case
        return SimpleNamespace(busId=self._s(("0000" + bus).upper()), busIdLegacy=self._s(bus.upper()))

    def nvmlDeviceGetName(self, handle: tuple[Any, ...]) -> str | bytes:
        if handle[0] == "mig":
            mig = self._mig(handle)
            parent = self.spec.gpus[handle[1]]
            return self._s(f"{parent.name} MIG {mig.profile}")
        return self._s(self._gpu(handle).name)

    def nvmlDeviceGetMigMode(self, handle: tuple[Any, ...]) -> list[int]:
        mode = NVML_DEVICE_MIG_ENABLE if self._gpu(handle).mig_enabled else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple[Any, ...]) -> int:
        return MAX_MIG_DEVICES if self._gpu(handle).mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: tuple[Any, ...], index: int) -> tuple[Any, ...]:
        gpu = self._gpu(handle)
        if self.fail_mig is not None:
            raise NVMLError(self.fail_mig)
        migs = [m for m in self.spec.migs if m.parent_minor == gpu.minor]
        if not 0 <= index < len(migs):
            raise NVMLError_NotFound()
        return ("mig", handle[1], migs[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[Any, ...]) -> int:
        return self._mig(handle).gi

    def nvmlDeviceGetComputeInstanceId(self, handle: tuple[Any, ...]) -> int:
        return self._mig(handle).ci

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: tuple[Any, ...]) -> tuple[str, int]:
        self._mig(handle)
        return ("gpu", handle[1])


_active: FakeNvml | None = None


def activate(fake: FakeNvml | None) -> None:
    """Make this module's ``nvml*`` functions delegate to ``fake`` (``None`` to stop)."""
    global _active
    _active = fake


def __getattr__(name: str) -> Any:
    if name.startswith("nvml") and _active is not None:
        return getattr(_active, name)
    raise AttributeError(name)
