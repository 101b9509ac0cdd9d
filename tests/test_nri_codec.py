"""The NRI route's hand-written codec (issue 34 item 6): protobuf's wire format, the multiplexer
and ttrpc framings, and the message subset, against bytes written from the field numbers; and
their bounds (item 5): split, oversized and garbage input raise the codec's own error, never
anything else and never a large allocation."""

from __future__ import annotations

import contextlib
import random
import struct

import pytest

from hook.core.plan import Node
from hook.core.protowire import decode, enc_int, enc_text, varint
from hook.core.rules import Access, DeviceType, Rule
from hook.routes.nri import frames, messages
from hook.routes.nri.spec import names_container, oci_config
from hook.routes.nri.verdicts import trims
from tests import nrifake as f


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (150, b"\x96\x01"),
        (-1, b"\xff" * 9 + b"\x01"),
        (2**63 - 1, b"\xff" * 8 + b"\x7f"),
    ],
)
def test_varints_as_protobuf_writes_them(value: int, wire: bytes) -> None:
    assert varint(value) == wire
    assert decode(b"\x08" + wire).int64(1) == value


def test_fields_read_proto3_defaults_and_skip_unknown_fields() -> None:
    body = (
        enc_text(1, "a") + enc_int(99, 7) + b"\x2d\x01\x00\x00\x00" + b"\x31" + b"\x00" * 8 + enc_text(1, "b")
    )
    got = decode(body)
    assert got.text(1) == "b" and got.texts(1) == ["a", "b"]  # a repeated scalar: the last wins
    assert got.text(2) == "" and got.uint(3) == 0 and got.message(4) is None


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"\x0a\x05abc", id="length-past-the-end"),
        pytest.param(b"\x08" + b"\xff" * 11, id="overlong-varint"),
        pytest.param(b"\x0b", id="group-start"),
        pytest.param(b"\x00\x01", id="field-zero"),
        pytest.param(b"\x0d\x01\x02", id="truncated-fixed32"),
    ],
)
def test_malformed_protobuf_is_a_value_error(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode(bad)


def test_a_field_with_an_unexpected_wire_type_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode(enc_int(1, 5)).text(1)


def test_container_event_decodes_every_field_a_decision_reads() -> None:
    ev = messages.event(
        4,
        f.event(
            f.pod(id="s" * 64, name="n", uid="u", namespace="ns", annotations={"k": "v"}),
            f.container(
                "c" * 64,
                annotations={"a": "b"},
                env=["X=1"],
                devices=[f.device("/dev/nvidia0", "c", 195, 0, mode=0o660)],
                rules=[f.rule(True), f.rule(False, "c", 195, -1, "rw")],
                pid=42,
                cdi=["nvidia.com/gpu=0"],
            ),
        ),
    )
    assert (ev.pod.uid, ev.pod.namespace, ev.pod.annotations) == ("u", "ns", {"k": "v"})
    c = ev.container
    assert (c.id, c.env, c.pid, c.cdi_devices) == ("c" * 64, ("X=1",), 42, ("nvidia.com/gpu=0",))
    assert c.devices == (messages.Device(path="/dev/nvidia0", type="c", major=195, minor=0, file_mode=0o660),)
    assert c.rules == (
        messages.CgroupRule(allow=True, type="", major=None, minor=None, access="rwm"),
        messages.CgroupRule(allow=False, type="c", major=195, minor=-1, access="rw"),
    )


def test_the_create_adjustment_as_the_field_numbers_say() -> None:
    node = Node(path="/dev/nvidia-caps/nvidia-cap1", type="c", major=237, minor=1, file_mode=0o444)
    rule = Rule(allow=False, type=DeviceType.CHAR, major=237, minor=1, access=Access.W)
    got = f.adjust_of(messages.adjustment([node], [rule]))
    assert got == {
        "devices": [("/dev/nvidia-caps/nvidia-cap1", "c", 237, 1)],
        "rules": [(False, "c", 237, 1, "w")],
    }
    assert messages.adjustment([], []) == b""


def test_nri_adds_rw_for_a_node_so_the_answer_trims_it_to_the_plans_access() -> None:
    cap = Node(path="/dev/nvidia-caps/nvidia-cap1", type="c", major=237, minor=1)
    allow_r = Rule(allow=True, type=DeviceType.CHAR, major=237, minor=1, access=Access.R)
    assert trims((cap,), (), (allow_r,)) == (
        Rule(allow=False, type=DeviceType.CHAR, major=237, minor=1, access=Access.W),
    )
    everything = (Rule(allow=True),)  # privileged: the runtime's allow adds nothing
    assert trims((cap,), everything, ()) == ()


def test_the_pod_identity_comes_from_nris_fields_not_the_annotations() -> None:
    cid = "c" * 64
    c = messages.event(
        4,
        f.event(
            f.pod(id="s" * 64, uid="real"),
            f.container(cid, annotations={"io.kubernetes.cri.sandbox-uid": "victim"}),
        ),
    ).container
    pod = messages.Pod(id="s" * 64, name="p", uid="real", namespace="ns")
    doc = oci_config(pod, c, frozenset(), "cdi.k8s.io/")
    assert doc["annotations"]["io.kubernetes.cri.sandbox-uid"] == "real"
    assert doc["annotations"]["io.kubernetes.cri.sandbox-id"] == "s" * 64
    other = messages.Container(
        id=cid, cgroups_path="/kubepods/" + "d" * 64, annotations={"io.kubernetes.cri.sandbox-uid": "victim"}
    )
    assert oci_config(pod, other, frozenset(), "cdi.k8s.io/")["annotations"] == {
        "io.kubernetes.cri.sandbox-uid": "victim"
    }


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/kubepods/besteffort/podu/" + "c" * 64, True),
        ("kubepods-pod_u.slice:cri-containerd:" + "c" * 64, True),
        ("/kubepods/podu/crio-" + "c" * 64, True),
        ("kubepods.slice:crio:" + "c" * 64, True),
        ("/kubepods/podu/" + "d" * 64, False),
        ("/kubepods/podu/" + "c" * 64 + "x", False),
        ("", False),
    ],
)
def test_cgroups_path_must_name_the_container(path: str, named: bool) -> None:
    assert names_container(path, "c" * 64) is named


