"""What ``hook nri`` keeps between containers, and the per-container work it leaves on a big node
(issue 34 item 8: a median CreateContainer decision of <= 3 ms on the 64 GPU + 224 MIG node too,
since containerd serialises every CreateContainer node-wide). Work is counted, never timed."""

from __future__ import annotations

from typing import Any

import pytest

from hook.routes.nri import messages, proto
from tests import nrifake as f


def _container(devices: list[bytes]) -> bytes:
    return f.event(f.pod(), f.container(devices=devices))


def test_kept_devices_decode_as_their_own_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two containers holding nodes that differ in one field each get their own; the same bytes
    decode to the same value, and the keeper is bounded."""
    monkeypatch.setattr(messages, "_kept_devices", {})
    a = [f.device("/dev/nvidia0", "c", 195, 0), f.device("/dev/nvidia1", "c", 195, 1, mode=0o600)]
    b = [f.device("/dev/nvidia0", "c", 195, 1), f.device("/dev/nvidia1", "c", 195, 1, mode=None)]
    first = messages.event(messages.CREATE_CONTAINER, _container(a)).container.devices
    other = messages.event(messages.CREATE_CONTAINER, _container(b)).container.devices
    again = messages.event(messages.CREATE_CONTAINER, _container(a)).container.devices
    assert [(d.path, d.minor, d.file_mode) for d in first] == [
        ("/dev/nvidia0", 0, 0o666),
        ("/dev/nvidia1", 1, 0o600),
    ]
    assert [(d.path, d.minor, d.file_mode) for d in other] == [
        ("/dev/nvidia0", 1, 0o666),
        ("/dev/nvidia1", 1, None),
    ]
    assert again == first
    monkeypatch.setattr(messages, "MAX_KEPT_DEVICES", 3)
    many = [f.device(f"/dev/x{i}", "c", 1, i) for i in range(10)]
    decoded = messages.event(messages.CREATE_CONTAINER, _container(many)).container.devices
    assert [d.minor for d in decoded] == list(range(10)) and len(messages._kept_devices) <= 3


def test_a_big_containers_devices_are_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted: the second container holding the same 520 nodes decodes none of them again (it
    decoded 521 messages for them before the keeper)."""
    monkeypatch.setattr(messages, "_kept_devices", {})
    payload = _container([f.device(f"/dev/nvidia-caps/nvidia-cap{i}", "c", 237, i) for i in range(520)])
    messages.event(messages.CREATE_CONTAINER, payload)
    calls = {"n": 0}
    real = proto.decode

    def counting(buf: Any) -> Any:
        calls["n"] += 1
        return real(buf)

    monkeypatch.setattr(messages, "decode", counting)
    monkeypatch.setattr(proto, "decode", counting)
    messages.event(messages.CREATE_CONTAINER, payload)
    assert calls["n"] <= 10  # the event, pod, container, linux, resources: not per device
