"""NVML queries through the fake pynvml (hook.sources.nvidia.nvml)."""

from __future__ import annotations

import sys

import pytest

from hook.core.errors import InputError
from hook.sources.nvidia import nvml
from tests.nvidia import fake_pynvml
from tests.nvidia.fake_pynvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_UNKNOWN,
    NVMLError,
    NVMLError_NoPermission,
)


def test_fake_errors_behave_like_pynvml() -> None:
    err = NVMLError(NVML_ERROR_NO_PERMISSION)
    assert type(err) is NVMLError_NoPermission and err.value == 4 and str(err) == "Insufficient Permissions"
    assert NVMLError_NoPermission().value == NVML_ERROR_NO_PERMISSION


def test_gpus_and_migs(nvml_for) -> None:
    fake = nvml_for("8x-mig")
    result = nvml.query(fake)
    assert result.driver_version == "550.54.15" and result.warnings == ()
    assert [(g.index, g.minor, g.pci_bus_id) for g in result.gpus][:2] == [
        (0, 0, "0000:18:00.0"),
        (1, 1, "0000:2a:00.0"),
    ]
    assert result.gpus[1].uuid.startswith("GPU-a158631e") and result.gpus[0].mig_enabled
    assert not any(g.mig_enabled for g in result.gpus[1:])
    assert [(m.parent_minor, m.gi, m.ci, m.profile, m.index) for m in result.migs] == [
        (0, 1, 0, "3g.40gb", 0),
        (0, 2, 0, "2g.20gb", 1),
    ]
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)


def test_bytes_strings_are_decoded(nvml_for) -> None:
    result = nvml.query(nvml_for("8x-mig", bytes_strings=True))
    assert result.driver_version == "550.54.15" and result.migs[0].uuid.startswith("MIG-07ad8e7c")
    assert result.gpus[7].pci_bus_id == "0000:db:00.0"


def test_need_migs_false_skips_mig_queries(nvml_for) -> None:
    result = nvml.query(nvml_for("8x-mig", fail_mig=NVML_ERROR_NO_PERMISSION), need_migs=False)
    assert result.migs == () and result.warnings == ()


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found"),
        (NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (NVML_ERROR_UNKNOWN, "NVML error: Unknown Error"),
    ],
    ids=["library missing", "no permission", "driver not loaded", "other"],
)
def test_init_failures_are_clear(nvml_for, code: int, text: str) -> None:
    fake = nvml_for("1x", fail_init=code)
    with pytest.raises(InputError) as info:
        nvml.query(fake)
    assert (info.value.file, info.value.field) == ("NVML", "nvmlInit") and text in info.value.reason
    assert fake.shutdown_calls == 0


def test_mig_permission_failure_is_a_warning(nvml_for) -> None:
    fake = nvml_for("8x-mig", fail_mig=NVML_ERROR_NO_PERMISSION)
    result = nvml.query(fake)
    assert result.migs == () and len(result.gpus) == 8
    assert len(result.warnings) == 1 and "Insufficient Permissions" in result.warnings[0]
    assert "MIG devices of GPU 0" in result.warnings[0]
    assert fake.shutdown_calls == 1


def test_gpu_query_failure_still_shuts_down(nvml_for, monkeypatch) -> None:
    fake = nvml_for("8x")

    def refuse(handle: object) -> int:
        raise NVMLError_NoPermission()

    monkeypatch.setattr(fake, "nvmlDeviceGetMinorNumber", refuse, raising=False)
    with pytest.raises(InputError) as info:
        nvml.query(fake)
    assert info.value.field == "GPUs" and "Insufficient Permissions" in info.value.reason
    assert fake.shutdown_calls == 1


def test_lazy_import_missing_package(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(InputError) as info:
        nvml.query()
    assert info.value.field == "pynvml" and "nvidia-ml-py" in info.value.reason


def test_lazy_import_uses_pynvml_module(monkeypatch, nvml_for) -> None:
    fake = nvml_for("1x")
    fake_pynvml.activate(fake)
    try:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
        result = nvml.query()
    finally:
        fake_pynvml.activate(None)
    assert [g.uuid for g in result.gpus] == ["GPU-3f2b9c41-7d0e-4a6b-8c15-2e9f0a7b6d34"]
    assert fake.init_calls == 1
