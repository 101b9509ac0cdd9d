"""containerd base_runtime_spec: where our hook and NVIDIA's sit (pure table) and the doctor line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hook.tools import checks, doctor, doctorctd
from hook.tools.engines import StageHooks, base_spec_hooks, runs_after_nvidia

OURS = f"{checks.LIBEXEC}/hook"
# NVIDIA's entries as its toolkit writes them (nvidia-container-toolkit: the legacy runtime hook,
# the toolkit symlink, and CDI-generated `nvidia-ctk hook <name>` entries).
LEGACY = {
    "path": "/usr/bin/nvidia-container-runtime-hook",
    "args": ["nvidia-container-runtime-hook", "prestart"],
}
TOOLKIT = {"path": "/usr/bin/nvidia-container-toolkit", "args": ["nvidia-container-toolkit", "prestart"]}
CTK = {"path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", "create-symlinks"]}
CTK_OTHER = {"path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "runtime", "configure"]}
MINE = {"path": OURS, "args": ["hook", "prestart"]}
OTHER = {"path": "/usr/bin/true"}


def _spec(**stages: Any) -> dict[str, Any]:
    return {"ociVersion": "1.0.2", "hooks": stages}


TABLE: list[tuple[str, Any, dict[str, StageHooks], bool | None]] = [
    ("no hooks key", {"ociVersion": "1.0.2"}, {}, None),
    ("hooks not an object", {"hooks": []}, {}, None),
    ("only unrelated hooks", _spec(prestart=[OTHER]), {}, None),
    ("ours alone", _spec(prestart=[OTHER, MINE]), {"prestart": StageHooks((1,), ())}, None),
    ("nvidia alone", _spec(prestart=[LEGACY]), {"prestart": StageHooks((), (0,))}, None),
    ("ours after legacy", _spec(prestart=[LEGACY, OTHER, MINE]), {"prestart": StageHooks((2,), (0,))}, True),
    ("ours before legacy", _spec(prestart=[MINE, LEGACY]), {"prestart": StageHooks((0,), (1,))}, False),
    ("toolkit symlink", _spec(prestart=[MINE, TOOLKIT]), {"prestart": StageHooks((0,), (1,))}, False),
    (
        "ours between two nvidia hooks",
        _spec(prestart=[LEGACY, MINE, TOOLKIT]),
        {"prestart": StageHooks((1,), (0, 2))},
        False,
    ),
    (
        "ours in createRuntime after nvidia prestart",
        _spec(prestart=[LEGACY], createRuntime=[MINE]),
        {"prestart": StageHooks((), (0,)), "createRuntime": StageHooks((0,), ())},
        True,
    ),
    (
        "ours prestart, nvidia-ctk hook in createRuntime",
        _spec(prestart=[MINE], createRuntime=[CTK]),
        {"prestart": StageHooks((0,), ()), "createRuntime": StageHooks((), (0,))},
        False,
    ),
    (
        "nvidia-ctk without hook is not a hook",
        _spec(prestart=[MINE, CTK_OTHER]),
        {"prestart": StageHooks((0,), ())},
        None,
    ),
    (
        "later stages not judged",
        _spec(prestart=[MINE], createContainer=[CTK]),
        {"prestart": StageHooks((0,), ())},
        None,
    ),
    (
        "malformed entries keep their index",
        _spec(prestart=["x", None, LEGACY, MINE], createRuntime="nope"),
        {"prestart": StageHooks((3,), (2,))},
        True,
    ),
]


@pytest.mark.parametrize(("spec", "want", "after"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_base_spec_hooks_table(spec: Any, want: dict[str, StageHooks], after: bool | None) -> None:
    found = base_spec_hooks(spec, [OURS])
    assert found == want
    assert runs_after_nvidia(found) is after


V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "{base}"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "/usr/libexec/oci-device-hook/runtime"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.plain]
  runtime_type = "io.containerd.runc.v2"
"""
V3 = V2.replace("version = 2", "version = 3").replace(
    "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"
)


@pytest.mark.parametrize("template", [V2, V3], ids=["v2", "v3"])
def test_doctor_base_spec(tmp_path: Path, template: str) -> None:
    base = tmp_path / "cri-base.json"
    cfg = tmp_path / "config.toml"
    cfg.write_text(template.format(base=base))
    plugin = "io.containerd.grpc.v1.cri" if template is V2 else "io.containerd.cri.v1.runtime"
    field = f'plugins."{plugin}".containerd.runtimes.runc.base_runtime_spec'

    missing = doctorctd.check_base_spec(cfg)
    assert len(missing) == 1  # only the handler naming a base spec
    assert not missing[0].ok and str(base) in missing[0].detail and field in missing[0].detail

    base.write_text("{not json")
    bad = doctorctd.check_base_spec(cfg)[0]
    assert not bad.ok and "not readable JSON" in bad.detail and field in bad.detail

    base.write_text(json.dumps(_spec(prestart=[MINE, LEGACY])))
    before = doctorctd.check_base_spec(cfg)[0]
    assert not before.ok and "ours runs before NVIDIA's" in before.detail
    assert before.name == "containerd base spec (runc)" and str(base) in before.fix

    base.write_text(json.dumps(_spec(prestart=[LEGACY, MINE])))
    after = doctorctd.check_base_spec(cfg)[0]
    assert after.ok and "ours prestart #1" in after.detail and "runs after" in after.detail

    base.write_text(json.dumps(_spec(prestart=[LEGACY])))
    absent = doctorctd.check_base_spec(cfg)[0]
    assert absent.ok and "ours not registered; NVIDIA's hook present" in absent.detail


def test_doctor_base_spec_in_run(tmp_path: Path) -> None:
    """run_doctor lists the base spec line; a config without base specs adds none."""
    base = tmp_path / "cri-base.json"
    base.write_text(json.dumps(_spec(prestart=[MINE, LEGACY])))
    cfg = tmp_path / "config.toml"
    cfg.write_text(V2.format(base=base))
    out, code = doctor.run_doctor(tmp_path, [], [], tmp_path / "none.yaml", "json", containerd_config=cfg)
    names = [c["name"] for c in json.loads(out)]
    assert "containerd base spec (runc)" in names and code == 1
    cfg.write_text(V2.replace('  base_runtime_spec = "{base}"\n', ""))
    out, _ = doctor.run_doctor(tmp_path, [], [], tmp_path / "none.yaml", "json", containerd_config=cfg)
    assert not any(c["name"].startswith("containerd base spec") for c in json.loads(out))
    assert doctorctd.check_base_spec(tmp_path / "absent.toml") == []
