"""Issue 29 item 7: release hygiene. A LICENSE, a changelog, the version written once and read by
every build step, the DaemonSet's image and tag as parameters, and the bundled interpreter's
versions written into the bundle for the operator who patches it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from hook.core.version import VERSION

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "packaging"


def test_license_is_the_apache_2_0_text_pyproject_names() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == {
        "text": "Apache-2.0"
    }


def test_changelog_has_an_entry_for_this_version_or_unreleased_work() -> None:
    heads = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert heads and heads[0] in ("Unreleased", VERSION)
    assert VERSION in heads


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hook.core.version.VERSION"}
    out = subprocess.run([str(PKG / "version")], capture_output=True, text=True, check=True).stdout
    assert out == f"{VERSION}\n"
    # no script, manifest or settings file under packaging/ holds a version of its own
    holders = [
        str(p.relative_to(REPO))
        for p in PKG.rglob("*")
        if p.is_file()
        and re.search(rf"(?<![\d.]){re.escape(VERSION)}(?![\d.])", p.read_text(errors="replace"))
    ]
    assert holders == []


def test_packaging_version_refuses_a_version_line_the_shell_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "packaging").mkdir()
    (tmp_path / "hook/core").mkdir(parents=True)
    (tmp_path / "packaging/version").write_bytes((PKG / "version").read_bytes())
    (tmp_path / "packaging/version").chmod(0o755)
    (tmp_path / "hook/core/version.py").write_text('VERSION = "1.0; rm -rf /"\n')
    proc = subprocess.run([str(tmp_path / "packaging/version")], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == "" and "no plain VERSION" in proc.stderr


def _render(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PKG / "kubernetes/render")], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _images(stream: str) -> list[str]:
    docs = [d for d in yaml.safe_load_all(stream) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    return [c["image"] for c in ds["spec"]["template"]["spec"]["containers"]]


def test_manifests_take_the_image_and_tag_as_parameters() -> None:
    stream = _render().stdout
    assert {d["kind"] for d in yaml.safe_load_all(stream) if d} == {"Namespace", "ConfigMap", "DaemonSet"}
    images = _images(stream)
    assert images and set(images) == {f"localhost/oci-device-hook:{VERSION}"}  # defaults: build-image's
    res = _render(IMAGE="registry.example:5000/gpu/oci-device-hook", TAG="1.2.3-rc1")
    assert res.returncode == 0, res.stderr
    assert set(_images(res.stdout)) == {"registry.example:5000/gpu/oci-device-hook:1.2.3-rc1"}
    raw = (PKG / "kubernetes/daemonset.yaml").read_text()
    assert "localhost/oci-device-hook" not in raw  # nothing hard-coded left to forget
    assert set(_images(raw)) == {"oci-device-hook"}  # a plain name: kustomize's images: matches it


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("env", "image"),
    [
        ({"IMAGE": f"reg.example/odh@{DIGEST}"}, f"reg.example/odh@{DIGEST}"),
        ({"IMAGE": "reg.example:5000/odh", "DIGEST": DIGEST}, f"reg.example:5000/odh@{DIGEST}"),
        ({"IMAGE": "reg.example/odh", "TAG": "1.2.3", "DIGEST": DIGEST}, f"reg.example/odh:1.2.3@{DIGEST}"),
    ],
)
def test_render_pins_a_digest(env: dict[str, str], image: str) -> None:
    """Issue 37 item 3: render refused ``@sha256:`` digests; a digest pins the image (with a tag,
    or alone: then no default tag is added)."""
    res = _render(**env)
    assert res.returncode == 0, res.stderr
    assert set(_images(res.stdout)) == {image}


def test_the_kustomize_base_takes_an_images_override(tmp_path: Path) -> None:
    """Issue 37 item 3: ``@IMAGE@:@TAG@`` defeated kustomize's ``images:``; the base names the image
    ``oci-device-hook`` so an overlay sets repository, tag and digest. Built with ``kubectl
    kustomize`` where kubectl is installed (it is on this project's machines); the base's YAML is
    checked directly in any case."""
    base = yaml.safe_load((PKG / "kubernetes/kustomization.yaml").read_text())
    assert base["kind"] == "Kustomization"
    listed = set(base["resources"])
    assert listed == {p.name for p in (PKG / "kubernetes").glob("*.yaml")} - {"kustomization.yaml"}
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    image = {"name": "oci-device-hook", "newName": "reg.example/odh", "newTag": "9.9.9", "digest": DIGEST}
    base_dir = os.path.relpath(PKG / "kubernetes", overlay)
    kust = {"resources": [base_dir], "namespace": "gpu-guard", "images": [image]}
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        stream = "---\n".join((PKG / "kubernetes" / name).read_text() for name in base["resources"])
        assert set(_images(stream)) == {"oci-device-hook"}
        return
    res = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert set(_images(res.stdout)) == {f"reg.example/odh:9.9.9@{DIGEST}"}
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"gpu-guard"}


@pytest.mark.parametrize(
    ("key", "value"),
    [("TAG", "1.0 x"), ("TAG", "1|x"), ("IMAGE", "a b"), ("IMAGE", "x|y"), ("DIGEST", "sha256:abc"),
     ("DIGEST", "md5:" + "0" * 60), ("DIGEST", "sha256:" + "A" * 64), ("IMAGE", "x@sha256:1")],
)
def test_render_refuses_values_that_would_break_the_manifest(key: str, value: str) -> None:
    res = _render(**{key: value})
    assert res.returncode == 2 and res.stdout == "" and key in res.stderr


def _member(deb: Path, suffix: str) -> bytes:
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    tmp = deb.parent / "fsys.tar"
    tmp.write_bytes(data)
    with tarfile.open(tmp) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(suffix))
        f = tar.extractfile(member)
        assert f is not None
        return f.read()


def test_the_deb_carries_the_license_changelog_and_its_bundles_versions(built_deb: Path) -> None:
    assert _member(built_deb, "/usr/share/doc/oci-device-hook/LICENSE") == (REPO / "LICENSE").read_bytes()
    assert (
        _member(built_deb, "/usr/share/doc/oci-device-hook/CHANGELOG.md")
        == (REPO / "CHANGELOG.md").read_bytes()
    )
    ds = _member(built_deb, "/usr/share/doc/oci-device-hook/kubernetes/daemonset.yaml").decode()
    assert set(_images(ds)) == {f"localhost/oci-device-hook:{VERSION}"}  # rendered for its own version
    bundle = json.loads(_member(built_deb, "/oci-device-hook/python/BUNDLE.json"))
    # the bundle was copied from the build's interpreter (build-deb's PYTHON_BIN): the same versions
    probe = (
        "import os, platform, ssl; "
        "print(platform.python_version(), os.confstr('CS_GNU_LIBC_VERSION'), ssl.OPENSSL_VERSION, sep='|')"
    )
    python = os.environ.get("PYTHON_BIN", "/usr/bin/python3")
    out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, check=True).stdout
    version, glibc, openssl = out.strip().split("|")
    assert (bundle["python"], bundle["glibc"]) == (version, glibc)
    assert bundle["openssl"].startswith("OpenSSL ") and bundle["openssl"].split()[1] in openssl
    assert any(p.startswith("libssl") for p in bundle["packages"])  # where its libcrypto came from


def test_doctor_names_the_bundles_versions_and_who_patches_them(tmp_path: Path) -> None:
    from hook.tools.doctorpython import check_interpreter

    bundle = tmp_path / "python"
    (bundle / "lib").mkdir(parents=True)
    (bundle / "lib/ld-linux-x86-64.so.2").write_bytes(b"")
    old = check_interpreter(bundle)  # a bundle from before BUNDLE.json: a warning, and what to do
    assert old.ok and old.warn and "no BUNDLE.json" in old.detail and "packaging/release" in old.fix
    info = {"python": "3.11.2", "openssl": "OpenSSL 3.0.19 27 Jan 2026", "glibc": "glibc 2.36",
            "built": "2026-12-01T21:00:00Z", "packages": {"libssl3": "3.0.19-1~deb12u2"}}  # fmt: skip
    (bundle / "BUNDLE.json").write_text(json.dumps(info))
    line = check_interpreter(bundle)
    assert line.ok and not line.warn
    for part in ("bundled Python 3.11.2", "OpenSSL 3.0.19", "glibc 2.36", "libssl3 3.0.19-1~deb12u2"):
        assert part in line.detail
    assert "you patch them by rebuilding (packaging/release OUT_DIR)" in line.detail
    own = check_interpreter(tmp_path)  # not a bundle: the node's Python
    assert own.ok and not own.warn and "patched by the node's package manager" in own.detail


def test_the_bundled_hook_doctor_reads_its_own_bundle(built_deb: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(built_deb), str(root)], check=True)
    prefix = root / "usr/libexec/oci-device-hook"
    (loader,) = (prefix / "python/lib").glob("ld-linux*.so*")
    cmd = [str(loader), "--library-path", str(prefix / "python/lib"), str(prefix / "python/bin/python3"),
           "-ISB", str(prefix / "launcher.py"), "doctor", "--format", "json"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    line = next(c for c in json.loads(res.stdout) if c["name"] == "interpreter")
    bundle = json.loads((prefix / "python/BUNDLE.json").read_text())
    assert line["ok"] and not line["warn"]
    assert f"bundled Python {bundle['python']}, {bundle['openssl']}, {bundle['glibc']}" in line["detail"]
    assert "packaging/release" in line["detail"]


def test_the_release_step_tags_the_image_and_renders_the_manifests_with_the_version(
    built_deb: Path, tmp_path: Path
) -> None:
    """packaging/release on a .deb of this tree: the image is built as IMAGE:<version> (podman here
    is a stand-in that records its arguments), the manifests name it, BUNDLE.json comes along."""
    calls = tmp_path / "podman.log"
    podman = tmp_path / "podman"
    podman.write_text(f'#!/bin/sh\necho "$*" >>{calls}\n')
    podman.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "DEB": str(built_deb),
        "PODMAN": str(podman),
        "IMAGE": "reg.example/odh",
    }
    res = subprocess.run([str(PKG / "release"), str(tmp_path / "dist")], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    build = next(line for line in calls.read_text().splitlines() if line.startswith("build "))
    assert f"-t reg.example/odh:{VERSION} " in build
    stream = (tmp_path / f"dist/oci-device-hook-{VERSION}.yaml").read_text()
    assert set(_images(stream)) == {f"reg.example/odh:{VERSION}"}
    assert json.loads((tmp_path / "dist/BUNDLE.json").read_text())["python"]
    # the Helm chart, with this version and image (issue 37 item 3): the tree's holds neither
    with tarfile.open(tmp_path / f"dist/oci-device-hook-chart-{VERSION}.tgz") as tar:
        chart = yaml.safe_load(tar.extractfile("oci-device-hook/Chart.yaml").read())  # type: ignore[union-attr]
        values = yaml.safe_load(tar.extractfile("oci-device-hook/values.yaml").read())  # type: ignore[union-attr]
        assert "oci-device-hook/templates/daemonset.yaml" in tar.getnames()
        tar.extractall(tmp_path / "chart", filter="data")
    from tests.helmlite import render_chart

    rendered = render_chart(tmp_path / "chart/oci-device-hook")  # no values: the release's own image
    assert set(_images(rendered["daemonset.yaml"])) == {f"reg.example/odh:{VERSION}"}
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    assert values["image"]["repository"] == "reg.example/odh" and values["image"]["tag"] == ""
    # a .deb of another version is refused: the release never mixes versions
    other = tmp_path / "other.deb"
    other.write_bytes(b"")
    res = subprocess.run([str(PKG / "release"), str(tmp_path / "d2")], env={**env, "DEB": str(other)},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode != 0 and not (tmp_path / f"d2/oci-device-hook-{VERSION}.yaml").exists()
