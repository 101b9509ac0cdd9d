"""Operator settings as a value: every key's type and default, and the one way a document becomes Settings.

Rule: an unknown key or a bad value is an ``InputError`` naming the key. Settings come only from
the host (the file ``hook.sources.settingsfile`` reads), never from a container's env. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from hook.core.errors import InputError
from hook.core.record import field, fields, record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "Policy",
    "DeciderMode",
    "MigManagement",
    "EnvRequests",
    "Settings",
    "parse_settings",
    "collect",
    "convert",
    "document",
    "digest",
]


class Policy(StrEnum):
    NARROW = "narrow"
    REJECT = "reject"
    AUDIT = "audit"


class DeciderMode(StrEnum):
    """Whether ``hook serve`` serves this node (docs/interface.md: the shared contract's setting)."""

    AUTO = "auto"  # serve; the hook asks the decider when it answers
    OFF = "off"  # ``hook serve`` exits at start and a running one declines: every hook decides in-process


class EnvRequests(StrEnum):
    """When a visible-devices env counts as a request (docs/operators.md, "Env requests")."""

    AUTO = "auto"  # Kubernetes containers: only with the kubelet's word; others: always
    ALWAYS = "always"
    NEVER = "never"  # unprivileged: only when corroborated


class MigManagement(StrEnum):
    REQUIRE_SYS_ADMIN = "require_sys_admin"
    PRIVILEGED = "privileged"
    NEVER = "never"


# Namespaces of NVIDIA's own cluster components (device plugin, GPU feature discovery, DCGM
# exporter) that see every GPU by env without allocating one: gpu-operator (GPU operator Helm
# quickstart), nvidia-gpu-operator (its OpenShift install), nvidia-device-plugin (the device
# plugin's Helm README) and kube-system (k8s-device-plugin deployments/static/nvidia-device-plugin.yml).
DEFAULT_TRUSTED_NAMESPACES: tuple[str, ...] = (
    "gpu-operator",
    "nvidia-gpu-operator",
    "nvidia-device-plugin",
    "kube-system",
)

# Device-plugin resources that are GPUs of the visible-devices env's vendor (NVIDIA): only an
# allocation of one of these vouches for NVIDIA_VISIBLE_DEVICES (a NIC's entry does not).
DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")

# Accelerator node patterns per vendor (fnmatch, relative to /dev): the nodes each vendor's device
# plugin hands a container (NVIDIA k8s-device-plugin, ROCm k8s-device-plugin, Intel's device plugins,
# Ascend, Hygon, Iluvatar, T-Head, Cambricon, Moore Threads).
DEFAULT_ACCELERATOR_NODES: Mapping[str, tuple[str, ...]] = {
    "nvidia": ("nvidia[0-9]*", "nvidia-caps/*", "nvidia-caps-imex-channels/*"),
    "amd": ("dri/renderD*", "dri/card*"),  # /dev/kfd is node-global: a control node, kept
    "intel": ("dri/*",),
    "ascend": ("davinci[0-9]*",),
    "hygon": ("mkfd",),
    "iluvatar": ("iluvatar[0-9]*",),
    "thead": ("alixpu_ppu*",),
    "cambricon": ("cambricon_dev*", "cambricon_ipcm*"),
    "mthreads": ("mtgpu.*",),
}

# Plugin-only env siblings that corroborate a visible-devices env (HAMi, MPS, gpustack).
DEFAULT_CORROBORATING_ENV: tuple[str, ...] = (
    "CUDA_DEVICE_MEMORY_LIMIT*",
    "CUDA_DEVICE_SM_LIMIT*",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_MPS_PIPE_DIRECTORY",
    "VROCM_*",
)


@record
class Settings:
    privileged_allocation: Policy = Policy.NARROW
    cdi_annotation_prefixes: tuple[str, ...] = ("cdi.k8s.io/",)
    volume_mount_root: str = "/var/run/nvidia-container-devices"
    kubelet_checkpoint: str = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    kubelet_dra_state: str = ""  # "": dra_manager_state in kubelet_checkpoint's kubelet root dir
    corroborating_env: tuple[str, ...] = DEFAULT_CORROBORATING_ENV
    accelerator_nodes: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(DEFAULT_ACCELERATOR_NODES)
    )
    cdi_kinds: tuple[str, ...] = ("nvidia.com/gpu",)
    env_requests: EnvRequests = EnvRequests.AUTO
    env_trusted_namespaces: tuple[str, ...] = DEFAULT_TRUSTED_NAMESPACES
    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    mig_management: MigManagement = MigManagement.REQUIRE_SYS_ADMIN
    cap_access: str = "r"
    log_file: str = "/var/log/oci-device-hook.log"
    log_max_bytes: int = 10 << 20
    cache_dir: str = "/run/oci-device-hook"
    runtime: str = "runc"  # the real runtime the wrapper execs (a name on PATH or an absolute path)
    driver_root: str = "/"  # --driver-root wins when given
    cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")  # --cdi-spec-dir wins when given
    decider: DeciderMode = DeciderMode.AUTO
    metrics_textfile: str = ""  # "": none; `hook metrics --textfile` writes it (a *.prom file or its dir)
    nri_socket: str = "/var/run/nri/nri.sock"  # `hook nri`: the runtime's NRI socket (it listens)
    nri_plugin_name: str = "oci-device-hook"  # `hook nri` registers as <index>-<name> (required_plugins)
    nri_plugin_index: str = "90"  # two digits; plugins are called in index order: after injectors

    @property
    def default_cdi_kind(self) -> str:
        return self.cdi_kinds[0]

    @property
    def dra_state_path(self) -> str:
        """The kubelet's DRA state: the setting, else beside the checkpoint's ``device-plugins/``."""
        if self.kubelet_dra_state:
            return self.kubelet_dra_state
        from hook.core.claims import default_path

        return default_path(self.kubelet_checkpoint)


