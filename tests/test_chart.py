"""Issue 37 items 3, 4, 5: the Helm chart (packaging/helm/oci-device-hook) renders the kustomize
base's objects from values, with the image as repository, tag and digest, scheduling, pull
secrets, resources, the decider's prefix, a metrics mode, a PodMonitor, a PrometheusRule holding
the operators' alert table, and a pre-delete hook that makes ``helm uninstall`` uninstall every node.

``helm`` cannot be installed on this project's machines (no package of the registries they reach
ships it), so the templates are rendered by tests/helmlite.py, which implements the Go-template
subset the chart uses and fails on anything else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helmlite import TemplateError, render_chart

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "packaging/helm/oci-device-hook"
BASE = REPO / "packaging/kubernetes"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def objects(values: dict[str, Any] | None = None, namespace: str = "gpu-guard") -> dict[str, dict[str, Any]]:
    """Every rendered object by ``Kind/name``."""
    merged = {"image": {"tag": "9.9.9"}, **(values or {})}
    out: dict[str, dict[str, Any]] = {}
    for name, text in render_chart(CHART, merged, namespace=namespace).items():
        for doc in yaml.safe_load_all(text):
            if doc:
                out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
                assert doc["metadata"].get("namespace") == namespace, name
    return out


def _pod(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objs["DaemonSet/oci-device-hook"]["spec"]["template"]["spec"]


def _containers(objs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod(objs)["containers"]}


def _base() -> dict[str, dict[str, Any]]:
    out = {}
    for name in ("configmap.yaml", "daemonset.yaml"):
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def test_the_chart_makes_the_kustomize_bases_objects() -> None:
    """One set of objects, two ways to deploy it: with default values (the image set) the chart's
    DaemonSet and ConfigMaps are the base's, but for the image, labels and namespace."""
    objs, base = objects(namespace="oci-device-hook"), _base()
    pod, base_pod = _pod(objs), base["DaemonSet/oci-device-hook"]["spec"]["template"]["spec"]
    for c in base_pod["containers"]:
        c["image"] = "localhost/oci-device-hook:9.9.9"
    assert pod == base_pod
    for name in ("oci-device-hook-scripts", "oci-device-hook-settings"):
        ours, theirs = objs[f"ConfigMap/{name}"]["data"], base[f"ConfigMap/{name}"]["data"]
        assert set(ours) == set(theirs)
        for key in ours:
            assert yaml.safe_load(ours[key]) == yaml.safe_load(theirs[key]) if key.endswith(".yaml") else (
                ours[key].rstrip() == theirs[key].rstrip()), (name, key)  # fmt: skip


def test_the_charts_scripts_are_the_bases() -> None:
    """Helm reads no file outside its chart: files/ holds copies. Edit configmap.yaml, then run
    packaging/helm/sync-scripts."""
    scripts = next(d for d in yaml.safe_load_all((BASE / "configmap.yaml").read_text())
                   if d["metadata"]["name"] == "oci-device-hook-scripts")["data"]  # fmt: skip
    files = {p.name: p.read_text() for p in (CHART / "files").iterdir()}
    assert files == scripts, "run packaging/helm/sync-scripts"


@pytest.mark.parametrize(
    ("image", "want"),
    [
        ({"repository": "reg.example/odh", "tag": "1.2.3"}, "reg.example/odh:1.2.3"),
        ({"repository": "reg.example:5000/o", "tag": "", "digest": DIGEST}, f"reg.example:5000/o@{DIGEST}"),
        ({"repository": "reg.example/o", "tag": "1.2.3", "digest": DIGEST}, f"reg.example/o:1.2.3@{DIGEST}"),
    ],
)
def test_the_image_is_repository_tag_and_digest(image: dict[str, str], want: str) -> None:
    objs = objects({"image": image, "uninstallOnDelete": True})
    assert {c["image"] for c in _containers(objs).values()} == {want}
    (job,) = objs["Job/oci-device-hook-teardown"]["spec"]["template"]["spec"]["containers"]
    assert job["image"] == want


def test_a_source_chart_needs_a_tag_or_digest_and_a_digest_is_sha256() -> None:
    with pytest.raises(TemplateError, match=r"image\.tag or image\.digest"):
        render_chart(CHART, {})
    with pytest.raises(TemplateError, match=r"image\.digest"):
        objects({"image": {"tag": "1", "digest": "md5:abc"}})


