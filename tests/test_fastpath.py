"""The live fast path: a no-device container is answered by hook.entry and hook.routes.fastpath alone (no
click, yaml, pynvml, no decision modules); anything that needs a decision takes the full path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hook.entry
import hook.routes.fastpath
from hook.routes.fastpath import needs_decision
from tests.bundles import PRIVATE_RUN, config, gen, state, write_bundle

# The modules a container that asks for nothing loads: the entry, the fast path, its os-only reads.
FAST_PATH_MODULES = [
    "hook", "hook.entry", "hook.routes", "hook.routes.fastpath", "hook.sources", "hook.sources.privatefile",
]  # fmt: skip

# The log is stubbed (as module hook.adapters.log) so a slow-path run writes nothing outside tmp.
PROBE = """
import sys, types
calls = []
stub = types.ModuleType("hook.adapters.log")
stub.write_log = lambda record, path, max_bytes=0: calls.append(record["verdict"])
sys.modules["hook.adapters.log"] = stub
sys.argv = ["hook"]
import os
import hook.entry
from hook.entry import main
import hook.routes.fastpath
hook.routes.fastpath.DEFAULT_SETTINGS = os.environ.get(
    "ODH_PROBE_SETTINGS", hook.routes.fastpath.DEFAULT_SETTINGS
)
rc = main()
top = ("click", "yaml", "pynvml", "hook")
mods = sorted(m for m in sys.modules if m.split(".")[0] in top and m != "hook.adapters.log")
print(mods)
print(calls)
print(rc)
"""


def probe(
    stdin: bytes, settings: str = "/nonexistent/oci-device-hook.yaml"
) -> tuple[list[str], list[str], int]:
    """Run ``main()`` as the live hook; the fast path reads ``settings`` (default: none, whatever this
    host has in /etc), and /run is private (the slow path may compile a fast-path cache there)."""
    res = subprocess.run(
        [*PRIVATE_RUN, sys.executable, "-I", "-c", PROBE],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "ODH_PROBE_SETTINGS": settings},
    )
    assert res.stderr == b"", res.stderr
    mods, calls, rc = res.stdout.decode().splitlines()
    return json.loads(mods.replace("'", '"')), json.loads(calls.replace("'", '"')), int(rc)


def test_no_device_container_loads_only_the_entry(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b", config(["LANG=C"], devices=[gen.node("/dev/fuse", 10, 229)]))
    mods, calls, rc = probe(state(bundle, pid=4242))
    assert (mods, calls, rc) == (FAST_PATH_MODULES, [], 0)


def test_decision_needed_takes_the_slow_path(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b", gen.bundles()["privileged-no-allocation"])
    mods, calls, rc = probe(state(bundle))
    assert rc == 0
    assert calls == ["none"]
    assert {"hook.core.decide", "hook.routes.gather", "hook.routes.live", "hook.core.oci"} <= set(mods)
    assert not any(m.split(".")[0] in ("click", "pynvml") for m in mods)


def test_real_hook_fast_path_exit_0(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b", config())
    res = subprocess.run(["hook"], input=state(bundle), capture_output=True, timeout=60, check=False)
    assert (res.returncode, res.stdout, res.stderr) == (0, b"", b"")


def _c(**kw: object) -> dict[str, object]:
    return config(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cfg", "annotations", "needed"),
    [
        pytest.param(_c(), {}, False, id="cpu"),
        pytest.param(_c(env=["NVIDIA_VISIBLE_DEVICES=void"]), {}, False, id="env-void"),
        pytest.param(_c(env=["NVIDIA_VISIBLE_DEVICES="]), {}, False, id="env-empty"),
        pytest.param(_c(env=["NVIDIA_VISIBLE_DEVICES=none"]), {}, True, id="env-none"),
        pytest.param(_c(env=["NVIDIA_VISIBLE_DEVICES=0"]), {}, True, id="env-index"),
        pytest.param(_c(env=["NVIDIA_MIG_MONITOR_DEVICES=all"]), {}, True, id="mig-env"),
        pytest.param(_c(env=["NVIDIA_IMEX_CHANNELS=0"]), {}, True, id="imex-env"),
        pytest.param(_c(env=["CUDA_VERSION=12.4"]), {}, True, id="legacy-cuda-image"),
        pytest.param(_c(env=["CUDA_VERSION=1", "NVIDIA_REQUIRE_CUDA=cuda>=1"]), {}, False, id="modern-cuda"),
        pytest.param(_c(env=["CUDA_VERSION=1", "NVIDIA_VISIBLE_DEVICES="]), {}, False, id="legacy-cuda-void"),
        pytest.param(_c(privileged=True), {}, True, id="privileged-allow-all"),
        pytest.param(
            _c(devices=[gen.node("/dev/null", 1, 3), gen.node("/dev/fuse", 10, 229)]),
            {},
            False,
            id="plain-nodes",
        ),
        pytest.param(_c(devices=[gen.node("/dev/nvidia0", 195, 0)]), {}, True, id="gpu-node"),
        pytest.param(_c(), {"cdi.k8s.io/x": "nvidia.com/gpu=0"}, True, id="state-cdi-annotation"),
        pytest.param(_c(annotations={"cdi.k8s.io/x": "a/b=c"}), {}, True, id="config-cdi-annotation"),
        pytest.param(
            _c(mounts=[{"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null"}]),
            {},
            True,
            id="volume-mount",
        ),
    ],
)
def test_needs_decision(cfg: dict[str, object], annotations: dict[str, str], needed: bool) -> None:
    assert needs_decision(cfg, annotations) is needed


def test_state_over_1_mib_takes_the_full_path(tmp_path: Path) -> None:
    """The fast path reads at most 1 MiB of state; a larger one (valid JSON, padded) is the full
    path's to judge, which reports it with the file and the field."""
    bundle = write_bundle(tmp_path / "b", config())
    opts = {"--config": [str(tmp_path / "absent.yaml")]}
    small = state(bundle)
    at_limit = small + b" " * ((1 << 20) - len(small))
    assert hook.routes.fastpath.fast_path(opts, small)
    assert hook.routes.fastpath.fast_path(opts, at_limit)
    assert not hook.routes.fastpath.fast_path(opts, at_limit + b" ")


