"""The reference projects' table tests, restated as data (``data/*.yaml``), run through the hook's CLI."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import NODE_INVENTORY, config, null_mount, settings_file, write_bundle
from tests.conformance.runner import INTERFACE, SOURCES, expected, hook, hook_json, rows, tables
from tests.hosttree import make_host_tree

VERSIONS = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"]


def test_every_row_names_its_source_and_differences_are_documented() -> None:
    doc = INTERFACE.read_text()
    seen: set[str] = set()
    for table, items in tables().items():
        for row in items:
            src = row["source"]
            assert src["repo"] in SOURCES and src["file"] and src["test"], (table, row["id"])
            assert row["id"] not in seen, row["id"]
            seen.add(row["id"])
            if "difference" in row:
                assert f"`{row['id']}`" in doc, f"{row['id']} is a difference but docs/interface.md omits it"


# ---- CDI: spec files -------------------------------------------------------------------------


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)


@pytest.mark.parametrize("row", rows("spec"))
def test_spec(row: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    specs = tmp_path / "specs"
    name = f"spec.{row.get('ext', 'yaml')}"
    _write(specs, {name: row["spec"]})
    rc, out, err = hook(["cdi", "validate", str(specs / name)], capsys)
    assert (rc == 0) is expected(row, "valid"), out + err
    if "devices" in row:
        rc, data, err = hook_json(["cdi", "list", "--cdi-spec-dir", str(specs)], capsys)
        assert rc == 0, err
        assert sorted(d["name"] for d in data["devices"]) == sorted(expected(row, "devices"))
    for device, env in (row.get("env") or {}).items():
        rc, data, err = hook_json(["cdi", "resolve", device, "--cdi-spec-dir", str(specs)], capsys)
        assert rc == 0, err
        assert data["containerEdits"].get("env", []) == env


def _version_spec(fragment: dict[str, Any], version: str) -> str:
    spec: dict[str, Any] = {"cdiVersion": version, "kind": "vendor.com/device",
                            "devices": [{"name": "dev", "containerEdits": {"env": ["A=1"]}}]}
    for key, value in fragment.items():
        if key == "device":
            spec["devices"] = [{"containerEdits": {"env": ["A=1"]}, **value}]
        else:
            spec[key] = value
    return json.dumps(spec)


@pytest.mark.parametrize("row", rows("min-version"))
def test_minimum_required_version(row: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    """MinimumRequiredVersion as the outside sees it: valid at that version, refused just below it."""
    need = row["min_version"]
    at = tmp_path / "at.json"
    at.write_text(_version_spec(row["fragment"], need))
    rc, out, err = hook(["cdi", "validate", str(at)], capsys)
    assert rc == 0, out + err
    below = VERSIONS.index(need) - 1
    if below >= 0:
        under = tmp_path / "under.json"
        under.write_text(_version_spec(row["fragment"], VERSIONS[below]))
        rc, out, err = hook(["cdi", "validate", str(under)], capsys)
        assert rc == 1 and "min-version" in out, out + err


# ---- CDI: the cache over two spec dirs ---------------------------------------------------------


@pytest.mark.parametrize("row", rows("cache"))
def test_cache(row: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    etc, run_dir = tmp_path / "etc", tmp_path / "run"
    _write(etc, row.get("etc") or {})
    _write(run_dir, row.get("run") or {})
    rc, data, err = hook_json(["cdi", "list", "--cdi-spec-dir", str(etc), "--cdi-spec-dir", str(run_dir)],
                              capsys)
    assert rc == (1 if expected(row, "errors") else 0), err  # a broken spec fails the list (issue 29)
    got = {d["name"]: str(Path(d["spec"]).relative_to(tmp_path)) for d in data["devices"]}
    assert got == expected(row, "devices")
    errors = sorted(str(Path(p).relative_to(tmp_path)) for p in data["errors"])
    assert errors == sorted(expected(row, "errors"))
    for name in row.get("unresolvable", []):
        rc, _out, err = hook(["cdi", "resolve", name, "--cdi-spec-dir", str(etc), "--cdi-spec-dir",
                              str(run_dir)], capsys)
        assert rc == 1 and "unresolvable" in err, err


# ---- CDI: qualified names and annotations ---------------------------------------------------------


def _spec_for(names: list[str]) -> dict[str, str]:
    """One env-only spec per kind, defining each named device."""
    by_kind: dict[str, list[str]] = {}
    for name in names:
        kind, _, dev = name.partition("=")
        by_kind.setdefault(kind, []).append(dev)
    return {f"s{i}.json": json.dumps({"cdiVersion": "0.6.0", "kind": kind, "devices": [
        {"name": d, "containerEdits": {"env": [f"DEV_{j}=1"]}} for j, d in enumerate(devs)]})
        for i, (kind, devs) in enumerate(sorted(by_kind.items()))}


def _simulate(tmp_path: Path, cfg: dict[str, Any], capsys: Any, *extra: str,
              inventory: bool = True) -> tuple[int, Any, str]:
    bundle = write_bundle(tmp_path / "bundle", cfg)
    args = ["--bundle", str(bundle), *(["--inventory", str(NODE_INVENTORY)] if inventory else []), *extra]
    if "--cdi-spec-dir" not in extra:
        args += ["--cdi-spec-dir", str(tmp_path / "no-specs")]
        (tmp_path / "no-specs").mkdir(exist_ok=True)
    return hook_json(args, capsys)


@pytest.mark.parametrize("row", rows("qualified-name"))
def test_qualified_name(row: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    """A name in a CDI annotation: a valid one is looked up (and missing), an invalid one refused as such."""
    cfg = config([], annotations={"cdi.k8s.io/conformance": row["name"]})
    rc, _report, err = _simulate(tmp_path, cfg, capsys)
    assert rc == 1, err
    looked_up = "unresolvable CDI devices" in err
    assert looked_up is expected(row, "valid"), err


@pytest.mark.parametrize("row", rows("annotations"))
def test_annotations(row: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    specs = tmp_path / "specs"
    _write(specs, _spec_for(row.get("devices", [])))
    cfg = config([], annotations=row["annotations"])
    rc, report, err = _simulate(tmp_path, cfg, capsys, "--cdi-spec-dir", str(specs))
    if not expected(row, "valid"):
        assert rc == 1 and "annotations" in err, err
        return
    assert rc == 0, err
    got = sorted(r["value"] for r in report["requests"] if r["source"].startswith("annotation:"))
    assert got == sorted(row["devices"])


# ---- CDI: edits applied to a config (--output-config) ------------------------------------------------


def _pick(config_json: dict[str, Any], base: dict[str, Any], field: str) -> Any:
    """One part of the output config, minus what the base config already had."""
    if field == "env":
        before = set(base["process"].get("env", []))
        return [e for e in config_json["process"].get("env", []) if e not in before]
    if field == "devices":
        keep = ("path", "type", "major", "minor", "uid", "gid")
        return [{k: d[k] for k in keep if k in d} for d in config_json["linux"].get("devices", [])]
    if field == "cgroup":
        n = len(base["linux"]["resources"].get("devices", []))
        return config_json["linux"]["resources"]["devices"][n:]
    if field == "mounts":
        before = {json.dumps(m, sort_keys=True) for m in base.get("mounts", [])}
        return [m for m in config_json.get("mounts", []) if json.dumps(m, sort_keys=True) not in before]
    if field == "hooks":
        return config_json.get("hooks", {})
    if field == "additionalGids":
        return config_json["process"]["user"].get("additionalGids", [])
    if field == "fileModes":
        return [d.get("fileMode") for d in config_json["linux"].get("devices", [])]
    raise AssertionError(field)


@pytest.mark.parametrize("row", rows("edits"))
def test_edits(row: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    specs = tmp_path / "specs"
    spec = {"cdiVersion": "1.1.0", "kind": "vendor.com/device",
            "devices": [{"name": "dev", "containerEdits": row["edits"]}]}
    _write(specs, {"spec.json": json.dumps(spec)})
    cfg = config([], annotations={"cdi.k8s.io/conformance": "vendor.com/device=dev"})
    cfg["linux"]["devices"] = list(row.get("config_devices") or [])  # nodes the engine already wrote
    cfg["linux"]["resources"]["devices"] = []
    if row.get("user_namespace"):
        cfg["linux"]["namespaces"].append({"type": "user"})
    for key, value in (row.get("process") or {}).items():
        cfg["process"][key] = value
    out = tmp_path / "out.json"
    rc, _report, err = _simulate(tmp_path, cfg, capsys, "--cdi-spec-dir", str(specs), "--driver-root", "/",
                                 "--output-config", str(out))
    if expected(row, "result") == "refused":
        assert rc == 1, err
        return
    assert rc == 0, err
    result = json.loads(out.read_text())
    for field, want in expected(row, "result").items():
        assert _pick(result, cfg, field) == want, field


# ---- NVIDIA: env, mounts, privilege -----------------------------------------------------------------


def _host(root: Path, row: dict[str, Any]) -> Path:
    """A fake driver root (tests/hosttree.py) plus the row's DRM entries, laid out as the kernel does:
    ``sys/class/drm/<name>/dev`` (its numbers) and ``device`` (a link naming the PCI address, whose
    ``vendor`` is NVIDIA's), and the /dev/dri nodes."""
    make_host_tree(root, row["host"])
    for bus, names in (row.get("drm") or {}).items():
        pci = root / "sys/devices/pci0000:00" / bus
        pci.mkdir(parents=True, exist_ok=True)
        (pci / "vendor").write_text("0x10de\n")
        (root / "dev/dri").mkdir(parents=True, exist_ok=True)
        for name in names:
            minor = int(re.sub(r"\D", "", name))
            entry = root / "sys/class/drm" / name
            entry.mkdir(parents=True)
            (entry / "dev").write_text(f"226:{minor}\n")
            (entry / "device").symlink_to(f"../../../devices/pci0000:00/{bus}")
            os.mknod(root / "dev/dri" / name, stat.S_IFCHR | 0o666, os.makedev(226, minor))
    return root


def _nvidia_requests(report: dict[str, Any]) -> list[str]:
    return sorted(f"{r['kind']}:{r['value']}" for r in report["requests"]
                  if r["source"].startswith(("env:", "mount:", "annotation:")))


@pytest.mark.parametrize("row", rows("nvidia"))
def test_nvidia(row: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    env = [f"{k}={v}" for k, v in (row.get("env") or {}).items()]
    mounts = [null_mount(d) for d in row.get("mounts", [])]
    mounts += [{**m, "type": "bind", "options": ["bind", "ro"]} for m in row.get("raw_mounts", [])]
    caps = None
    if row.get("sys_admin"):
        from tests.bundles import POD_CAPS

        caps = sorted([*POD_CAPS, "CAP_SYS_ADMIN"])
    cfg = config(env, privileged=row.get("privileged", False), mounts=mounts, caps=caps)
    if row.get("annotations"):
        cfg["annotations"] = row["annotations"]
    extra = ["--config", str(settings_file(tmp_path, **row.get("settings", {})))]
    if row.get("host"):
        extra += ["--driver-root", str(_host(tmp_path / "root", row))]
    rc, report, err = _simulate(tmp_path, cfg, capsys, *extra, inventory=not row.get("host"))
    want = expected(row, "expect")
    if want == "refused":
        assert rc in (1, 3), err
        return
    assert rc == 0, err
    assert _nvidia_requests(report) == sorted(want["requests"])
    created = {n["path"] for n in report["nodes"]["create"]}
    if "gpus" in want:
        assert sorted(p for p in created if re.fullmatch(r"/dev/nvidia[0-9]+", p)) == [
            f"/dev/nvidia{i}" for i in want["gpus"]]
    for node, present in (want.get("nodes") or {}).items():
        assert (node in created) is present, (node, sorted(created))
