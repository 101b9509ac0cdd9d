"""Host readiness checklist (``hook doctor``): driver, CDI specs, cgroups, registration, settings.

Rule: every check reads the host, never changes it, and returns one ``Check`` (name, ok,
detail, fix); a check never raises. Optional parts of the hook (CDI registry, BPF syscalls)
are imported lazily, so the doctor still runs, and says so, when one is missing. The run
fails (exit 1) when any check fails.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hook.core.record import asdict, record

__all__ = [
    "HOOK_PATH",
    "HOOKS_FILE",
    "Check",
    "check_base_spec",
    "check_cdi",
    "check_cgroup",
    "check_driver",
    "check_hooks",
    "check_kubelet",
    "check_kubelet_dra",
    "check_settings",
    "render",
    "run_doctor",
]

HOOK_PATH = "/usr/libexec/oci-device-hook/hook"
LIBEXEC = "/usr/libexec/oci-device-hook"
CONTAINERD_CONFIG = Path("/etc/containerd/config.toml")
HOOKS_FILE = "oci-device-hook.json"
LATE_HOOKS_FILE = "zz-oci-device-hook.json"  # the installer's name where NVIDIA's hooks.d file is present
DEFAULT_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
HOOK_STAGES = frozenset({"prestart", "createRuntime"})
REQUIRED_MAJORS = ("nvidia", "nvidia-uvm", "nvidia-caps")
CGROUP_ROOT = "/sys/fs/cgroup"


@record(kw_only=False)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _char_majors(text: str) -> dict[str, int]:
    """Name → major from the "Character devices:" section of /proc/devices."""
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.startswith("Character")
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    if "nvidia" not in majors and "nvidia-frontend" in majors:
        majors["nvidia"] = majors["nvidia-frontend"]
    return majors


def check_driver(driver_root: Path) -> Check:
    """The NVIDIA driver is loaded: its majors in /proc/devices and nvidiactl in /dev."""
    fix = "load the NVIDIA kernel modules (nvidia-modprobe / nvidia-smi) or pass --driver-root"
    devices = driver_root / "proc/devices"
    try:
        majors = _char_majors(devices.read_text())
    except OSError as exc:
        return Check("driver", False, f"{devices}: {exc.strerror or exc}", fix)
    missing = [name for name in REQUIRED_MAJORS if name not in majors]
    if missing:
        return Check("driver", False, f"{devices}: no major for {', '.join(missing)}", fix)
    found = ", ".join(f"{name} {majors[name]}" for name in REQUIRED_MAJORS)
    try:
        version = (driver_root / "proc/driver/nvidia/version").read_text().split("\n", 1)[0].strip()
    except OSError:
        version = "version file missing"
    if not (driver_root / "dev/nvidiactl").exists():
        return Check("driver", False, f"{found}; {driver_root / 'dev/nvidiactl'} missing", fix)
    gpus = sorted(p.name for p in (driver_root / "dev").glob("nvidia[0-9]*"))
    return Check("driver", True, f"{found}; {len(gpus)} GPU node(s); {version}")


def check_cdi(spec_dirs: Sequence[Path]) -> Check:
    """Every CDI spec in the spec directories parses and validates (hook.sources.cdi.registry)."""
    try:
        from hook.sources.cdi.registry import Registry
    except ImportError as exc:
        return Check("cdi", True, f"not available in this build ({exc}); CDI specs not checked")
    dirs = [d for d in spec_dirs if d.is_dir()]
    if not dirs:
        return Check("cdi", True, "no CDI spec directory exists (fine when no engine uses CDI)")
    try:
        registry = Registry.load(dirs, None)
    except Exception as exc:  # a doctor reports; it never crashes on what it inspects
        return Check("cdi", False, f"loading {', '.join(map(str, dirs))}: {exc}", _CDI_FIX)
    errors = [f"{path}: {problem}" for path, problems in registry.errors.items() for problem in problems]
    if errors:
        return Check("cdi", False, "; ".join(errors), _CDI_FIX)
    return Check("cdi", True, f"{len(registry.devices)} device(s) in {', '.join(map(str, dirs))}")


_CDI_FIX = "regenerate the spec (nvidia-ctk cdi generate) or check it with: hook cdi validate FILE"


def _mount_types(mounts_text: str) -> dict[str, tuple[str, str]]:
    """Mount point → (fs type, options) from /proc/self/mounts text (last mount wins)."""
    table: dict[str, tuple[str, str]] = {}
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            table[parts[1].replace("\\040", " ")] = (parts[2], parts[3])
    return table


def _bpf_probe(cgroup_root: str = CGROUP_ROOT) -> tuple[bool, str]:
    """Query the BPF device programs attached to the root cgroup (needs root and CONFIG_CGROUP_BPF)."""
    try:
        from hook.adapters.apply import bpf_sys
    except ImportError as exc:
        return True, f"BPF support not available in this build ({exc})"
    try:
        fd = os.open(cgroup_root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        return False, f"cannot open {cgroup_root}: {exc.strerror or exc}"
    try:
        bpf_sys.query_device_programs(fd)
    except Exception as exc:  # ApplyError or OSError: either way the hook could not apply on v2
        return False, f"cannot query BPF device programs: {exc}"
    finally:
        os.close(fd)
    return True, "BPF device programs can be queried"


def check_cgroup(mounts_file: Path = Path("/proc/self/mounts")) -> Check:
    """Which cgroup version holds the device controller, and whether the hook can drive it."""
    try:
        table = _mount_types(mounts_file.read_text())
    except OSError as exc:
        return Check("cgroup", False, f"{mounts_file}: {exc.strerror or exc}", "mount /proc")
    fstype, _ = table.get(CGROUP_ROOT, ("", ""))
    if fstype == "cgroup2":
        ok, detail = _bpf_probe()
        fix = "" if ok else "run the hook as root on a kernel with CONFIG_CGROUP_BPF"
        return Check("cgroup", ok, f"v2 (unified); {detail}", fix)
    devices = [p for p, (t, opts) in table.items() if t == "cgroup" and "devices" in opts.split(",")]
    if devices:
        hybrid = " hybrid" if table.get(f"{CGROUP_ROOT}/unified", ("",))[0] == "cgroup2" else ""
        return Check("cgroup", True, f"v1{hybrid}; devices controller at {devices[0]}")
    return Check(
        "cgroup",
        False,
        f"no cgroup2 at {CGROUP_ROOT} and no v1 devices controller",
        "mount the cgroup v1 devices controller or boot with the unified hierarchy",
    )


def _effective_hooks_file(hooks_dirs: Sequence[Path]) -> Path | None:
    """The file an engine would use: same file name in a later directory replaces an earlier one."""
    found: Path | None = None
    for directory in hooks_dirs:
        candidates = [directory / HOOKS_FILE, directory / LATE_HOOKS_FILE]  # the installer's two names
        if directory.is_dir():
            candidates += sorted(directory.glob("*.json"))
        for path in candidates:
            if path.is_file() and (path.name in (HOOKS_FILE, LATE_HOOKS_FILE) or _points_at_hook(path)):
                found = path
                break
    return found


def _points_at_hook(path: Path) -> bool:
    try:
        hook = json.loads(path.read_text()).get("hook", {})
    except (OSError, ValueError, AttributeError):
        return False
    stages = json.loads(path.read_text()).get("stages") or []
    live = isinstance(stages, list) and bool(HOOK_STAGES & set(stages))  # not a precreate-only file
    return isinstance(hook, dict) and hook.get("path") == HOOK_PATH and live


def _hooks_problem(path: Path) -> str:
    """'' when the hooks.d file is usable, else what an engine would reject or skip."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path}: not readable JSON ({exc})"
    hook = doc.get("hook") if isinstance(doc, dict) else None
    if not isinstance(hook, dict) or doc.get("version") != "1.0.0":
        return f"{path}: expected version 1.0.0 with a hook object"
    target = hook.get("path")
    if not isinstance(target, str) or not os.access(target, os.X_OK) or not Path(target).is_file():
        return f"{path}: hook.path {target!r} is not an executable file"
    stages = doc.get("stages")
    if not isinstance(stages, list) or not HOOK_STAGES & set(stages):
        return f"{path}: stages {stages!r} name neither prestart nor createRuntime"
    if not doc.get("when"):
        return f"{path}: no 'when' condition, so the hook never matches"
    return ""