def test_config_without_its_value_is_the_clis_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert hook.entry._split(["--config"]) is None
    assert hook.entry.main(["--config"]) == 2
    assert "Option '--config' requires an argument" in capsys.readouterr().err


def test_python_m_hook_entry_runs_the_hook() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "hook.entry", "--version"], capture_output=True, timeout=60, check=False
    )
    assert (res.returncode, res.stderr) == (0, b"")
    assert res.stdout.startswith(b"hook (oci-device-hook) ")


def test_two_stage_words_are_the_clis_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24 (fresh mutant s530669-052, ``len(positional) > 2``): ``hook prestart poststop`` is
    not a live run of either stage: the CLI's usage error, before stdin is read."""
    assert hook.entry._split(["prestart"]) == ({}, ["prestart"])
    assert hook.entry._split(["prestart", "poststop"]) is None
    assert hook.entry.main(["prestart", "poststop"]) == 2
    assert "Usage: hook" in capsys.readouterr().err


def test_an_internal_error_of_the_full_path_is_one_escaped_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24 (fresh mutant s530669-058: the line dropped, so the runtime saw exit 1 and no
    reason): an unexpected exception on the full path is one line naming its type, escaped."""
    import hook.routes.offer

    def boom(stage: str, opts: object, look: object) -> int:
        raise RuntimeError("bad \x1b[2J value\nsecond line")

    monkeypatch.setattr(hook.entry, "read_limited", lambda fd, limit: b"{}")
    monkeypatch.setattr(hook.routes.offer, "live_level", boom)
    assert hook.entry.main(["prestart"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("oci-device-hook: internal error: RuntimeError: bad ")
    assert err.count("\n") == 1 and "\x1b" not in err


@pytest.mark.parametrize("stdin", [b"{oops", b'{"linux": {"resources": {"devices": 5}}}', b"\xff"])
def test_precreate_fast_path_never_passes_on_a_config_it_cannot_read(stdin: bytes, tmp_path: Path) -> None:
    """Issue 24 (fresh mutant s530669-070, ``return True`` on a decode error): ``hook precreate``
    may only pass a config on untouched when it read it; anything else goes to the full path,
    which names the file and field."""
    opts = {"--config": [str(tmp_path / "absent.yaml")]}
    assert hook.routes.fastpath.precreate_fast(opts, b'{"ociVersion": "1.0.2"}') is True  # the control
    assert hook.routes.fastpath.precreate_fast(opts, stdin) is False


@pytest.mark.parametrize(
    ("path", "kind", "major", "minor"),
    [
        *[(p, "c", 195, 0) for p in sorted(hook.routes.fastpath.PLAIN_DEVICES)],  # GPU 0 under a plain name
        ("/dev/null", "c", 195, 255),  # nvidiactl
        ("/dev/null", "c", 1, 5),  # /dev/zero's numbers: another plain node's, not this name's
        ("/dev/null", "b", 1, 3),  # a block device (ramdisk 3)
    ],
)
def test_a_plain_name_counts_as_plain_only_with_its_own_numbers(
    path: str, kind: str, major: int, minor: int
) -> None:
    """Issue 31: the kernel opens a node by its type and numbers, never by its name, so the fast
    path calls a ``linux.devices`` entry plain only when it carries that name's own numbers
    (``/dev/null`` made as ``c 195:0`` is GPU 0).

    Why this is pinned although no decision differs today: runc and crun let a container open a
    node only through ``linux.resources.devices`` and their fixed defaults (all plain numbers), and
    every allow rule that reaches another number already needs a decision here, so a GPU under a
    plain name with no such rule is unreachable and the full decision changes nothing for it. The
    node check is what keeps the fast path a superset of the full decision by itself, without
    leaning on the rule scan (a runtime or engine that allows each ``linux.devices`` node
    implicitly would otherwise start such a container undecided)."""
    node = {**gen.node(path, major, minor), "type": kind}
    assert needs_decision(_c(devices=[node]), {}) is True
    plain = gen.node(path, *KERNEL_NUMBERS[path])
    assert needs_decision(_c(devices=[plain]), {}) is False  # the control: its own numbers are plain


# The numbers the kernel gives the nodes engines add to every container (Documentation/admin-guide/
# devices.txt), written out here rather than read from the fast path's own table.
KERNEL_NUMBERS = {
    "/dev/null": (1, 3), "/dev/zero": (1, 5), "/dev/full": (1, 7), "/dev/random": (1, 8),
    "/dev/urandom": (1, 9), "/dev/tty": (5, 0), "/dev/console": (5, 1), "/dev/ptmx": (5, 2),
    "/dev/fuse": (10, 229), "/dev/net/tun": (10, 200), "/dev/kvm": (10, 232),
}  # fmt: skip


def test_the_nodes_engines_add_with_their_kernel_numbers_need_no_decision() -> None:
    """Issue 31 (s142737-049): a container that asks for nothing starts on the fast path, so each
    node an engine adds, carrying the numbers the kernel gives it, must count as plain (a wrong
    number in the table sends every container with a console to the full path)."""
    assert set(KERNEL_NUMBERS) == set(hook.routes.fastpath.PLAIN_DEVICES)
    for path, (major, minor) in KERNEL_NUMBERS.items():
        assert needs_decision(_c(devices=[gen.node(path, major, minor)]), {}) is False, path
