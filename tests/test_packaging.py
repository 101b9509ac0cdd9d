"""Registration and packaging: hooks.d file, build-deb, launcher isolation, engine snippets, DaemonSet."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from hook.sources import settingsfile as settings

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "packaging"
HOOK_PATH = "/usr/libexec/oci-device-hook/hook"
HOOKS_STAGES = {"createContainer", "createRuntime", "prestart", "poststart", "poststop", "startContainer"}
SHELL_SCRIPTS = ["build-deb", "runtime", "debian/postinst", "debian/prerm", "debian/postrm", "bundle-python",
                 "installer", "launcher.sh.in", "image/build-image", "version", "release",
                 "kubernetes/render"]
needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")


def _hooks_json() -> dict:
    return json.loads((REPO / "nvidia-hook.json").read_text())


def test_hooks_file_is_a_valid_1_0_0_hook() -> None:
    doc = _hooks_json()
    assert doc["version"] == "1.0.0"
    hook = doc["hook"]
    assert hook["path"] == HOOK_PATH
    assert hook["args"][0] == "hook" and hook["args"][1] in ("prestart", "createRuntime")
    assert isinstance(hook["timeout"], int) and 1 <= hook["timeout"] <= 30
    assert set(doc["stages"]) <= HOOKS_STAGES and "prestart" in doc["stages"]
    assert doc["when"] == {"always": True}


def test_hooks_file_env_is_explicit_and_minimal() -> None:
    env = _hooks_json()["hook"]["env"]
    assert [e.split("=", 1)[0] for e in env] == ["PATH"]
    assert all(p.startswith("/") for p in env[0].split("=", 1)[1].split(":"))


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_scripts_parse(script: str) -> None:
    path = PKG / script
    assert os.access(path, os.X_OK), f"{script} is not executable"
    shell = "bash" if path.read_text().startswith("#!/usr/bin/env bash") else "sh"
    subprocess.run([shell, "-n", str(path)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (.ci/run installs it: apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_build_deb_is_strict_bash() -> None:
    text = (PKG / "build-deb").read_text()
    assert "set -euo pipefail" in text


def test_maintainer_scripts_never_probe_hardware() -> None:
    for name in ("postinst", "prerm", "postrm"):
        text = (PKG / "debian" / name).read_text()
        assert "nvidia-smi" not in text and "modprobe" not in text
        assert text.rstrip().endswith("exit 0"), name


def _uncommented(text: str) -> str:
    """The config with every commented-out setting (and its indented map lines) enabled."""
    out = []
    for line in text.splitlines():
        if re.match(r"#[a-z_]+:", line) or re.match(r"#  [a-z]+: \[", line):
            out.append(line[1:])
    return "\n".join(out) + "\n"


def test_default_config_has_every_key_commented_out() -> None:
    text = (PKG / "config.yaml").read_text()
    assert yaml.safe_load(text) is None
    keys = {m.group(1) for m in re.finditer(r"^#([a-z_]+):", text, re.M)}
    expected = {
        "privileged_allocation", "cdi_annotation_prefixes", "volume_mount_root", "kubelet_checkpoint",
        "kubelet_dra_state", "corroborating_env", "accelerator_nodes", "cdi_kinds", "env_requests",
        "env_trusted_namespaces", "gpu_resources",
        "mig_management", "cap_access", "log_file", "log_max_bytes", "cache_dir",
        "runtime", "driver_root", "cdi_spec_dirs", "decider", "metrics_textfile",
        "nri_socket", "nri_plugin_name", "nri_plugin_index",
    }  # fmt: skip
    assert keys == expected


def test_default_config_documents_the_real_defaults() -> None:
    enabled = yaml.safe_load(_uncommented((PKG / "config.yaml").read_text()))
    assert settings.parse_settings(enabled, "config.yaml") == settings.Settings()
    assert settings.parse_settings(None, "config.yaml") == settings.Settings()


def _write_fake_hook(lib: Path, marker: str) -> None:
    (lib / "hook").mkdir(parents=True)
    (lib / "hook" / "__init__.py").write_text("")
    (lib / "hook" / "entry.py").write_text(
        "import json, sys\n"
        "def main():\n"
        f"    print(json.dumps({{'marker': {marker!r}, 'isolated': sys.flags.isolated,"
        " 'argv': sys.argv[1:], 'path0': sys.path[0]}))\n"
        "    return 7\n"
        "def run():\n"
        "    sys.exit(main())\n"
    )


def test_launcher_loads_its_own_lib_and_ignores_the_environment(tmp_path: Path) -> None:
    python = Path("/usr/bin/python3") if Path("/usr/bin/python3").exists() else None
    if python is None:
        pytest.skip("the launcher's interpreter /usr/bin/python3 is missing")
    prefix = tmp_path / "usr/libexec/oci-device-hook"
    prefix.mkdir(parents=True)
    shutil.copy2(PKG / "launcher", prefix / "hook")
    _write_fake_hook(prefix / "lib", "ours")
    _write_fake_hook(tmp_path / "evil", "evil")
    _write_fake_hook(tmp_path / "cwd", "cwd")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "evil"), "PYTHONHOME": "/nonexistent"}
    proc = subprocess.run([str(prefix / "hook"), "prestart"], env=env, cwd=tmp_path / "cwd",
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"marker": "ours", "isolated": 1, "argv": ["prestart"], "path0": str(prefix / "lib")}


def test_launcher_shebang_isolates_python() -> None:
    first = (PKG / "launcher").read_text().splitlines()[0]
    assert first.startswith("#!/usr/bin/python3 -") and "I" in first.split()[1]


@pytest.fixture(scope="session")
def deb(built_deb: Path) -> Path:
    assert built_deb.is_file()
    return built_deb


def _dpkg(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], check=True, capture_output=True, text=True).stdout


@needs_dpkg
def test_deb_name_and_control(deb: Path) -> None:
    from hook.core.version import VERSION as version

    assert re.fullmatch(rf"oci-device-hook_{re.escape(version)}_[a-z0-9]+\.deb", deb.name)
    assert _dpkg("-f", str(deb), "Package").strip() == "oci-device-hook"
    assert _dpkg("-f", str(deb), "Version").strip() == version
    assert _dpkg("-f", str(deb), "Depends").strip() == ""  # its own interpreter: no python3 of the host


@needs_dpkg
def test_deb_contents(deb: Path) -> None:
    names = {line.split()[-1].lstrip(".") for line in _dpkg("-c", str(deb)).splitlines()}
    for path in (
        HOOK_PATH,
        "/usr/libexec/oci-device-hook/runtime",
        "/usr/libexec/oci-device-hook/launcher.py",
        "/usr/libexec/oci-device-hook/launcher.sh.in",
        "/usr/libexec/oci-device-hook/installer.py",
        "/usr/libexec/oci-device-hook/python/lib/libc.so.6",
        "/usr/libexec/oci-device-hook/python/lib/python3.11/json/__init__.py",
        "/usr/share/doc/oci-device-hook/engines/oci-device-hook-precreate.json",
        "/usr/libexec/oci-device-hook/lib/hook/__init__.py",
        "/usr/libexec/oci-device-hook/lib/yaml/__init__.py",
        "/usr/libexec/oci-device-hook/lib/click/__init__.py",
        "/usr/libexec/oci-device-hook/lib/pynvml.py",
        "/usr/share/containers/oci/hooks.d/oci-device-hook.json",
        "/etc/oci-device-hook/config.yaml",
        "/etc/logrotate.d/oci-device-hook",
        "/usr/share/doc/oci-device-hook/copyright",
        "/usr/share/doc/oci-device-hook/operators.md",
        "/usr/share/doc/oci-device-hook/operators/install.md",
        "/usr/share/doc/oci-device-hook/operators/observe.md",
        "/usr/share/doc/oci-device-hook/engines/README.md",
        "/usr/share/doc/oci-device-hook/kubernetes/daemonset.yaml",
        "/lib/systemd/system/oci-device-hook-decider.service",
    ):
        assert path in names, path
    assert not any(n.startswith("/usr/libexec/oci-device-hook/lib/bin") for n in names)
    assert not any("/tests/" in n for n in names)
    python = "/usr/libexec/oci-device-hook/python"
    assert any(re.fullmatch(rf"{python}/lib/ld-[^/]+\.so[.0-9]*", n) for n in names), "no loader bundled"
    assert any(re.fullmatch(rf"{python}/bin/python3\.[0-9]+", n) for n in names), "no interpreter bundled"
    pruned = ("/idlelib/", "/tkinter/", "/lib2to3/", "/ensurepip/", "/config-3", "/test/", "_sqlite3")
    assert not [n for n in names if n.startswith(python) and any(p in n for p in pruned)]


@needs_dpkg
def test_deb_conffiles_and_scripts(deb: Path, tmp_path: Path) -> None:
    _dpkg("-e", str(deb), str(tmp_path / "control"))
    conffiles = (tmp_path / "control/conffiles").read_text().split()
    assert conffiles == ["/etc/oci-device-hook/config.yaml", "/etc/logrotate.d/oci-device-hook"]
    for name in ("postinst", "prerm", "postrm"):
        assert os.access(tmp_path / "control" / name, os.X_OK)
    unit = "oci-device-hook-decider.service"
    postinst = (tmp_path / "control/postinst").read_text()
    assert f"systemctl enable {unit}" in postinst and f"systemctl restart {unit}" in postinst
    assert f"systemctl stop {unit}" in (tmp_path / "control/prerm").read_text()
    assert f"multi-user.target.wants/{unit}" in (tmp_path / "control/postrm").read_text()


@needs_dpkg
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("busybox") or not shutil.which("chroot"),
                    reason="chroot (root) and busybox")
def test_deb_tree_runs_on_its_own_interpreter_in_a_root_with_nothing_else(deb: Path, tmp_path: Path) -> None:
    """The package's files and a /bin/sh, nothing more: no libc, no python3 of a host. The hook
    starts (its launcher names the bundled loader, libraries and interpreter) and imports its lib."""
    _dpkg("-x", str(deb), str(tmp_path))
    (tmp_path / "bin").mkdir()
    shutil.copy2(str(shutil.which("busybox")), tmp_path / "bin/sh")
    launcher = tmp_path / HOOK_PATH.lstrip("/")
    assert launcher.read_text().startswith("#!/bin/sh\n") and os.access(launcher, os.X_OK)
    assert not (tmp_path / "usr/bin/python3").exists()
    libcs = [p for p in tmp_path.rglob("libc.so*") if p.parent.parent.name != "python"]
    assert libcs == []  # the only libc is the bundled one, in python/lib
    assert (tmp_path / "usr/share/containers/oci/hooks.d/oci-device-hook.json").read_text() == (
        REPO / "nvidia-hook.json"
    ).read_text()
    chroot = str(shutil.which("chroot"))
    proc = subprocess.run([chroot, str(tmp_path), HOOK_PATH, "--version"], capture_output=True, text=True,
                          env={}, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("hook (oci-device-hook) "), proc.stderr
    lib = launcher.parent / "lib"
    code = "import sys; sys.path.insert(0, sys.argv[1]); import yaml, yaml._yaml, click, pynvml, hook; "
    code += "print(hook.__file__)"
    interp = (tmp_path / "usr/libexec/oci-device-hook/launcher.sh.in").read_text()  # the same start
    assert "--library-path '@PYTHON@/lib' '@PYTHON@/bin/python3' -ISB" in interp
    python = "/usr/libexec/oci-device-hook/python"
    loader = next(p.name for p in (tmp_path / python.lstrip("/") / "lib").glob("ld-*"))
    argv = [f"{python}/lib/{loader}", "--library-path", f"{python}/lib", f"{python}/bin/python3", "-ISB"]
    proc = subprocess.run([chroot, str(tmp_path), *argv, "-c", code, "/" + str(lib.relative_to(tmp_path))],
                          capture_output=True, text=True, env={}, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("/usr/libexec/oci-device-hook/lib/hook/")
    assert list(lib.rglob("*.pyc")), "the package ships byte-compiled modules"


@needs_dpkg
def test_deb_for_the_hosts_python_when_asked(tmp_path: Path) -> None:
    """INTERPRETER=system: no python/, the Python launcher as the hook, a python3 dependency;
    PREFIX moves the package (hooks.d path and maintainer scripts follow)."""
    env = {**os.environ, "INTERPRETER": "system", "PREFIX": "/opt/oci-device-hook", "DEB_COMPRESS": "gzip"}
    proc = subprocess.run([str(PKG / "build-deb"), str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    deb = Path(proc.stdout.strip().splitlines()[-1])
    assert "python3 (>= 3.11)" in _dpkg("-f", str(deb), "Depends")
    _dpkg("-x", str(deb), str(tmp_path / "x"))
    _dpkg("-e", str(deb), str(tmp_path / "control"))
    prefix = tmp_path / "x/opt/oci-device-hook"
    assert (prefix / "hook").read_text() == (PKG / "launcher").read_text()
    assert not (prefix / "python").exists() and not (tmp_path / "x/usr/libexec").exists()
    hooks = json.loads((tmp_path / "x/usr/share/containers/oci/hooks.d/oci-device-hook.json").read_text())
    assert hooks["hook"]["path"] == "/opt/oci-device-hook/hook"
    for script in ("postinst", "prerm", "postrm"):
        assert "/usr/libexec" not in (tmp_path / "control" / script).read_text()


def test_engine_snippets_are_valid_toml_with_hooks_dirs() -> None:
    eng = PKG / "engines"
    crio = tomllib.loads((eng / "crio-hooks.conf").read_text())
    podman = tomllib.loads((eng / "podman-containers.conf").read_text())
    for dirs in (crio["crio"]["runtime"]["hooks_dir"], podman["engine"]["hooks_dir"]):
        assert dirs == ["/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d"]
    nri = tomllib.loads((eng / "containerd-nri.toml").read_text())
    assert nri["plugins"]["io.containerd.nri.v1.nri"]["disable"] is False
    base = tomllib.loads((eng / "containerd-base-runtime-spec.toml").read_text())
    runc = base["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
    assert runc["base_runtime_spec"].startswith("/etc/containerd/")


def test_containerd_prestart_hook_matches_the_hooks_file() -> None:
    entry = json.loads((PKG / "engines/containerd-prestart-hook.json").read_text())
    assert entry == _hooks_json()["hook"]


def test_add_prestart_hook_appends_once() -> None:
    script = PKG / "engines/add-prestart-hook.py"
    spec = {"ociVersion": "1.1.0", "hooks": {"prestart": [{"path": "/bin/other"}]}}
    once = subprocess.run([sys.executable, str(script)], input=json.dumps(spec), capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    twice = subprocess.run([sys.executable, str(script)], input=once, capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    hooks = json.loads(twice)["hooks"]["prestart"]
    assert [h["path"] for h in hooks] == ["/bin/other", HOOK_PATH]
    assert hooks[1] == _hooks_json()["hook"]


def test_cdi_hook_spec_example() -> None:
    doc = yaml.safe_load((PKG / "engines/cdi-hook-spec.yaml").read_text())
    hooks = doc["devices"][0]["containerEdits"]["hooks"]
    assert hooks[0]["path"] == HOOK_PATH and hooks[0]["hookName"] in ("prestart", "createRuntime")
    assert hooks[0]["args"][0] == "hook" and hooks[0]["timeout"] > 0
    try:
        from hook.sources.cdi.spec import parse_spec
    except ImportError:
        return
    raw = (PKG / "engines/cdi-hook-spec.yaml").read_bytes()
    parse_spec(raw, "cdi-hook-spec.yaml", 0)


def _k8s_docs() -> dict[str, dict]:
    """Documents by kind; ConfigMaps by ``ConfigMap/<name>``."""
    docs = {}
    for path in sorted((PKG / "kubernetes").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"], path
            key = doc["kind"] if doc["kind"] != "ConfigMap" else f"ConfigMap/{doc['metadata']['name']}"
            docs[key] = doc
    return docs


def test_daemonset_is_schedulable_on_gpu_nodes() -> None:
    docs = _k8s_docs()
    ds = docs["DaemonSet"]
    assert ds["apiVersion"] == "apps/v1"
    assert ds["metadata"]["namespace"] == docs["Namespace"]["metadata"]["name"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pod = ds["spec"]["template"]["spec"]
    # issue 37 item 3: no selector on GPU feature discovery's label (without it: zero pods, no
    # error), and no taint keeps it off a node (a GPU node with one more taint stays protected)
    assert "nodeSelector" not in pod and "affinity" not in pod
    assert {"operator": "Exists"} in pod["tolerations"]
    for c in pod["containers"]:
        assert c["image"] and c["command"]
        assert c["securityContext"]["privileged"] is (c["name"] == "installer")  # metrics: none either
    installer = next(c for c in pod["containers"] if c["name"] == "installer")
    assert installer["lifecycle"]["preStop"]["exec"]["command"]


def test_daemonset_runs_the_decider_with_least_privilege(tmp_path: Path) -> None:
    """Issue 23 item 4: the pod that installs the hook runs ``hook serve`` on the node; issue 27
    item 6: only what deciding needs: no privileged, no host PID namespace, no capability but
    the chroot, the node's / read-only, writable only its socket dir and its key dir."""
    pod = _k8s_docs()["DaemonSet"]["spec"]["template"]["spec"]
    assert not pod.get("hostPID")
    decider = next(c for c in pod["containers"] if c["name"] == "decider")
    assert decider["command"] == ["/bin/sh", "/scripts/decider.sh"]
    sc = decider["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_CHROOT"]}
    mounts = {m["name"]: m for m in decider["volumeMounts"]}
    assert set(mounts) == {"scripts", "host-root", "decider-socket", "decider-key"}
    assert mounts["host-root"]["readOnly"] is True and mounts["scripts"]["readOnly"] is True
    assert mounts["decider-socket"]["mountPath"] == "/host/run/oci-device-hook"
    assert mounts["decider-key"]["mountPath"] == "/host/var/lib/oci-device-hook"
    script = _k8s_script("decider.sh", tmp_path).read_text()
    assert 'exec chroot "$root" "$hook" serve' in script


