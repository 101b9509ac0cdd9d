"""Issue 22 item 2: which install prefix a running hook belongs to (``hook doctor`` judges the
hooks.d entries and containerd handlers that point there, not only the default path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hook.tools.checks import LIBEXEC
from hook.tools.doctor import installed_prefix
from hook.tools.install import main as install


def _layout(base: Path, lib: str) -> str:
    (base / lib / "hook").mkdir(parents=True)
    (base / lib).parent.joinpath("launcher.py").write_text("")
    return str(base / lib / "hook")


def test_a_versioned_install_names_the_prefix_above_versions(tmp_path: Path) -> None:
    hook_dir = _layout(tmp_path / "opt/oci-device-hook", "versions/0.1.0/lib")
    assert installed_prefix(hook_dir) == str(tmp_path / "opt/oci-device-hook")


def test_a_package_install_names_its_own_dir(tmp_path: Path) -> None:
    hook_dir = _layout(tmp_path / "home/kubernetes/bin/oci-device-hook", "lib")
    assert installed_prefix(hook_dir) == str(tmp_path / "home/kubernetes/bin/oci-device-hook")


def test_a_checkout_or_a_venv_falls_back_to_the_default(tmp_path: Path) -> None:
    (tmp_path / "lib/hook").mkdir(parents=True)  # no launcher.py beside lib/
    assert installed_prefix(str(tmp_path / "lib/hook")) == LIBEXEC
    assert installed_prefix(str(Path(__file__).resolve().parents[1] / "hook")) == LIBEXEC


@pytest.mark.parametrize(
    ("option", "value"),
    [("--prefix", "opt/oci-device-hook"), ("--prefix", "/"), ("--prefix", "/opt//x"), ("--prefix", "/opt/x/"),
     ("--prefix", "/opt/o'd"), ("--python", "/usr/bin/python3 -X"), ("--python", "python3")],
)  # fmt: skip
def test_a_prefix_or_python_a_launcher_could_not_name_plainly_is_refused(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = install.main(["install", "--root", str(tmp_path), "--src", str(tmp_path), option, value])
    err = capsys.readouterr().err
    assert code == 1 and err == f"oci-device-hook: {option}: {value}: expected a plain absolute path\n"
    assert list(tmp_path.iterdir()) == []