def test_split_mux_frames_and_ttrpc_messages_reassemble() -> None:
    wire = frames.mux(1, frames.request(1, "S", "M", b"x" * 70000)) + frames.mux(2, frames.response(1, b"ok"))
    demux, streams, got = frames.Demux(), {1: frames.Stream(), 2: frames.Stream()}, []
    for i in range(0, len(wire), 7):
        for conn, chunk in demux.feed(wire[i : i + 7]):
            got += [(conn, m) for m in streams[conn].feed(chunk)]
    (c1, req), (c2, resp) = got
    assert (c1, frames.parse_request(req).payload) == (1, b"x" * 70000)
    assert (c2, frames.parse_response(resp).payload) == (2, b"ok")[1:] or frames.parse_response(
        resp
    ).payload == b"ok"


@pytest.mark.parametrize(
    "header",
    [struct.pack(">II", 1, frames.MAX_FRAME + 1), struct.pack(">II", 0, 1), struct.pack(">II", 3, 1)],
    ids=["oversized", "conn-0", "conn-3"],
)
def test_mux_refuses_before_buffering(header: bytes) -> None:
    with pytest.raises(frames.ProtocolError):
        frames.Demux().feed(header)


def test_ttrpc_refuses_an_oversized_message_from_its_header() -> None:
    with pytest.raises(frames.ProtocolError):
        frames.Stream().feed(struct.pack(">IIBB", frames.MAX_MESSAGE + 1, 1, 1, 0))


def test_garbage_raises_only_the_codecs_own_errors() -> None:
    rng = random.Random(34)
    for _ in range(3000):
        data = rng.randbytes(rng.randrange(0, 64))
        try:
            for _conn, chunk in frames.Demux().feed(data):
                for m in frames.Stream().feed(chunk):
                    frames.parse_request(m)
        except frames.ProtocolError:
            pass
        for parse in (
            messages.parse_configure,
            messages.parse_sync,
            lambda b: messages.event(4, b),
            messages.state_change,
        ):
            with contextlib.suppress(ValueError):
                parse(data)


@pytest.mark.parametrize(
    ("runtime", "version", "nri", "applied"),
    [
        ("containerd", "v2.2.7", "", True),
        ("containerd", "2.2.0-rc.1", "", True),
        ("containerd", "v2.1.9", "", False),
        ("containerd", "1.7.24", "", False),
        ("cri-o", "1.34.0", "", True),
        ("cri-o", "1.33.2", "", False),
        ("containerd", "v2.2.7", "v0.9.0", False),  # NRI's own version wins where sent
        ("containerd", "v2.1.9", "v0.10.0", True),
        ("podman", "5.4.0", "", False),  # anything unknown: start narrows alone
        ("containerd", "", "", False),
        ("containerd", "main-abc", "", False),
    ],
)
def test_device_rules_at_create_only_where_nri_applies_them(
    runtime: str, version: str, nri: str, applied: bool
) -> None:
    from hook.routes.nri.plugin import rules_applied

    assert (
        rules_applied(messages.Configure(runtime_name=runtime, runtime_version=version, nri_version=nri))
        is applied
    )