def check_hooks(hooks_dirs: Sequence[Path]) -> Check:
    """The hooks.d file is installed in an engine's hooks directory and points at the hook."""
    fix = f"install nvidia-hook.json as {DEFAULT_HOOKS_DIR}/{HOOKS_FILE} (see docs/operators.md)"
    path = _effective_hooks_file(hooks_dirs)
    if path is None:
        return Check("hooks.d", False, f"no {HOOKS_FILE} in {', '.join(map(str, hooks_dirs))}", fix)
    problem = _hooks_problem(path)
    if problem:
        return Check("hooks.d", False, problem, fix)
    return Check("hooks.d", True, f"{path} → {json.loads(path.read_text())['hook']['path']}")


def _hooks_docs(hooks_dirs: Sequence[Path]) -> dict[str, Any]:
    """File name → decoded hooks.d JSON as an engine sees them (a later dir's file replaces one
    of the same name)."""
    docs: dict[str, Any] = {}
    for directory in hooks_dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            try:
                docs[path.name] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
    return docs


def check_hooks_order(hooks_dirs: Sequence[Path], libexec: str = LIBEXEC) -> Check:
    """CRI-O/podman: which stage (mode) our hooks.d file registers, and that it runs after
    NVIDIA's hook in a stage they share (engines order a stage's hooks by file name)."""
    from hook.tools.engines import hooks_order

    docs = _hooks_docs(hooks_dirs)
    ours = [n for n, d in docs.items() if isinstance(d, dict) and _is_our_hook(d, libexec)]
    if not ours:
        return Check("hooks.d order", True, "not registered through hooks.d (nothing to order)")
    stages = sorted({str(s) for n in ours for s in docs[n].get("stages") or ()})
    mode = ", ".join(f"{s} ({'spec level' if s == 'precreate' else 'live'})" for s in stages)
    order = hooks_order(docs, [HOOK_PATH, *(str(docs[n]["hook"]["path"]) for n in ours)])
    for stage, names in order.items():
        mine = [i for i, n in enumerate(names) if n in ours]
        theirs = [i for i, n in enumerate(names) if n not in ours]
        if mine and theirs and min(mine) < max(theirs):
            return Check(
                "hooks.d order",
                False,
                f"{stage}: {' then '.join(names)}: ours runs before NVIDIA's hook",
                "reinstall (the installer names the file zz-oci-device-hook.json when NVIDIA's is present)",
            )
    after = " after NVIDIA's hook" if any(len(v) > 1 for v in order.values()) else ""
    return Check("hooks.d order", True, f"{', '.join(ours)}: {mode}{after}")


