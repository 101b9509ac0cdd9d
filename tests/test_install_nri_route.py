"""The installer's ``--route`` on a containerd node (hook.tools.install.nriroute): the default
stays the fail-closed wrapper; the NRI route alone is registered only where containerd refuses
containers while ``hook nri`` is away (>= 2.2, ``required_plugins``), or where the operator
accepts unadjusted starts; every NRI route needs containerd's NRI on, on the daemon's socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from hook.tools.doctornri import DEFAULT_SOCKET, View
from hook.tools.install.nriroute import NAME, plan
from tests.test_install import Node, make_tree

ON_21 = View("containerd", (2, 1, 9), True, DEFAULT_SOCKET)
REQUIRED_22 = View("containerd", (2, 2, 7), True, DEFAULT_SOCKET, (NAME,), "tolerate-x")


def test_the_wrapper_is_the_default_and_needs_no_nri() -> None:
    assert plan(View("containerd", (1, 7, 24), False, DEFAULT_SOCKET), "wrapper", False) == (True, "")


def test_nri_alone_where_containerd_cannot_refuse_needs_the_operators_word() -> None:
    wrapper, why = plan(ON_21, "nri", False)
    assert (
        not wrapper and "start unadjusted" in why and "--route both" in why and "--accept-unadjusted" in why
    )
    assert plan(ON_21, "nri", True) == (False, "")
    assert plan(ON_21, "both", False) == (True, "")


def test_nri_alone_on_2_2_says_how_to_require_the_plugin_and_passes_once_required() -> None:
    not_required = View("containerd", (2, 2, 7), True, DEFAULT_SOCKET)
    _, why = plan(not_required, "nri", False)
    assert f'required_plugins = ["{NAME}"]' in why
    assert plan(REQUIRED_22, "nri", False) == (False, "")


@pytest.mark.parametrize("route", ["nri", "both"])
def test_an_nri_route_needs_nri_on_and_the_daemons_socket(route: str) -> None:
    _, off = plan(View("containerd", (1, 7, 24), False, DEFAULT_SOCKET), route, True)
    assert "NRI off" in off and "disable = false" in off
    _, elsewhere = plan(View("containerd", (2, 1, 9), True, "/run/other/nri.sock"), route, True)
    assert "/run/other/nri.sock" in elsewhere
    assert plan(View("containerd", (2, 1, 9), True, "/run/nri/nri.sock"), route, True)[1] == ""


def test_install_refuses_nri_alone_and_leaves_containerds_config(tmp_path: Path) -> None:
    """Through the installer, judged by the machine's own containerd (its ``config dump``): a config
    that turns NRI on for 1.7+ still cannot make containerd refuse containers without the daemon
    (1.6 has no NRI at all: "NRI off"), so the NRI route alone is refused with one line and nothing
    of containerd's changes; ``--route both`` registers the wrapper where NRI is on."""
    tree = make_tree(tmp_path / "tree")
    node = Node(tmp_path / "node")
    node.base.mkdir()
    node.containerd.parent.mkdir()
    text = ('version = 2\n[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
            '  runtime_type = "io.containerd.runc.v2"\n')  # fmt: skip
    node.containerd.write_text(text)
    refused = node.installer("install", tree, "--engine", "containerd", "--route", "nri")
    assert refused.returncode != 0 and refused.stderr.startswith("oci-device-hook: --route: nri: "), refused
    assert "unadjusted" in refused.stderr or "NRI off" in refused.stderr, refused.stderr
    assert node.containerd.read_text() == text
    both = node.installer("install", tree, "--engine", "containerd", "--route", "both")
    if "NRI off" in refused.stderr:  # this machine's containerd has no NRI: both routes refused alike
        assert both.returncode != 0 and "NRI off" in both.stderr and node.containerd.read_text() == text
        return
    assert both.returncode == 0, both.stderr
    assert str(node.libexec / "runtime") in node.containerd.read_text()
    assert node.record()["route"] == "both"


def test_the_daemonsets_install_script_passes_the_route(tmp_path: Path) -> None:
    """``ROUTE`` (and ``ACCEPT_UNADJUSTED``) on the main DaemonSet's installer container reach the
    installer as ``--route`` (``--accept-unadjusted``): NRI alone is refused here as above."""
    import os
    import subprocess

    from tests.test_install import _script

    tree = make_tree(tmp_path / "tree")
    node = Node(tmp_path / "node")
    node.base.mkdir()
    node.containerd.parent.mkdir()
    node.containerd.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                               '  runtime_type = "io.containerd.runc.v2"\n')  # fmt: skip
    env = {"PATH": os.environ["PATH"], "SRC": str(tree), "HOST_ROOT": "/", "WATCH_SETTINGS": "false",
           "ENGINE": "containerd", "ROUTE": "nri", "INSTALL_ARGS": " ".join(node.args()[2:])}  # fmt: skip
    proc = subprocess.run(
        ["sh", str(_script("install.sh", tmp_path))], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "--route: nri: " in proc.stderr, proc.stderr