def _str_list(key: str, value: Any, source: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InputError(source, key, "expected a list of non-empty strings")
    return tuple(value)


def _enum(cls: type[StrEnum], key: str, value: Any, source: str) -> StrEnum:
    try:
        return cls(value)
    except ValueError:
        choices = " | ".join(m.value for m in cls)
        raise InputError(source, key, f"expected one of {choices}, got {value!r}") from None


def convert(key: str, value: Any, source: str) -> Any:
    """Type-check one key; tables of converters keep each rule on one line."""
    if key == "privileged_allocation":
        return _enum(Policy, key, value, source)
    if key == "mig_management":
        return _enum(MigManagement, key, value, source)
    if key == "env_requests":
        return _enum(EnvRequests, key, value, source)
    if key == "decider":  # YAML 1.1 reads a bare ``off`` as false: the operator wrote "off"
        return _enum(DeciderMode, key, "off" if value is False else value, source)
    if key in ("cdi_annotation_prefixes", "corroborating_env", "cdi_kinds", "gpu_resources"):
        items = _str_list(key, value, source)
        if not items:
            raise InputError(source, key, "must not be empty")
        if key == "cdi_kinds":
            for kind in items:
                vendor, slash, cls = kind.partition("/")
                if not (vendor and slash and cls) or "/" in cls:
                    raise InputError(source, key, f"{kind!r} is not vendor/class (e.g. nvidia.com/gpu)")
        return items
    if key == "env_trusted_namespaces":
        return _str_list(key, value, source)  # empty: no namespace is trusted
    if key == "accelerator_nodes":
        if not isinstance(value, dict):
            raise InputError(source, key, "expected a map of vendor to a list of patterns")
        return {str(k): _str_list(f"{key}.{k}", v, source) for k, v in value.items()}
    if key == ALIAS:
        if not isinstance(value, bool):
            raise InputError(source, key, "expected true or false")
        return EnvRequests.ALWAYS if value else EnvRequests.NEVER
    if key == "cap_access":
        if value not in ("r", "rw"):
            raise InputError(source, key, "expected r or rw")
        return value
    if key == "runtime":
        return _runtime(value, source)
    if key == "nri_plugin_name":
        if not isinstance(value, str) or not value or not set(value) <= NAME_CHARS or len(value) > 64:
            raise InputError(source, key, "expected a plugin name (letters, digits, _.-; at most 64)")
        return value
    if key == "nri_plugin_index":
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 99:
            value = f"{value:02d}"
        if not isinstance(value, str) or len(value) != 2 or not value.isdigit():
            raise InputError(source, key, "expected two digits, 00 to 99")
        return value
    if key == "metrics_textfile" and value == "":
        return value  # no textfile (the default)
    if key == "kubelet_dra_state" and value == "":
        return value  # derived from kubelet_checkpoint (the default, as settings documents write it)
    if key == "cdi_spec_dirs":
        dirs = value if isinstance(value, list) else None
        if dirs is None or not all(isinstance(d, str) and d.startswith("/") for d in dirs):
            raise InputError(source, key, "expected a list of absolute paths")
        return tuple(dirs)
    if key == "log_max_bytes":
        if not isinstance(value, int) or isinstance(value, bool) or value < 4096:
            raise InputError(source, key, "expected an integer >= 4096")
        return value
    if not isinstance(value, str) or not value.startswith("/"):
        raise InputError(source, key, "expected an absolute path")
    return value


# What the runtime wrapper (packaging/runtime, POSIX sh) can read back without a YAML parser.
NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
RUNTIME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-/")


def _runtime(value: Any, source: str) -> str:
    """One plain word: the wrapper reads this key with a shell loop, so both must agree on it."""
    if not isinstance(value, str) or not value or not set(value) <= RUNTIME_CHARS:
        raise InputError(source, "runtime", "expected a name or an absolute path (letters, digits, _.+-/)")
    if "/" in value and not value.startswith("/"):
        raise InputError(source, "runtime", "expected a name on PATH or an absolute path")
    return value


# NVIDIA's name for the same choice, kept as an alias: true = always, false = never.
ALIAS = "accept_envvar_when_unprivileged"
_KEYS = frozenset(f.name for f in fields(Settings)) | {ALIAS}


def _unknown(key: object, source: str) -> InputError:
    """An unknown key, with the closest known one when there is one (as ``hook doctr`` is answered)."""
    from difflib import get_close_matches

    close = get_close_matches(str(key), sorted(_KEYS), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InputError(source, str(key), f"unknown setting{hint}")


def collect(obj: Any, source: str) -> tuple[dict[str, Any], list[InputError]]:
    """Every key's value and every key's error, in the file's order."""
    if not isinstance(obj, dict):
        return {}, [InputError(source, "", "expected a mapping of settings")]
    values: dict[str, Any] = {}
    errors: list[InputError] = []
    for key, value in obj.items():
        if key not in _KEYS:
            errors.append(_unknown(key, source))
            continue
        name = "env_requests" if key == ALIAS else key
        try:
            converted = convert(key, value, source)
        except InputError as exc:
            errors.append(exc)
            continue
        if name in values and values[name] != converted:
            errors.append(
                InputError(source, key, f"contradicts env_requests: {values[name]}; set only env_requests")
            )
            continue
        values[name] = converted
    return values, errors


def parse_settings(obj: Any, source: str) -> Settings:
    """Build Settings from a decoded YAML document (None = empty file = defaults); the first error raises."""
    if obj is None:
        return Settings()
    values, errors = collect(obj, source)
    if errors:
        raise errors[0]
    return Settings(**values)


def document(settings: Settings) -> dict[str, object]:
    """Settings back as a document ``parse_settings`` accepts (JSON types only)."""
    doc: dict[str, object] = {}
    for f in fields(Settings):
        value = getattr(settings, f.name)
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = {k: list(v) for k, v in value.items()}
        elif isinstance(value, StrEnum):
            value = value.value
        doc[f.name] = value
    return doc


def digest(settings: Settings) -> str:
    """SHA-256 of the settings' values (not the file's bytes: a comment or key order changes nothing
    a decision reads), for the precreate marker (``hook.adapters.marker.binding``)."""
    import hashlib
    import json

    text = json.dumps(document(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