def _is_our_hook(doc: dict[str, Any], libexec: str) -> bool:
    hook = doc.get("hook")
    path = hook.get("path") if isinstance(hook, dict) else None
    return path in (HOOK_PATH, f"{libexec}/hook")


CONTAINERD_BINARIES = ("/usr/bin/containerd", "/usr/local/bin/containerd", "/bin/containerd")
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
K3S_SOCKET = "/run/k3s/containerd/containerd.sock"  # k3s and rke2 alike
K3S_CONFIGS = tuple(f"/var/lib/rancher/{d}/agent/etc/containerd/config.toml" for d in ("k3s", "rke2"))


def _host_reader() -> tuple[Any, Any]:
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text()
        except FileNotFoundError:
            return None

    def listdir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    return read, listdir


def containerd_binary() -> str | None:
    """The node's containerd, whose own ``config dump`` says what it runs with."""
    return next((b for b in CONTAINERD_BINARIES if os.access(b, os.X_OK)), None)


def _dumped(binary: str, config: Path) -> tuple[int, list[Any], str]:
    """(version, handlers) as ``containerd --config F config dump`` reads F and its imports."""
    import subprocess

    from hook.tools.engines import config_version, cri_plugin, handlers_in, parse

    proc = subprocess.run(
        [binary, "--config", str(config), "config", "dump"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ValueError(
            f"containerd cannot load it: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"
        )
    doc = parse(proc.stdout, f"{binary} config dump")
    version = config_version(doc, False)
    if cri_plugin(version) not in (doc.get("plugins") or {}):
        raise LookupError("the CRI plugin is disabled: no handlers in the dump")
    return version, handlers_in(doc, version), str(doc.get("grpc", {}).get("address") or "")


def _judge(config: Path, how: str, version: int, found: list[Any], libexec: str) -> Check:
    from hook.tools.engines import RUNC_TYPES

    fix = "run the installer (packaging/kubernetes; a .deb: installer register) and restart containerd"
    where = f"{config} ({how})"
    runc = [h for h in found if h.runtime_type in RUNC_TYPES]
    if not runc:
        return Check("containerd", False, f"{where}: containerd's implicit runc handler not registered", fix)
    ours = {f"{libexec}/runtime"} | {f"{libexec}/handlers/{h.name}" for h in runc}
    names = {h.name: f"{h.name}{' (default)' if h.default else ''}" for h in runc}
    missing = [names[h.name] for h in runc if h.binary not in ours]
    if missing:
        return Check("containerd", False, f"{where}: handler(s) {', '.join(missing)} not registered", fix)
    listed = ", ".join(names.values())
    return Check(
        "containerd", True, f"{config} (version {version}, {how}): {listed} run the wrapper (spec level)"
    )


def _socket_listens(path: str) -> bool:
    import socket
    import stat

    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def check_containerd(
    config: Path,
    libexec: str = LIBEXEC,
    *,
    binary: str | None = "",
    socket_path: str = "",
    stopped_ok: bool = False,
) -> Check:
    """containerd: every runc-type runtime handler of the configuration containerd actually runs
    (its own ``config dump`` where the binary is there, else ``config`` and its imports under
    both merge rules, ``hook.tools.ctdconfig``) runs the runtime wrapper (spec-level mode).

    With ``stopped_ok`` (the whole checklist), a containerd that is not running (nothing listens
    on its socket) is reported, not failed: a podman host may have the package and its config
    without running it."""
    from hook.tools import ctdconfig, engines

    if not config.exists():
        return Check("containerd", True, f"{config} absent: containerd not configured on this node")
    binary = containerd_binary() if binary == "" else binary
    address = ""
    try:
        read, listdir = _host_reader()
        files, version = ctdconfig.load(str(config), read, listdir)  # refuses what the installer would
        address = str(engines.parse(files[0].text, str(config)).get("grpc", {}).get("address") or "")
        dumped: tuple[int, list[Any], str] | None = None
        if binary:
            with contextlib.suppress(LookupError):  # CRI disabled: judged from the files below
                dumped = _dumped(binary, config)
        if dumped is not None:
            version, found, dumped_address = dumped
            address = dumped_address or address
            check = _judge(config, "containerd config dump", version, found, libexec)
        else:
            check = Check("containerd", True, "")
            for rule in ctdconfig.RULES:
                how = f"{len(files)} file(s), containerd {'1.x' if rule == 'replace' else '2.x'} merge"
                found = ctdconfig.effective_handlers(files, version, rule)
                check = _judge(config, how, version, found, libexec)
                if not check.ok:
                    break
    except Exception as exc:  # a doctor reports; it never crashes on what it inspects
        check = Check("containerd", False, str(exc), "fix the config, then run the installer")
    k3s = any(str(config).endswith(k) for k in K3S_CONFIGS)  # k3s passes its socket on the command line
    sock = socket_path or address or (K3S_SOCKET if k3s else CONTAINERD_SOCKET)
    if stopped_ok and not check.ok and not _socket_listens(sock):
        return Check(
            "containerd", True, f"installed but not running (nothing listens on {sock}): {check.detail}"
        )
    return check


def _base_spec_check(handler: str, field: str, spec_file: str, libexec: str) -> Check:
    from hook.tools.engines import base_spec_hooks, runs_after_nvidia

    name = f"containerd base spec ({handler})"
    where = f"{spec_file} (from {field})"
    try:
        spec = json.loads(Path(spec_file).read_text())
    except (OSError, ValueError) as exc:
        return Check(name, False, f"{where}: not readable JSON ({exc})", f"fix or remove {field}")
    if not isinstance(spec, dict):
        return Check(name, False, f"{where}: not a JSON object", f"fix or remove {field}")
    found = base_spec_hooks(spec, [HOOK_PATH, f"{libexec}/hook"])
    ours = ", ".join(f"{s} #{i}" for s, h in found.items() for i in h.ours) or "not registered"
    nvidia = "NVIDIA's hook present" if any(h.nvidia for h in found.values()) else "no NVIDIA hook"
    detail = f"{where}: ours {ours}; {nvidia}"
    after = runs_after_nvidia(found)
    if after is False:
        fix = f"in {spec_file}, move the {libexec}/hook entry after NVIDIA's (prestart runs first)"
        return Check(name, False, f"{detail}; ours runs before NVIDIA's", fix)
    return Check(name, True, f"{detail}{'; ours runs after it' if after else ''}")


def check_base_spec(config: Path, libexec: str = LIBEXEC) -> list[Check]:
    """containerd: for each runtime handler with a ``base_runtime_spec``, whether that OCI spec
    registers our hook, and whether it runs after NVIDIA's hook (runc runs prestart, then
    createRuntime, each in array order); ``[]`` when no handler names a base spec."""
    from hook.tools import ctdconfig
    from hook.tools.engines import cri_plugin

    try:
        read, listdir = _host_reader()
        files, version = ctdconfig.load(str(config), read, listdir)
        found = ctdconfig.effective_handlers(files, version, "merge")
    except Exception:  # check_containerd reports an unreadable config already
        return []
    prefix = f'plugins."{cri_plugin(version)}".containerd.runtimes'
    return [
        _base_spec_check(h.name, f"{config}: {prefix}.{h.name}.base_runtime_spec", h.base_spec, libexec)
        for h in found
        if h.base_spec
    ]


def check_settings(settings_file: Path) -> Check:
    """The settings file is valid YAML with known keys (a missing file means defaults)."""
    try:
        from hook.core.errors import InputError
        from hook.sources.settingsfile import load_settings
    except ImportError as exc:
        return Check("settings", True, f"not available in this build ({exc}); {settings_file} not checked")
    if not settings_file.exists():
        return Check("settings", True, f"{settings_file} absent: built-in defaults")
    try:
        settings = load_settings(settings_file)
    except InputError as exc:
        return Check("settings", False, str(exc), f"fix or comment out the key in {settings_file}")
    policy = getattr(settings, "privileged_allocation", "?")
    return Check("settings", True, f"{settings_file}: valid (privileged_allocation={policy})")


def check_decider() -> Check:
    """Whether a warm decider (``hook serve``) answers on this node, and its account of itself.

    None at all is fine (every container is decided in-process, only slower); one that is
    there but does not answer, is not root or is another version fails: each container then
    pays a failed attempt before it is decided in-process."""
    from hook.core.version import VERSION
    from hook.routes import client

    got = client.status()
    where = f"{client.SOCKET_DIR}/{client.SOCKET_NAME}"
    if isinstance(got, str):
        if got.startswith("no decider socket"):
            fix = "systemctl enable --now oci-device-hook-decider (faster starts)"
            return Check("decider", True, f"not running ({got}): containers are decided in-process", fix)
        return Check("decider", False, f"{where}: {got}", "systemctl restart oci-device-hook-decider")
    detail = (
        f"answering: version {got.get('version')}, pid {got.get('pid')}, up {got.get('uptime_s')} s, "
        f"{got.get('requests')} request(s), {got.get('declined')} declined"
    )
    if got.get("version") != VERSION:
        return Check("decider", False, f"{detail}; this hook is {VERSION}",
                     "systemctl restart oci-device-hook-decider")
    return Check("decider", True, detail)


def check_kubelet(settings_file: Path, root: Path = Path("/")) -> Check:
    """The checkpoint the hook reads is where this node's kubelet writes it (hook.tools.kubeletcheck)."""
    from hook.tools.kubeletcheck import kubelet_coverage

    return Check("kubelet", *kubelet_coverage(settings_file, root))


def check_kubelet_dra(settings_file: Path, root: Path = Path("/")) -> Check:
    """The kubelet's DRA state the hook reads is where this node's kubelet writes it, and reads."""
    from hook.tools.kubeletcheck import dra_coverage

    return Check("kubelet DRA", *dra_coverage(settings_file, root))


def render(checks: Sequence[Check], fmt: str) -> str:
    """Text checklist for people, or a JSON list of {name, ok, detail, fix} for programs."""
    if fmt == "json":
        return json.dumps([asdict(c) for c in checks], indent=2)
    lines = ["oci-device-hook doctor"]
    for c in checks:
        lines.append(f"{'✓' if c.ok else '✗'} {c.name}: {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"    fix: {c.fix}")
    passed = sum(c.ok for c in checks)
    lines.append(f"{passed} of {len(checks)} checks passed")
    return "\n".join(lines)


def installed_prefix(hook_dir: str) -> str:
    """The install prefix this hook runs from (``hook_dir``: the ``hook`` package's directory):
    ``<prefix>/lib/hook`` (the .deb) or ``<prefix>/versions/<v>/lib/hook`` (the installer), where
    ``<prefix>`` holds the launcher; ``LIBEXEC`` for any other layout (a checkout, a venv). A node
    installed under ``/opt/oci-device-hook`` is then judged by what points there."""
    lib = Path(hook_dir).parent
    base = lib.parent
    if lib.name != "lib" or not (base / "launcher.py").is_file():
        return LIBEXEC
    return str(base.parent.parent) if base.parent.name == "versions" else str(base)


def _containerd_config(host_root: Path) -> Path:
    """/etc/containerd/config.toml, or on a k3s/rke2 node the config its containerd runs."""
    for k3s in K3S_CONFIGS:
        if (host_root / k3s.lstrip("/")).is_file():
            return host_root / k3s.lstrip("/")
    return CONTAINERD_CONFIG


def run_doctor(
    driver_root: Path,
    spec_dirs: list[Path],
    hooks_dirs: list[Path],
    settings_file: Path,
    fmt: str,
    *,
    mounts_file: Path = Path("/proc/self/mounts"),
    containerd_config: Path | None = None,
    host_root: Path = Path("/"),
    containerd_socket: str = "",
) -> tuple[str, int]:
    """Run every check; return the report and the exit status (1 when any check failed).

    hooks.d (CRI-O, podman) and containerd are checked each; a node needs one of them, so the
    one that is not registered fails only when the other is not registered either."""
    config = containerd_config or _containerd_config(host_root)
    prefix = installed_prefix(str(Path(__file__).parent.parent))  # the hook package: this is hook/tools/
    containerd_check = check_containerd(config, prefix, stopped_ok=True, socket_path=containerd_socket)
    engines = [check_hooks(hooks_dirs), check_hooks_order(hooks_dirs, prefix), containerd_check]
    containerd = engines[2]
    used = containerd.ok and not containerd.detail.endswith("absent: containerd not configured on this node")
    if not engines[0].ok and used and not containerd.detail.startswith("installed but not running"):
        engines[0] = Check(engines[0].name, True, f"not used: {engines[0].detail} (containerd is registered)")
    checks = [
        check_driver(driver_root),
        check_cdi(spec_dirs),
        check_cgroup(mounts_file),
        *engines,
        *check_base_spec(config, prefix),
        check_settings(settings_file),
        check_kubelet(settings_file, host_root),
        check_kubelet_dra(settings_file, host_root),
        check_decider(),
    ]
    return render(checks, fmt), 0 if all(c.ok for c in checks) else 1
