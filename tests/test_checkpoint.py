"""hook.sources.kubelet.checkpoint: the kubelet device-plugin checkpoint and its protobuf AllocResp."""

from __future__ import annotations

import base64
import json

import pytest

from hook.core.errors import InputError
from hook.sources.kubelet.checkpoint import find_allocations, parse_checkpoint
from tests.bundles import CONTAINER, POD_UID, alloc_resp, checkpoint, checkpoint_entry


def test_alloc_resp_decoded() -> None:
    resp = alloc_resp(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-1", "X": "y"},
        devices=[("/dev/dri/renderD128", "/dev/dri/renderD129", "rw")],
        cdi=["nvidia.com/gpu=0", "nvidia.com/gpu=1"],
    )
    (a,) = parse_checkpoint(checkpoint([checkpoint_entry("amd.com/gpu", ["b", "a", "a"], resp)]), "ck")
    assert (a.pod_uid, a.container, a.resource) == (POD_UID, CONTAINER, "amd.com/gpu")
    assert a.device_ids == ("a", "b")
    assert dict(a.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "X": "y"}
    assert a.device_paths == (("/dev/dri/renderD128", "/dev/dri/renderD129"),)
    assert a.cdi_devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")


def test_unknown_protobuf_fields_skipped() -> None:
    """A newer kubelet's fields are skipped by their wire type, and the fields after them still read.

    Field 2 (a mount: container_path "a"), a varint field 9, a fixed64 field 10 and a fixed32
    field 11 before a CDI device. The fixed fields' bytes are not zeros: skipped by the wrong width,
    they read as a length-delimited field running past the end (issue 31, s142737-019), not as
    padding."""
    junk = b"\x0a\xff\xff\xff"  # as a field: 1, length-delimited, a length far past the end
    extra = b"\x12\x03\x0a\x01a" + b"\x48\x96\x01" + b"\x51" + junk * 2 + b"\x5d" + junk
    (a,) = parse_checkpoint(
        checkpoint([checkpoint_entry("r", ["0"], extra + alloc_resp(cdi=["v/c=n"]))]), "ck"
    )
    assert a.cdi_devices == ("v/c=n",)


def test_a_response_that_is_not_protobuf_is_a_corrupt_checkpoint_not_an_empty_allocation() -> None:
    """A mount whose bytes are no Mount message (``abc``: field 12 as a fixed64 with 2 bytes left)
    is a response the kubelet itself could not have written: the entry is reported, as Go's
    unmarshalling would fail on it, rather than read as a mount with no paths."""
    with pytest.raises(InputError, match="AllocResp"):
        parse_checkpoint(
            checkpoint([checkpoint_entry("r", ["0"], b"\x12\x03abc" + alloc_resp(cdi=["v/c=n"]))]), "ck"
        )


def test_flat_device_id_list_of_old_kubelets() -> None:
    data = json.dumps(
        {
            "Data": {
                "PodDeviceEntries": [
                    {"PodUID": "p", "ContainerName": "c", "ResourceName": "r", "DeviceIDs": ["1", "0"]}
                ]
            }
        }
    ).encode()
    assert parse_checkpoint(data, "ck")[0].device_ids == ("0", "1")


@pytest.mark.parametrize(
    "data",
    [b"{}", b'{"Data":{}}', b'{"Data":{"PodDeviceEntries":null}}'],
    ids=["empty", "no-entries", "null-entries"],
)
def test_no_entries(data: bytes) -> None:
    assert parse_checkpoint(data, "ck") == ()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param(b"{oops", "", id="not-json"),
        pytest.param(b'{"Data":{"PodDeviceEntries":{}}}', "Data.PodDeviceEntries", id="entries-object"),
        pytest.param(b'{"Data":{"PodDeviceEntries":[3]}}', "Data.PodDeviceEntries[0]", id="entry-int"),
        pytest.param(checkpoint([{"DeviceIDs": {"0": "x"}}]), "Data.PodDeviceEntries[0].DeviceIDs", id="ids"),
        pytest.param(
            checkpoint([{"AllocResp": "!!notbase64"}]), "Data.PodDeviceEntries[0].AllocResp", id="b64"
        ),
        pytest.param(
            checkpoint([{"AllocResp": base64.b64encode(b"\x2a\x09ab").decode()}]),
            "Data.PodDeviceEntries[0].AllocResp",
            id="truncated-protobuf",
        ),
        pytest.param(  # a varint cut after a continuation byte (fresh mutant s530669-032, issue 24)
            checkpoint([{"AllocResp": base64.b64encode(b"\x2a\x80").decode()}]),
            "Data.PodDeviceEntries[0].AllocResp",
            id="truncated-varint",
        ),
    ],
)
def test_corrupt_checkpoint_names_field(data: bytes, field: str) -> None:
    with pytest.raises(InputError) as info:
        parse_checkpoint(data, "/var/lib/kubelet/ckpt")
    assert (info.value.file, info.value.field) == ("/var/lib/kubelet/ckpt", field)


def test_find_allocations_matches_pod_and_container() -> None:
    allocs = parse_checkpoint(
        checkpoint(
            [
                checkpoint_entry("nvidia.com/gpu", ["0"]),
                checkpoint_entry("nvidia.com/gpu", ["1"], container="sidecar"),
                checkpoint_entry("nvidia.com/gpu", ["2"], pod_uid="other"),
            ]
        ),
        "ck",
    )
    assert [a.device_ids for a in find_allocations(allocs, POD_UID, CONTAINER)] == [("0",)]


def test_volume_mounts_and_cdi_annotations_strategies_decoded() -> None:
    resp = alloc_resp(
        envs={"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
        mounts=[("/var/run/nvidia-container-devices/GPU-2", "/dev/null")],
        annotations={"cdi.k8s.io/nvidia-device-plugin_GPU-2": "nvidia.com/gpu=GPU-2"},
    )
    (a,) = parse_checkpoint(checkpoint([checkpoint_entry("nvidia.com/gpu", ["GPU-2"], resp)]), "ck")
    assert a.mounts == (("/var/run/nvidia-container-devices/GPU-2", "/dev/null"),)
    assert dict(a.annotations) == {"cdi.k8s.io/nvidia-device-plugin_GPU-2": "nvidia.com/gpu=GPU-2"}


def test_only_this_containers_entries_are_decoded() -> None:
    """Another pod's corrupt AllocResp cannot fail this container's decision."""
    data = checkpoint(
        [
            checkpoint_entry("nvidia.com/gpu", ["0"], alloc_resp(cdi=["nvidia.com/gpu=0"])),
            {"PodUID": "other", "ContainerName": "c", "AllocResp": "!!notbase64"},
        ]
    )
    with pytest.raises(InputError):
        parse_checkpoint(data, "ck")
    (a,) = parse_checkpoint(data, "ck", (POD_UID, CONTAINER))
    assert a.cdi_devices == ("nvidia.com/gpu=0",)


def test_data_must_be_an_object() -> None:
    with pytest.raises(InputError) as info:
        parse_checkpoint(b'{"Data": []}', "ck")
    assert info.value.field == "Data"