def test_defaults_need_no_gpu_feature_discovery_and_tolerate_every_taint() -> None:
    pod = _pod(objects())
    assert "nodeSelector" not in pod and "affinity" not in pod
    assert pod["tolerations"] == [{"operator": "Exists"}]


def test_scheduling_pull_secrets_resources_and_prefix_are_values() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}  # fmt: skip
    values = {
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "affinity": affinity,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "imagePullSecrets": [{"name": "regcred"}],
        "prefix": "/home/kubernetes/bin/oci-device-hook",
        "decider": {"resources": {"requests": {"cpu": "50m"}}},
    }
    objs = objects(values)
    pod = _pod(objs)
    assert pod["nodeSelector"] == values["nodeSelector"] and pod["affinity"] == affinity
    assert pod["tolerations"] == values["tolerations"] and pod["imagePullSecrets"] == [{"name": "regcred"}]
    env = {n: {e["name"]: e["value"] for e in c.get("env", [])} for n, c in _containers(objs).items()}
    assert env["installer"]["PREFIX"] == env["decider"]["PREFIX"] == "/home/kubernetes/bin/oci-device-hook"
    assert _containers(objs)["decider"]["resources"] == {  # merged over the chart's, as Helm merges
        "requests": {"cpu": "50m", "memory": "48Mi"}, "limits": {"memory": "256Mi"}}  # fmt: skip
    job = objs["Job/oci-device-hook-teardown"]["spec"]["template"]["spec"]
    assert job["imagePullSecrets"] == [{"name": "regcred"}]


def test_metrics_modes() -> None:
    """serve: a port and only the log directory; textfile: node_exporter's directory too, no port;
    off: no metrics container. The log directory is the settings' log_file's."""
    served = _containers(objects())["metrics"]
    assert served["ports"] == [{"name": "metrics", "containerPort": 9402, "protocol": "TCP"}]
    assert {e["name"]: e["value"] for e in served["env"]}["METRICS_LISTEN"] == ":9402"
    objs = objects({"metrics": {"mode": "textfile"}, "logDir": "/var/log/odh"})
    kept = _containers(objs)["metrics"]
    assert "ports" not in kept and {e["name"]: e["value"] for e in kept["env"]}["METRICS_LISTEN"] == ""
    volumes = {v["name"]: v for v in _pod(objs)["volumes"]}
    mounted = {m["name"]: m["mountPath"] for m in kept["volumeMounts"]}
    assert mounted["node-log"] == "/var/log/odh" == volumes["node-log"]["hostPath"]["path"]
    assert mounted["textfile"] == volumes["textfile"]["hostPath"]["path"]
    settings = yaml.safe_load(objs["ConfigMap/oci-device-hook-settings"]["data"]["config.yaml"])
    assert settings["log_file"] == "/var/log/odh/oci-device-hook.log"
    assert "metrics" not in _containers(objects({"metrics": {"mode": "off"}}))
    with pytest.raises(TemplateError, match=r"metrics\.mode"):
        objects({"metrics": {"mode": "both"}})
    with pytest.raises(TemplateError, match="logDir"):
        objects({"settings": {"log_file": "/var/log/x.log"}})


def _alert_table() -> list[tuple[str, str]]:
    text = (REPO / "docs/operators/observe.md").read_text().split("**What to alert on.**", 1)[1]
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    return [(r.split(" | ")[0].strip("| "), r.split(" | ")[1].strip("`")) for r in rows]


def test_the_prometheus_rule_is_the_operators_alert_table() -> None:
    table = _alert_table()
    assert len(table) >= 7
    for mode in ("serve", "textfile"):
        objs = objects({"metrics": {"mode": mode, "prometheusRule": {"enabled": True, "labels": {"r": "x"}}}})
        rule = objs["PrometheusRule/oci-device-hook"]
        assert rule["metadata"]["labels"]["r"] == "x"
        rules = {(r["labels"]["severity"], r["expr"]) for r in rule["spec"]["groups"][0]["rules"]}
        textfile = {row for row in table if "node_textfile_mtime_seconds" in row[1]}
        assert set(table) - textfile <= rules
        assert (textfile <= rules) is (mode == "textfile")
    assert "PrometheusRule/oci-device-hook" not in objects()  # the CRD may be absent: off by default


