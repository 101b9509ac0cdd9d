"""Each of NRI's devices is parsed once per daemon (issue 34 item 8): a privileged container on a
64 GPU + 224 MIG node carries ~520, the same ones every time. What the daemon decides on must be
exactly what ``parse_config_object`` makes of the same config, errors included."""

from __future__ import annotations

from typing import Any

import pytest

from hook.core import decide, oci
from hook.core.errors import InputError
from hook.routes.nri import messages as m
from hook.routes.nri import spec
from tests import nrifake as f

SOURCE = "NRI CreateContainer"


def _ctr(cid: str, devices: list[bytes]) -> m.Container:
    ev = m.event(
        m.CREATE_CONTAINER, f.event(f.pod(), f.container(cid, rules=[f.rule(True)], devices=devices))
    )
    return ev.container


def _gpus(n: int = 8) -> list[bytes]:
    return [f.device(f"/dev/nvidia{i}", "c", 195, i) for i in range(n)]


@pytest.fixture(autouse=True)
def empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec, "_parsed", {})
    monkeypatch.setattr(m, "_kept_devices", {})


def _doc(c: m.Container) -> dict[str, Any]:
    return spec.oci_config(m.Pod(), c, frozenset(), "cdi.k8s.io/")


def test_a_device_seen_before_is_not_parsed_again_and_the_config_is_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[int] = []
    real = oci._parse_devices

    def counting(items: Any, source: str) -> tuple[oci.LinuxDevice, ...]:
        parsed.append(len(items or ()))
        return real(items, source)

    monkeypatch.setattr(oci, "_parse_devices", counting)
    first, second = _ctr("a" * 64, _gpus()), _ctr("b" * 64, _gpus())
    one = spec.parsed_config(_doc(first), first, SOURCE)
    two = spec.parsed_config(_doc(second), second, SOURCE)
    assert parsed == [8, 0]  # the second container's devices: none parsed again
    assert two == oci.parse_config_object(_doc(second), SOURCE, "")
    assert one.devices == two.devices and all(a is b for a, b in zip(one.devices, two.devices, strict=True))
    assert all(a is b for a, b in zip(decide._nodes_of(one), decide._nodes_of(two), strict=True))


def test_a_bad_device_is_refused_as_every_route_refuses_it_and_never_kept() -> None:
    good = _ctr("a" * 64, _gpus())
    spec.parsed_config(_doc(good), good, SOURCE)
    bad = _ctr("b" * 64, [*_gpus(), f.device("/dev/x", "x", 1, 1)])
    with pytest.raises(InputError) as ours:
        spec.parsed_config(_doc(bad), bad, SOURCE)
    with pytest.raises(InputError) as theirs:
        oci.parse_config_object(_doc(bad), SOURCE, "")
    assert str(ours.value) == str(theirs.value) and "linux.devices[8].type" in str(ours.value)
    assert len(spec._parsed) == 8


def test_new_decoded_values_are_parsed_again_and_the_kept_ones_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = _ctr("a" * 64, _gpus())
    spec.parsed_config(_doc(first), first, SOURCE)
    m._kept_devices.clear()  # the decoder made new values: another id each, never the old parse
    again = _ctr("b" * 64, _gpus())
    assert all(d.type == "c" for d in spec.parsed_config(_doc(again), again, SOURCE).devices)
    assert len(spec._parsed) == 16
    monkeypatch.setattr(spec, "MAX_PARSED", 20)
    m._kept_devices.clear()
    third = _ctr("c" * 64, _gpus())
    spec.parsed_config(_doc(third), third, SOURCE)
    assert len(spec._parsed) == 8  # full: cleared before the third's were kept