def test_daemonset_volumes_are_typed_and_mounted() -> None:
    docs = _k8s_docs()
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    host = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in volumes.values() if "hostPath" in v}
    assert host == {
        "/": "Directory",  # the node's root: the prefix, hooks.d, containerd, chroot
        "/run/oci-device-hook": "DirectoryOrCreate",  # the decider's socket
        "/var/lib/oci-device-hook": "DirectoryOrCreate",  # the decider's key
        "/var/log/oci-device-hook": "DirectoryOrCreate",  # the decision log's own directory (metrics)
    }
    installer = next(c for c in pod["containers"] if c["name"] == "installer")
    mounts = {m["name"]: m for c in pod["containers"] for m in c["volumeMounts"]}
    mounts.update({m["name"]: m for m in installer["volumeMounts"]})
    assert set(mounts) == set(volumes)
    assert mounts["host-root"]["mountPath"] == "/host" and not mounts["host-root"].get("readOnly")
    assert f"ConfigMap/{volumes['scripts']['configMap']['name']}" in docs
    assert f"ConfigMap/{volumes['settings']['configMap']['name']}" in docs
    scripts = docs["ConfigMap/oci-device-hook-scripts"]["data"]
    assert {"install.sh", "uninstall.sh"} <= set(scripts)
    settings = docs["ConfigMap/oci-device-hook-settings"]["data"]["config.yaml"]
    from hook.core.settings import parse_settings

    parsed = parse_settings(yaml.safe_load(settings), "configmap")  # the shipped settings are valid
    # issue 37 item 5: the log has a directory of its own, and the metrics container mounts only it
    assert Path(parsed.log_file).parent == Path("/var/log/oci-device-hook")
    metrics = next(c for c in pod["containers"] if c["name"] == "metrics")
    host_mounts = [m for m in metrics["volumeMounts"] if "hostPath" in volumes[m["name"]]]
    assert [(m["mountPath"], m["readOnly"]) for m in host_mounts] == [("/var/log/oci-device-hook", True)]
    assert volumes[host_mounts[0]["name"]]["hostPath"]["path"] == "/var/log/oci-device-hook"