def test_the_pod_monitor_scrapes_the_metrics_port() -> None:
    assert "PodMonitor/oci-device-hook" not in objects()
    objs = objects({"metrics": {"podMonitor": {"enabled": True, "labels": {"release": "kps"}}}})
    pm = objs["PodMonitor/oci-device-hook"]
    assert pm["metadata"]["labels"]["release"] == "kps"
    labels = objs["DaemonSet/oci-device-hook"]["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    textfile = objects({"metrics": {"mode": "textfile", "podMonitor": {"enabled": True}}})
    assert "PodMonitor/oci-device-hook" not in textfile


def test_helm_uninstall_runs_a_pre_delete_teardown_with_least_privilege() -> None:
    """Issue 37 item 4: a plain delete left every node registered. The pre-delete Job arms the
    DaemonSet's preStop (installer teardown); its Role reaches that one DaemonSet only."""
    objs = objects()
    hooks = {k: v for k, v in objs.items() if "helm.sh/hook" in v["metadata"].get("annotations", {})}
    kinds = ("ServiceAccount", "Role", "RoleBinding", "Job")
    assert set(hooks) == {f"{k}/oci-device-hook-teardown" for k in kinds}
    for obj in hooks.values():
        assert obj["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    weights = {k.split("/")[0]: int(v["metadata"]["annotations"]["helm.sh/hook-weight"])
               for k, v in hooks.items()}  # fmt: skip
    assert weights["Job"] > max(weights["Role"], weights["RoleBinding"], weights["ServiceAccount"])
    ds_rule, pod_rule = objs["Role/oci-device-hook-teardown"]["rules"]
    assert ds_rule == {"apiGroups": ["apps"], "resources": ["daemonsets"],
                       "resourceNames": ["oci-device-hook"], "verbs": ["get", "patch"]}  # fmt: skip
    assert pod_rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    job = objs["Job/oci-device-hook-teardown"]["spec"]["template"]["spec"]
    (c,) = job["containers"]
    assert c["command"][1:] == ["teardown", "--daemonset", "gpu-guard/oci-device-hook", "--timeout", "600"]
    assert c["command"][0].endswith("/usr/libexec/oci-device-hook/installer")
    assert c["securityContext"]["runAsNonRoot"] is True and "privileged" not in c["securityContext"]
    assert job["serviceAccountName"] == "oci-device-hook-teardown"
    assert not any("hostPath" in v for v in job.get("volumes", []))
    assert not [k for k in objects({"uninstallOnDelete": False}) if k.endswith("-teardown")]


def test_chart_metadata_holds_no_version_of_its_own() -> None:
    """The version is written once (docs/release.md): packaging/release fills it in."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "oci-device-hook"
    assert re.fullmatch(r"0\.0\.0-source", meta["version"]) and meta["appVersion"] == "source"


def test_the_kustomize_teardown_job_is_the_charts_hook(tmp_path: Path) -> None:
    """Issue 37 item 4 without Helm: packaging/kubernetes/teardown holds the same Job and Role as the
    chart's pre-delete hook; an overlay moves its namespace and image like the base's, and the Job
    finds the DaemonSet in its own namespace (POD_NAMESPACE)."""
    import os
    import shutil
    import subprocess

    ours = {f"{d['kind']}/{d['metadata']['name']}": d
            for d in yaml.safe_load_all((BASE / "teardown/teardown.yaml").read_text())}  # fmt: skip
    chart = {k: v for k, v in objects().items() if k.endswith("-teardown")}
    assert set(ours) == set(chart)
    assert ours["Role/oci-device-hook-teardown"]["rules"] == chart["Role/oci-device-hook-teardown"]["rules"]
    job, hook = (d["Job/oci-device-hook-teardown"]["spec"]["template"]["spec"]["containers"][0]
                 for d in (ours, chart))  # fmt: skip
    assert job["command"][:3] == hook["command"][:3] and job["securityContext"] == hook["securityContext"]
    assert job["command"][3] == "oci-device-hook"  # namespace from POD_NAMESPACE
    field = {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert job["env"] == [{"name": "POD_NAMESPACE", "valueFrom": field}]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return
    overlay = tmp_path / "o"
    overlay.mkdir()
    image = {"name": "oci-device-hook", "newName": "reg.example/odh", "digest": DIGEST}
    here = os.path.relpath(BASE / "teardown", overlay)
    kust = {"resources": [here], "namespace": "gpu-guard", "images": [image]}
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    res = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    docs = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(res.stdout)}
    assert {d["metadata"]["namespace"] for d in docs.values()} == {"gpu-guard"}
    assert docs["RoleBinding/oci-device-hook-teardown"]["subjects"][0]["namespace"] == "gpu-guard"
    (c,) = docs["Job/oci-device-hook-teardown"]["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"reg.example/odh@{DIGEST}"
