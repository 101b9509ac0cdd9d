"""Operator settings (``/etc/oci-device-hook/config.yaml``): validated once, defaults when absent.

Rule: an unknown key or a bad value is an ``InputError`` naming the key; a missing file means
defaults. Settings come only from the host (``--config``), never from a container's env.
"""

from __future__ import annotations

import stat as _stat
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

from hook.core.errors import InputError
from hook.core.record import field, fields, record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "Policy",
    "MigManagement",
    "EnvRequests",
    "Settings",
    "DEFAULT_PATH",
    "parse_settings",
    "load_settings",
    "digest",
    "salvage_log",
    "check_file",
]

DEFAULT_PATH = Path("/etc/oci-device-hook/config.yaml")
MAX_BYTES = 1 << 20
FASTPATH_MAX = 256 << 10


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

    @property
    def default_cdi_kind(self) -> str:
        return self.cdi_kinds[0]

    @property
    def dra_state_path(self) -> str:
        """The kubelet's DRA state: the setting, else beside the checkpoint's ``device-plugins/``."""
        if self.kubelet_dra_state:
            return self.kubelet_dra_state
        from hook.sources.kubelet.dra import default_path

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


def _convert(key: str, value: Any, source: str) -> Any:
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


def _collect(obj: Any, source: str) -> tuple[dict[str, Any], list[InputError]]:
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
            converted = _convert(key, value, source)
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
    values, errors = _collect(obj, source)
    if errors:
        raise errors[0]
    return Settings(**values)


def check_file(path: Path) -> list[InputError]:
    """Every error in a settings file (``hook settings check``): all bad keys and values at once;
    a file that cannot be read or is not YAML is one error."""
    try:
        data = _read_file(path)
    except FileNotFoundError:
        return [InputError(str(path), "", "no such file")]
    except OSError as exc:
        return [InputError(str(path), "", exc.strerror or str(exc))]
    except InputError as exc:
        return [exc]
    try:
        doc = parse_yaml(data, str(path))
    except InputError as exc:
        return [exc]
    return [] if doc is None else _collect(doc, str(path))[1]


def _read_file(path: Path) -> bytes:
    """The settings file's bytes; never blocks on a FIFO, never reads a huge file."""
    import os

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except ValueError:
        raise InputError(str(path), "", "path contains a NUL byte") from None
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise InputError(str(path), "", "not a regular file")
        if st.st_size > MAX_BYTES:
            raise InputError(str(path), "", f"larger than {MAX_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)


def load_settings(path: Path, *, required: bool = False) -> Settings:
    """Read and validate the settings file; a missing default file means defaults.

    The live hook compiles a custom file into ``FASTPATH_CACHE`` (see ``remember_for_fast_path``),
    so a later container reads that JSON instead of importing yaml; a stale entry is ignored.
    The decider keeps the result while the file's identity holds (``hook.sources.warm``).
    """
    from hook.sources import warm

    return warm.remembered(
        ("settings", str(path), required), warm.identity(path), lambda: _load_settings(path, required)
    )


def _load_settings(path: Path, required: bool) -> Settings:
    try:
        data = _read_file(path)
    except FileNotFoundError:
        if required:
            raise InputError(str(path), "", "no such file") from None
        return Settings()
    except OSError as exc:
        raise InputError(str(path), "", exc.strerror or str(exc)) from None
    compiled = _compiled(path)
    if compiled is not None:
        return compiled
    return parse_settings(parse_yaml(data, str(path)), str(path))


def salvage_log(path: Path) -> Settings:
    """Where a settings file that does not load still says the log goes: defaults, but with its
    ``log_file`` / ``log_max_bytes`` when those two are readable and valid (a file broken
    elsewhere, or YAML that does not parse but holds one plain top-level ``log_file: /path``
    line). The error about the file then reaches the operator's log, not the default one."""
    import re

    try:
        data = _read_file(path)
    except (OSError, InputError):
        return Settings()
    values: dict[str, Any] = {}
    try:
        doc = parse_yaml(data, str(path))
    except InputError:
        text = data.decode("utf-8", "replace")
        found = re.findall(r"(?m)^log_file:[ \t]*(/[^\s#'\"]+)[ \t]*(?:#.*)?$", text)
        doc = {"log_file": found[0]} if len(found) == 1 else None
    if isinstance(doc, dict):
        for key in ("log_file", "log_max_bytes"):
            if key in doc:
                try:  # noqa: SIM105 - contextlib would be one more import on the error path
                    values[key] = _convert(key, doc[key], str(path))
                except InputError:
                    pass
    return Settings(**values)


def parse_yaml(data: bytes, source: str) -> Any:
    """Decode a settings document; a duplicate key is an error (YAML would keep the last silently)."""
    import yaml  # only containers that reach the slow path pay for it

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[object] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    line = key_node.start_mark.line + 1
                    raise InputError(source, str(key), f"duplicate key (line {line})")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(data, Loader=Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise InputError(source, where, f"not valid YAML ({getattr(exc, 'problem', exc)})") from None


def _compiled(path: Path) -> Settings | None:
    """The settings compiled from this very file (same path and identity), or None; a record
    this hook cannot read back (planted, or another version's) is a miss like any other."""
    import os

    from hook.routes.fastpath import fastpath_record

    directory, name = os.path.split(str(FASTPATH_CACHE))
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    entry = fastpath_record(_cachefile().read(directory, name, FASTPATH_MAX), str(path), st)
    if entry is None:
        return None
    try:
        return parse_settings(entry["settings"], str(path))
    except InputError:
        return None


def _cachefile() -> Any:
    from hook.sources import cachefile

    return cachefile


def _document(settings: Settings) -> dict[str, object]:
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

    text = json.dumps(_document(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


FASTPATH_CACHE = Path("/run/oci-device-hook/fastpath.json")
FASTPATH_ENTRIES = 16  # settings files remembered at once (engines, test runs); the oldest goes


def remember_for_fast_path(path: Path, settings: Settings) -> str | None:
    """Compile what ``hook.routes.fastpath`` needs from a custom settings file, keyed by its
    path and identity; other files' entries stay (up to ``FASTPATH_ENTRIES``).

    Returns a warning text instead of raising: a missing cache only costs speed, never a decision.
    """
    import json
    import os

    from hook.routes.fastpath import FASTPATH_FORMAT, loads, settings_identity

    if _compiled(path) is not None:
        return None  # already compiled from this very file: nothing to write
    directory, name = os.path.split(str(FASTPATH_CACHE))
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:
        return f"{path}: {getattr(exc, 'strerror', None) or exc}"
    cachefile = _cachefile()
    files: dict[str, Any] = {}
    old = cachefile.read(directory, name, FASTPATH_MAX)
    try:
        doc: Any = loads(old) if old is not None else None
        if cachefile.current(doc, "fastpath", FASTPATH_FORMAT) and isinstance(doc["files"], dict):
            files = dict(doc["files"])
    except Exception:  # an unreadable record is simply replaced
        files = {}
    key = os.path.abspath(path)
    files.pop(key, None)
    files[key] = {
        "key": settings_identity(str(path), st),
        "cdi_annotation_prefixes": list(settings.cdi_annotation_prefixes),
        "volume_mount_root": settings.volume_mount_root,
        "settings": _document(settings),
    }
    while len(files) > FASTPATH_ENTRIES:
        files.pop(next(iter(files)))
    record = {**cachefile.stamp("fastpath", FASTPATH_FORMAT), "files": files}
    return cachefile.write(directory, name, json.dumps(record).encode())  # type: ignore[no-any-return]
