"""Host readiness checklist (``hook doctor``): driver, CDI specs, cgroups, registration, settings.

Rule: every check reads the host, never changes it, and returns one ``Check`` (name, ok,
detail, fix); a check never raises. Optional parts of the hook (CDI registry, BPF syscalls)
are imported lazily, so the doctor still runs, and says so, when one is missing. The run
fails (exit 1) when any check fails.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from hook.tools.checks import LIBEXEC, Check, render
from hook.tools.doctorcrun import crun_line
from hook.tools.doctorctd import check_base_spec, check_node
from hook.tools.doctorhooks import check_hooks, check_hooks_order
from hook.tools.doctornri import nri_checks
from hook.tools.doctorpython import check_interpreter

REQUIRED_MAJORS = ("nvidia", "nvidia-uvm", "nvidia-caps")


CGROUP_ROOT = "/sys/fs/cgroup"


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
    there but does not answer or prove the node key, or is another version, fails: each
    container then pays a failed attempt before it is decided in-process."""
    from hook.core.version import VERSION
    from hook.routes import client

    got = client.status()
    where = client.where()
    if isinstance(got, str):
        if got.startswith("no decider socket"):
            fix = "systemctl enable --now oci-device-hook-decider (faster starts)"
            return Check("decider", True, f"not running ({got}): containers are decided in-process", fix)
        return Check("decider", False, f"{where}: {got}", "systemctl restart oci-device-hook-decider")
    detail = (
        f"answering: version {got.get('version')}, pid {got.get('pid')}, up {got.get('uptime_s')} s, "
        f"{got.get('requests')} request(s), {got.get('declined')} declined"
    )
    if got.get("unauthenticated"):  # requests without the node key: something on this node tried
        detail += f", {got.get('unauthenticated')} without the node key (a container reaching /run?)"
    if got.get("version") != VERSION:
        return Check(
            "decider", False, f"{detail}; this hook is {VERSION}", "systemctl restart oci-device-hook-decider"
        )
    return Check("decider", True, detail)


def check_kubelet(settings_file: Path, root: Path = Path("/")) -> Check:
    """The checkpoint the hook reads is where this node's kubelet writes it (hook.tools.kubeletcheck)."""
    from hook.tools.kubeletcheck import kubelet_coverage

    return Check("kubelet", *kubelet_coverage(settings_file, root))


def check_kubelet_dra(settings_file: Path, root: Path = Path("/")) -> Check:
    """The kubelet's DRA state the hook reads is where this node's kubelet writes it, and reads."""
    from hook.tools.kubeletcheck import dra_coverage

    return Check("kubelet DRA", *dra_coverage(settings_file, root))


def _driver(driver_root: Path, settings: Check, settings_file: Path, given: bool) -> Check:
    """The driver line; where the settings file that names the driver root does not load (and no
    ``--driver-root`` was given), a driver not found at the default root is the file's fault, not
    the driver's: the line says so rather than "driver missing"."""
    check = check_driver(driver_root)
    if check.ok or settings.ok or given:
        return check
    why = f"not judged: {settings_file} does not load, so its driver_root is unknown (see settings)"
    return Check("driver", False, f"{why}; at {driver_root}: {check.detail}", f"fix {settings_file} first")


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
    proc: Path | None = None,
    driver_root_given: bool = True,
) -> tuple[str, int]:
    """Run every check; return the report and the exit status (1 when any check failed).

    hooks.d (CRI-O, podman) and containerd are checked each; a node needs one of them, so the
    one that is not registered fails only when the other is not registered either. containerd is
    judged on the config its running process (``proc``, the node's procfs) or its unit names."""
    prefix = installed_prefix(str(Path(__file__).parent.parent))  # the hook package: this is hook/tools/
    containerd, config = check_node(host_root, proc or host_root / "proc", prefix, containerd_config)
    engines = [check_hooks(hooks_dirs), check_hooks_order(hooks_dirs, prefix), containerd]
    used = containerd.ok and not containerd.warn and config.exists()
    nri, on_nri = nri_checks(
        host_root, proc or host_root / "proc", config, settings_file, used, engines[0].ok
    )
    if on_nri and not containerd.ok:  # the operator chose the NRI route for containerd
        engines[2] = Check("containerd", True, f"not used: {containerd.detail} (the NRI route decides)")
    if not engines[0].ok and (used or on_nri):
        engines[0] = Check(engines[0].name, True, f"not used: {engines[0].detail} (containerd is registered)")
    settings = check_settings(settings_file)
    checks = [
        _driver(driver_root, settings, settings_file, driver_root_given),
        check_cdi(spec_dirs),
        check_cgroup(mounts_file),
        *engines,
        *nri,
        *check_base_spec(config, prefix),
        settings,
        check_kubelet(settings_file, host_root),
        check_kubelet_dra(settings_file, host_root),
        check_decider(),
        crun_line(driver_root, host_root, settings_file),
        check_interpreter(),
    ]
    return render(checks, fmt), 0 if all(c.ok for c in checks) else 1
