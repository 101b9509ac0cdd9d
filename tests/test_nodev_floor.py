"""A no-device container's start, pinned against its floor: the modules the launcher loads beyond
a bare ``python3 -ISB -c pass`` (issue 35: no-device container, every route, <= 1.05x its floor).

The floor never imports ``os``; the fast path does without it (``posix``, built in and loaded
already) and without ``__future__``. Here the launcher (``packaging/launcher`` as the bench and the
package run it: ``python3 -ISB``, ``lib/`` beside it) answers a plain container under custom
settings, so the sealed fast-path record and the node key are read, on prestart, hooks.d
precreate and the runtime wrapper (which then execs the runtime it fronts), inside ``unshare -m``
with tmpfs over /run, /var/log and the key directory. The modules come from ``-X importtime``
(every import the interpreter makes, the launcher's own included), minus the floor's. Counted,
not timed. The wrapper's runtime must still get its arguments and none of the hook's variables
(it is now started with ``execve`` and ``posix.environ``, not ``os.execvp``).

Also here: the fast path's path helpers are ``posixpath``'s, string for string, since a settings
file's record is keyed by ``os.path.abspath`` on the writer's side and ``_container_path`` must
read a mount destination as ``hook.core.kpath`` does.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import bundles
from hook.core.kpath import container_path
from hook.routes.fastpath import _container_path
from hook.sources.privatefile import abspath, normpath

PYTHON = "/usr/bin/python3"  # packaging/launcher's interpreter

# What a plain container's start loads beyond the floor: the hook's fast path, the JSON scanner,
# the record's MAC (_blake2, _operator's compare_digest) and the version the record names.
NODEV_EXTRA = {
    "hook", "hook.entry", "hook.routes", "hook.routes.fastpath", "hook.sources", "hook.sources.privatefile",
    "hook.sources.nodekey", "hook.core", "hook.core.version", "_json", "_blake2", "_operator",
}  # fmt: skip
# The runtime wrapper also reads the command line as runc and crun do (hook.routes.runtimeargs).
WRAPPER_EXTRA = NODEV_EXTRA | {
    "hook.routes.wrapper", "hook.routes.runtimeargs", "hook.routes.runtimeargs.crun",
    "hook.routes.runtimeargs.readings", "hook.routes.runtimeargs.runc", "hook.routes.runtimeargs.values",
    "hook.core.record", "__future__",
}  # fmt: skip


def _imported(stderr: str) -> list[str]:
    return [
        line.split("|")[-1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and not line.rstrip().endswith("imported package")
    ]


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path(PYTHON).exists() or shutil.which("unshare") is None,
    reason="needs root, unshare and /usr/bin/python3",
)
def test_a_plain_containers_start_loads_only_the_fast_path_beyond_the_floor(tmp_path: Path) -> None:
    launcher = bundles.build_launcher(tmp_path / "libexec", PYTHON)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    bundle = bundles.write_bundle(tmp_path / "bundle", bundles.nodev_config(rootfs, "/odh-test/nodev"))
    (tmp_path / "state.json").write_bytes(bundles.state_for(bundle, "odh-test-nodev"))
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"log_file: {tmp_path / 'hook.log'}\ncache_dir: {tmp_path / 'cache'}\n")
    state, config = tmp_path / "state.json", bundle / "config.json"
    fake = tmp_path / "runtime"  # what the wrapper fronts: says what it saw of the hook's variables
    saw = "$OCI_DEVICE_HOOK_RUNTIME.$OCI_DEVICE_HOOK_RUNTIME_EXEC.$*"
    fake.write_text(f'#!/bin/sh\necho "{saw}" > {tmp_path}/ran\n')
    fake.chmod(0o755)
    script = "\n".join([
        "set -e",
        "mount -t tmpfs -o mode=0755 tmpfs /run", "mkdir -m 0700 /run/oci-device-hook",
        "mount -t tmpfs -o mode=0755 tmpfs /var/log",
        "mkdir -p /var/lib/oci-device-hook", "mount -t tmpfs -o mode=0700 tmpfs /var/lib/oci-device-hook",
        f"{launcher} prestart --config {settings} < {state} 2>/dev/null",  # writes the record and key
        "test -s /run/oci-device-hook/fastpath.json",
        f"{PYTHON} -ISB -X importtime -c pass 2> {tmp_path}/floor.err",
        f"{PYTHON} -ISB -X importtime {launcher} prestart --config {settings} < {state} "
        f"2> {tmp_path}/pre.err",
        f"{PYTHON} -ISB -X importtime {launcher} precreate --config {settings} < {config} "
        f"> {tmp_path}/out.json "
        f"2> {tmp_path}/pc.err",
        f"OCI_DEVICE_HOOK_RUNTIME=/bin/true {PYTHON} -ISB -X importtime {launcher} runtime-wrapper "
        f"--config {settings} -- {fake} create --bundle {bundle} odh-test-nodev 2> {tmp_path}/wr.err",
    ])  # fmt: skip
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    floor = set(_imported((tmp_path / "floor.err").read_text()))
    assert "os" not in floor  # what makes dropping it worth a test
    for route, want in (("pre", NODEV_EXTRA), ("pc", NODEV_EXTRA), ("wr", WRAPPER_EXTRA)):
        loaded = _imported((tmp_path / f"{route}.err").read_text())
        assert len(loaded) == len(set(loaded))
        extra = set(loaded) - floor
        assert extra == want, (route, sorted(extra - want), sorted(want - extra))
    ran = (tmp_path / "ran").read_text()  # the runtime ran, with its arguments, the hook's variables gone
    assert ran == f"..create --bundle {bundle} odh-test-nodev\n"
    assert (tmp_path / "out.json").read_bytes() == config.read_bytes()  # passed on untouched
    assert not (tmp_path / "hook.log").exists() or not (tmp_path / "hook.log").read_text()


PATHS = st.lists(st.sampled_from(["", ".", "..", "a", "b.c", "...", " ", "x y"]), max_size=8).map("/".join)
PREFIXES = st.sampled_from(["", "/", "//", "///", "////", "./", "../"])


@given(PREFIXES, PATHS)
def test_normpath_and_abspath_are_posixpaths(prefix: str, rest: str) -> None:
    path = prefix + rest
    assert normpath(path) == posixpath.normpath(path)
    assert abspath(path) == posixpath.abspath(path)
    assert _container_path(path) == container_path(path)


@pytest.mark.parametrize(
    "path", ["", "/", "//", "///", "//a", "///a", "a/..", "../a", "a/../..", "/..", "//..", "/a/./b//c/", "."]
)
def test_normpath_edge_cases(path: str) -> None:
    assert normpath(path) == posixpath.normpath(path)
    assert abspath(path) == posixpath.abspath(path)
    assert _container_path(path) == container_path(path)
