"""Issue 28 item 6: the bundled interpreter's loader never acts on the engine's loader variables.

The launcher starts the bundled Python as ``<python>/lib/ld-linux… --library-path <python>/lib
<python>/bin/python3``; glibc's loader reads ``LD_PRELOAD``, ``LD_AUDIT``, ``LD_TRACE_LOADED_OBJECTS``
(list the libraries and exit 0: a hook that decides nothing and says yes) and the rest from the
environment even then. The engine's environment reaches the hook (runc runs a hooks.d hook with
its own environment when the hook names none; containerd runs the wrapper with its own). The
launcher moves them aside; the runtime wrapper hands them back to the real runtime it execs.

The launcher runs under busybox's static ``sh`` here, so the only dynamic loader in play is the
bundle's: what the node's ``/bin/sh`` does with these variables is the node's loader's business.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.bundles import PRIVATE_RUN, config
from tests.test_install import PKG, make_tree

BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), "")
LIBEXEC = "usr/libexec/oci-device-hook"
LOADER_VARS = {
    "LD_PRELOAD": "/nonexistent/preload-probe.so",
    "LD_AUDIT": "/nonexistent/audit-probe.so",
}


@pytest.fixture(scope="module")
def libexec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package tree whose ``hook`` is the bundled launcher, written as the installer writes it."""
    assert BUSYBOX, "busybox-static is installed where the suite runs (apt-get install busybox-static)"
    here = make_tree(tmp_path_factory.mktemp("tree")) / LIBEXEC
    python = here / "python"
    loader = next(p.name for p in (python / "lib").glob("ld-*.so*"))
    text = (PKG / "launcher.sh.in").read_text()
    for key, value in {"@PYTHON@": str(python), "@LOADER@": loader, "@DIR@": str(here)}.items():
        text = text.replace(key, value)
    (here / "hook").write_text(text)
    (here / "hook").chmod(0o755)
    return here


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run(argv, env={**base, **env}, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_bundled_loader_takes_no_preload_or_audit_library(libexec: Path) -> None:
    res = run([BUSYBOX, "sh", str(libexec / "hook"), "--version"], LOADER_VARS)
    assert res.returncode == 0 and res.stdout.startswith("hook (oci-device-hook) "), res.stderr
    assert "ld.so" not in res.stderr and "probe.so" not in res.stderr, res.stderr


def test_a_traced_load_does_not_turn_the_hook_into_exit_0(libexec: Path) -> None:
    """``LD_TRACE_LOADED_OBJECTS`` would make the loader list libraries and exit 0 without running
    the hook: a prestart hook that says yes to every container without deciding."""
    res = run([BUSYBOX, "sh", str(libexec / "hook"), "--version"], {"LD_TRACE_LOADED_OBJECTS": "1"})
    assert res.returncode == 0 and res.stdout.startswith("hook (oci-device-hook) "), res.stdout
    assert "=>" not in res.stdout


def test_the_real_runtime_gets_the_engines_loader_variables_back(libexec: Path, tmp_path: Path) -> None:
    """Through the wrapper (packaging/runtime → the bundled hook → exec): the runtime's environment
    is the engine's, loader variables included, and none of the hook's stash names."""
    seen = tmp_path / "runtime-env.json"
    fake = tmp_path / "fake-runc"
    fake.write_text(f'#!{BUSYBOX} sh\nexec {BUSYBOX} env > {seen}\n')
    fake.chmod(0o755)
    settings = tmp_path / "config.yaml"
    logs = f"log_file: {tmp_path / 'hook.log'}\ncache_dir: {tmp_path / 'cache'}\n"
    settings.write_text(f"runtime: {fake}\n{logs}")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(config([])))
    shutil.copy2(PKG / "runtime", libexec / "runtime")
    env = {**LOADER_VARS, "GLIBC_TUNABLES": "glibc.malloc.check=0", "OCI_DEVICE_HOOK_CONFIG": str(settings)}
    argv = [BUSYBOX, "sh", str(libexec / "runtime"), "create", "--bundle", str(bundle), "c1"]
    res = run([*PRIVATE_RUN, *argv], env)
    assert res.returncode == 0, res.stderr
    got = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    for name, value in {**LOADER_VARS, "GLIBC_TUNABLES": "glibc.malloc.check=0"}.items():
        assert got.get(name) == value, (name, got)
    assert not [n for n in got if n.startswith("OCI_DEVICE_HOOK_LOADER_")], got
