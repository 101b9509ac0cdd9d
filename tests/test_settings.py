"""hook.sources.settingsfile: defaults, every key's validation, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hook.core.errors import InputError
from hook.sources.settingsfile import (
    EnvRequests,
    MigManagement,
    Policy,
    Settings,
    load_settings,
    parse_settings,
)


def test_missing_default_file_means_defaults(tmp_path: Path) -> None:
    s = load_settings(tmp_path / "absent.yaml")
    assert s == Settings()
    assert s.privileged_allocation is Policy.NARROW
    assert s.mig_management is MigManagement.REQUIRE_SYS_ADMIN
    assert s.default_cdi_kind == "nvidia.com/gpu"


def test_missing_required_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file") as info:
        load_settings(tmp_path / "absent.yaml", required=True)
    assert info.value.file == str(tmp_path / "absent.yaml")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"], ids=["empty", "comment", "doc-marker"])
def test_empty_documents_mean_defaults(tmp_path: Path, text: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    assert load_settings(p, required=True) == Settings()


def test_every_key_round_trips(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(
        "privileged_allocation: reject\nmig_management: never\ncap_access: rw\n"
        "cdi_annotation_prefixes: [cdi.k8s.io/, x.io/]\ncdi_kinds: [nvidia.com/gpu, amd.com/gpu]\n"
        "accelerator_nodes: {acme: ['acme[0-9]*']}\naccept_envvar_when_unprivileged: false\n"
        "log_max_bytes: 8192\nkubelet_checkpoint: /tmp/ckpt\ncorroborating_env: [MY_*]\n"
    )
    s = load_settings(p, required=True)
    assert s.privileged_allocation is Policy.REJECT
    assert s.mig_management is MigManagement.NEVER
    assert s.cap_access == "rw"
    assert s.cdi_annotation_prefixes == ("cdi.k8s.io/", "x.io/")
    assert s.cdi_kinds == ("nvidia.com/gpu", "amd.com/gpu")
    assert dict(s.accelerator_nodes) == {"acme": ("acme[0-9]*",)}
    assert s.env_requests is EnvRequests.NEVER  # NVIDIA's name, kept as an alias
    assert (s.log_max_bytes, s.kubelet_checkpoint, s.corroborating_env) == (8192, "/tmp/ckpt", ("MY_*",))


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        pytest.param({"privileged_alocation": "narrow"}, "privileged_alocation", id="unknown-key-typo"),
        pytest.param({"privileged_allocation": "deny"}, "privileged_allocation", id="policy-value"),
        pytest.param({"mig_management": True}, "mig_management", id="mig-bool"),
        pytest.param({"cap_access": "rwm"}, "cap_access", id="cap-access"),
        pytest.param({"cdi_kinds": []}, "cdi_kinds", id="kinds-empty"),
        pytest.param({"cdi_annotation_prefixes": "cdi.k8s.io/"}, "cdi_annotation_prefixes", id="prefix-str"),
        pytest.param({"corroborating_env": [""]}, "corroborating_env", id="env-empty-item"),
        pytest.param({"accelerator_nodes": ["nvidia*"]}, "accelerator_nodes", id="nodes-list"),
        pytest.param({"accelerator_nodes": {"amd": "dri/*"}}, "accelerator_nodes.amd", id="nodes-vendor-str"),
        pytest.param(
            {"accept_envvar_when_unprivileged": "yes"}, "accept_envvar_when_unprivileged", id="bool"
        ),
        pytest.param({"env_requests": "sometimes"}, "env_requests", id="env-requests-enum"),
        pytest.param(
            {"env_requests": "always", "accept_envvar_when_unprivileged": False},
            "accept_envvar_when_unprivileged",
            id="alias-contradicts",
        ),
        pytest.param({"env_trusted_namespaces": "gpu-operator"}, "env_trusted_namespaces", id="ns-not-list"),
        pytest.param({"gpu_resources": []}, "gpu_resources", id="gpu-resources-empty"),
        pytest.param({"log_max_bytes": 100}, "log_max_bytes", id="log-small"),
        pytest.param({"log_max_bytes": True}, "log_max_bytes", id="log-bool"),
        pytest.param({"kubelet_checkpoint": "relative/ckpt"}, "kubelet_checkpoint", id="path-relative"),
        pytest.param({"log_file": 3}, "log_file", id="path-int"),
    ],
)
def test_bad_settings_name_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(InputError) as info:
        parse_settings(doc, "/etc/x.yaml")
    assert (info.value.file, info.value.field) == ("/etc/x.yaml", key)


@pytest.mark.parametrize("doc", [[1, 2], "narrow", 3], ids=["list", "string", "int"])
def test_settings_document_must_be_a_mapping(doc: object) -> None:
    with pytest.raises(InputError, match="mapping"):
        parse_settings(doc, "s.yaml")


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("cap_access: r\nkey: [unclosed\n")
    with pytest.raises(InputError) as info:
        load_settings(p, required=True)
    assert info.value.file == str(p)
    assert info.value.field.startswith("line ")
    assert "not valid YAML" in info.value.reason


@pytest.mark.parametrize(
    ("doc", "mode"),
    [
        pytest.param({}, EnvRequests.AUTO, id="default-auto"),
        pytest.param({"accept_envvar_when_unprivileged": True}, EnvRequests.ALWAYS, id="alias-true"),
        pytest.param({"accept_envvar_when_unprivileged": False}, EnvRequests.NEVER, id="alias-false"),
        pytest.param({"env_requests": "never", "accept_envvar_when_unprivileged": False}, EnvRequests.NEVER),
    ],
)
def test_env_requests_and_its_nvidia_alias(doc: dict[str, object], mode: EnvRequests) -> None:
    assert parse_settings(doc, "s.yaml").env_requests is mode


def test_trusted_namespaces_default_to_nvidias_manifests_and_may_be_emptied() -> None:
    assert Settings().env_trusted_namespaces == (
        "gpu-operator",
        "nvidia-gpu-operator",
        "nvidia-device-plugin",
        "kube-system",
    )
    assert parse_settings({"env_trusted_namespaces": []}, "s.yaml").env_trusted_namespaces == ()