def _k8s_script(name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    path.write_text(_k8s_docs()["ConfigMap/oci-device-hook-scripts"]["data"][name])
    subprocess.run(["sh", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", "-s", "sh", str(path)], check=True)
    return path


def test_daemonset_installer_does_not_register_a_hook_the_node_cannot_run(tmp_path: Path) -> None:
    from tests.test_install import Node, make_tree

    tree = make_tree(tmp_path / "tree")
    node = Node(tmp_path / "node")
    node.base.mkdir()
    env = {"PATH": os.environ["PATH"], "SRC": str(tree), "HOST_ROOT": str(tmp_path / "no-such-root"),
           "WATCH_SETTINGS": "false", "INSTALL_ARGS": " ".join(node.args()[2:]),
           "NODE_PYTHON": "/usr/bin/python3"}  # the node's own, asked for: it cannot run  # fmt: skip
    proc = subprocess.run(["sh", str(_k8s_script("install.sh", tmp_path))], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert "cannot run the node's Python" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert list(node.base.iterdir()) == []  # nothing copied, nothing registered


DEB_NODE_CONTAINERD = """\
version = 2
# the node's own config, byte for byte after unregister
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""


@needs_dpkg
def test_deb_registers_containerd_with_the_installers_engine_step(deb: Path, tmp_path: Path) -> None:
    """Issue 22 item 4: a dpkg-installed hook on a containerd node has a way forward."""
    description = _dpkg("-f", str(deb), "Description")
    assert "NRI" not in description and "installer register" in description
    root = tmp_path / "node"
    _dpkg("-x", str(deb), str(root))  # the package's files in a scratch node root
    (root / "var/lib/dpkg/info").mkdir(parents=True)
    (root / "var/lib/dpkg/info/oci-device-hook.list").write_text("/.\n")
    cfg = root / "etc/containerd/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(DEB_NODE_CONTAINERD)
    installer = root / "usr/libexec/oci-device-hook/installer"

    def run(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(installer), action, "--root", str(root)],
            capture_output=True, text=True, timeout=120, env={"PATH": os.environ["PATH"]},
        )  # fmt: skip

    refused = run("install")
    assert refused.returncode != 0 and "installer register" in refused.stderr, refused.stderr
    done = run("register")
    assert done.returncode == 0 and "registered containerd" in done.stderr, done.stderr
    options = tomllib.loads(cfg.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert options["runc"]["options"] == {  # a shim outside the package's file list (issue 29 item 1)
        "BinaryName": "/usr/libexec/oci-device-hook/handlers/runc",
        "SystemdCgroup": True,
    }
    if shutil.which("containerd"):
        dump = subprocess.run(
            ["containerd", "--config", str(cfg), "config", "dump"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        plugins = tomllib.loads(dump)["plugins"]  # containerd 2.x dumps version 3 (cri.v1.runtime)
        table = plugins.get("io.containerd.grpc.v1.cri") or plugins["io.containerd.cri.v1.runtime"]
        runc = table["containerd"]["runtimes"]["runc"]
        assert runc["options"]["BinaryName"] == "/usr/libexec/oci-device-hook/handlers/runc"
    assert "installer unregister" in run("uninstall").stderr  # dpkg's files are not the installer's
    undone = run("unregister")
    assert undone.returncode == 0, undone.stderr
    assert cfg.read_text() == DEB_NODE_CONTAINERD
    assert not (root / "var/lib/oci-device-hook/install.json").exists()
    left = (root / "usr/libexec/oci-device-hook/handlers/runc").read_text()  # for tasks started before
    assert "# oci-device-hook pass-through" in left and left.splitlines()[-1] == "exec 'runc' \"$@\""
    listed = (root / "var/lib/oci-device-hook/pass-throughs").read_text()
    assert "pass /usr/libexec/oci-device-hook/handlers/runc" in listed


def test_the_decider_unit_gets_only_what_deciding_needs() -> None:
    """Issue 27 item 6: ``hook serve`` under systemd: root for the root-only files it reads, but no
    capability, a read-only file system but for its socket dir and key dir, cgroups read-only
    (it writes none), no network but unix sockets."""
    unit = (REPO / "packaging" / "debian" / "oci-device-hook-decider.service").read_text()
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert lines["ExecStart"].endswith("/hook serve")
    assert lines["CapabilityBoundingSet"] == "" and lines["AmbientCapabilities"] == ""
    assert lines["NoNewPrivileges"] == "yes" and lines["ProtectSystem"] == "strict"
    assert (lines["RuntimeDirectory"], lines["RuntimeDirectoryMode"]) == ("oci-device-hook", "0700")
    assert lines["RuntimeDirectoryPreserve"] == "yes"  # the hooks' fast-path record stays across restarts
    assert (lines["StateDirectory"], lines["StateDirectoryMode"]) == ("oci-device-hook", "0700")
    assert lines["ProtectControlGroups"] == "yes" and lines["PrivateNetwork"] == "yes"
    assert lines["RestrictAddressFamilies"] == "AF_UNIX"


def test_daemonset_decider_waits_for_the_hook_under_the_installers_prefix_and_says_so(tmp_path: Path) -> None:
    """Issue 37 item 7: on a COS/Flatcar prefix the decider ran the hook from the default path and
    waited forever, silently. It takes PREFIX (the installer's) and logs while it waits."""
    pod = _k8s_docs()["DaemonSet"]["spec"]["template"]["spec"]
    env = {c["name"]: {e["name"]: e.get("value") for e in c.get("env", [])} for c in pod["containers"]}
    assert env["decider"]["PREFIX"] == env["installer"]["PREFIX"]
    script = _k8s_script("decider.sh", tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chroot").write_text('#!/bin/sh\necho "chroot $*"\n')  # records what it would run
    (bin_dir / "chroot").chmod(0o755)
    root = tmp_path / "node"
    hook = root / "opt/oci-device-hook/hook"
    hook.parent.mkdir(parents=True)
    env_run = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOST_ROOT": str(root),
               "PREFIX": "/opt/oci-device-hook"}  # fmt: skip
    proc = subprocess.Popen(["sh", str(script)], env=env_run, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        time.sleep(1)
        assert proc.poll() is None  # still waiting: no hook yet
        hook.write_text("#!/bin/sh\n")
        hook.chmod(0o755)  # the installer puts it there
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out == f"chroot {root} /opt/oci-device-hook/hook serve\n"
    assert "waiting for the installer to put /opt/oci-device-hook/hook on the node" in err


def test_daemonset_loop_stops_re_applying_once_uninstall_is_under_way(tmp_path: Path) -> None:
    """Issue 37 item 4: the preStop's uninstall runs beside install.sh's loop; a loop that re-applied
    (settings, and a re-registration) meanwhile would undo the uninstall. uninstall.sh marks it in
    the pod's own emptyDir and the loop skips from then on."""
    install, uninstall = _k8s_script("install.sh", tmp_path), _k8s_script("uninstall.sh", tmp_path)
    tree = tmp_path / "tree"
    installer = tree / "usr/libexec/oci-device-hook/installer"
    installer.parent.mkdir(parents=True)
    calls = tmp_path / "calls"
    installer.write_text(f'#!/bin/sh\necho "$1" >>{calls}\n')
    installer.chmod(0o755)
    settings = tmp_path / "config.yaml"
    settings.write_text("{}\n")
    state = tmp_path / "pod"
    state.mkdir()
    env = {"PATH": os.environ["PATH"], "SRC": str(tree), "HOST_ROOT": str(tmp_path),
           "SETTINGS": str(settings), "SETTINGS_POLL_SECONDS": "0.1", "POD_STATE": str(state),
           "UNINSTALL_ON_STOP": "true"}  # fmt: skip
    loop = subprocess.Popen(["sh", str(install)], env=env)
    try:
        deadline = time.monotonic() + 20
        while not (calls.exists() and "settings" in calls.read_text()):
            assert time.monotonic() < deadline, "the loop never re-applied"
            time.sleep(0.1)
        stop = subprocess.run(["sh", str(uninstall)], env=env, capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert (state / "uninstalling").exists()
        time.sleep(0.5)  # an iteration already past the check finishes (the window a poll can span)
        seen = calls.read_text()
        assert "uninstall" in seen.splitlines()
        time.sleep(1.5)  # fifteen polls
        assert calls.read_text() == seen  # nothing re-applied after the uninstall
    finally:
        loop.kill()
        loop.wait()
