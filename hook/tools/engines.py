"""Engine registration as data: containerd's handlers read, hooks.d names and order, base specs.

Rule: pure functions of file contents; ``hook.tools.install`` reads and writes the files,
``hook.tools.doctor`` reports, ``hook.tools.ctdedit`` edits containerd's text line by line.

containerd facts (as ``nvidia-ctk runtime configure`` treats them, NVIDIA/nvidia-container-toolkit
pkg/config/engine/containerd/containerd.go): a missing or empty config means version 2; a
non-empty config without ``version`` is version 1 (not supported here); the CRI runtime plugin is
``io.containerd.grpc.v1.cri`` in version 2 and ``io.containerd.cri.v1.runtime`` from version 3;
a handler's runc binary is ``options.BinaryName`` of ``...containerd.runtimes.<handler>``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from hook.core.errors import InputError
from hook.core.record import record

__all__ = [
    "HOOKS_NAME",
    "LATE_HOOKS_NAME",
    "PRECREATE_NAME",
    "NVIDIA_HOOKS_NAMES",
    "Handler",
    "cri_plugin",
    "config_version",
    "handlers",
    "handlers_in",
    "runtimes_path",
    "hooks_file_name",
    "hooks_order",
    "StageHooks",
    "base_spec_hooks",
    "runs_after_nvidia",
]

RUNC_TYPES = frozenset({"io.containerd.runc.v2", "io.containerd.runc.v1", "io.containerd.runtime.v1.linux"})
DEFAULT_RUNTIME_TYPE = "io.containerd.runc.v2"
HOOKS_NAME = "oci-device-hook.json"
PRECREATE_NAME = "oci-device-hook-precreate.json"  # as packaging/engines ships it
LATE_HOOKS_NAME = "zz-oci-device-hook.json"  # sorts after NVIDIA's file: ours runs after its hook
NVIDIA_HOOKS_NAMES = ("oci-nvidia-hook.json", "nvidia-container-toolkit.json")


# --- containerd --------------------------------------------------------------------------------------


def config_version(doc: Mapping[str, Any], empty: bool) -> int:
    if empty:
        return 2
    v = doc.get("version", 1)
    return v if isinstance(v, int) and not isinstance(v, bool) else -1


def cri_plugin(version: int) -> str:
    return "io.containerd.grpc.v1.cri" if version == 2 else "io.containerd.cri.v1.runtime"


def runtimes_path(version: int) -> list[str]:
    return ["plugins", cri_plugin(version), "containerd", "runtimes"]


def _get(doc: Mapping[str, Any], path: Sequence[str]) -> Any:
    obj: Any = doc
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    return obj


@record(kw_only=False)
class Handler:
    """One containerd runtime handler and the runc binary it runs ("" = containerd's default, runc)."""

    name: str
    runtime_type: str
    binary: str
    default: bool
    base_spec: str = ""  # the handler's base_runtime_spec file ("" = containerd's built-in spec)


def parse(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, "", f"not valid TOML ({exc})") from None


def handlers(text: str, source: str, version: int | None = None) -> tuple[int, list[Handler]]:
    """The config's version and its runtime handlers (``[]`` where it defines none).

    ``version`` is the root config's for an imported file (containerd reads a drop-in's plugin
    names as its root's; ``hook.tools.ctdconfig`` checks the drop-in's own ``version`` agrees)."""
    doc = parse(text, source)
    if version is None:
        version = config_version(doc, not text.strip())
    if version not in (2, 3):
        raise InputError(source, "version", f"containerd config version {version} is not supported (2 or 3)")
    return version, handlers_in(doc, version)


def handlers_in(doc: Mapping[str, Any], version: int) -> list[Handler]:
    """The runtime handlers of a decoded config (or of a merged view of several)."""
    runtimes = _get(doc, runtimes_path(version)) or {}
    if not isinstance(runtimes, Mapping):
        return []
    default = _get(doc, ["plugins", cri_plugin(version), "containerd", "default_runtime_name"]) or "runc"
    out = []
    for name, body in runtimes.items():
        if not isinstance(body, Mapping):
            continue
        binary = _get(body, ["options", "BinaryName"])
        base = body.get("base_runtime_spec")
        out.append(
            Handler(
                name,
                str(body.get("runtime_type", "")),
                binary if isinstance(binary, str) else "",
                name == default,
                base if isinstance(base, str) else "",
            )
        )
    return out


# --- hooks.d -----------------------------------------------------------------------------------------


def hooks_file_name(names_present: Sequence[str]) -> str:
    """Our hooks.d file name: the contract's, unless an NVIDIA hook file would sort after it.

    Engines run the hooks of one stage in the order of their file names (lower-cased, across
    every hooks directory; containers/common oci-hooks(5)), and ours must run after NVIDIA's,
    which creates the nodes ours then narrows.
    """
    ours = HOOKS_NAME.lower()
    if any(n.lower() in NVIDIA_HOOKS_NAMES and n.lower() > ours for n in names_present):
        return LATE_HOOKS_NAME
    return HOOKS_NAME


def hooks_order(files: Mapping[str, Mapping[str, Any]], hook_paths: Sequence[str]) -> dict[str, list[str]]:
    """Stage → the hooks.d file names that run in it, in the engine's order (name, lower-cased).

    ``files`` maps a file name to its decoded JSON (the effective one: a later directory's file of
    the same name already replaced an earlier one). Only files naming our hook or an NVIDIA hook
    (``hook_paths`` plus any path containing ``nvidia``) are listed.
    """
    order: dict[str, list[str]] = {}
    for name in sorted(files, key=str.lower):
        doc = files[name]
        hook = doc.get("hook") if isinstance(doc, Mapping) else None
        path = hook.get("path", "") if isinstance(hook, Mapping) else ""
        if not isinstance(path, str) or not (path in hook_paths or "nvidia" in path):
            continue
        for stage in doc.get("stages") or ():
            order.setdefault(str(stage), []).append(name)
    return order


# --- OCI base runtime spec (containerd's base_runtime_spec) ------------------------------------------

# The stages our hook and NVIDIA's device hook run in, in the order runc runs them at create
# (each stage's entries in array order). Later stages (createContainer: nvidia-ctk's ldcache and
# symlink hooks) create no device nodes, so their order against ours does not matter.
SPEC_HOOK_STAGES = ("prestart", "createRuntime")


@record(kw_only=False)
class StageHooks:
    """Indexes, in one stage's hook array, of our hook's entries and of NVIDIA's."""

    ours: tuple[int, ...]
    nvidia: tuple[int, ...]


def _is_nvidia_hook(entry: Mapping[str, Any]) -> bool:
    """NVIDIA's hooks as its toolkit writes them: the legacy runtime hook binary, the toolkit's
    symlink to it, or an ``nvidia-ctk hook <name>`` (CDI-generated) entry."""
    path = entry.get("path")
    base = path.rsplit("/", 1)[-1] if isinstance(path, str) else ""
    if base in ("nvidia-container-runtime-hook", "nvidia-container-toolkit"):
        return True
    args = entry.get("args")
    return base == "nvidia-ctk" and isinstance(args, list) and "hook" in args[1:]


def base_spec_hooks(spec: Mapping[str, Any], hook_paths: Sequence[str]) -> dict[str, StageHooks]:
    """Stage → where our hook (``hook_paths``) and NVIDIA's sit in a base spec's ``hooks``.

    Only stages holding either are listed; malformed entries are skipped but keep their index.
    """
    hooks = spec.get("hooks") if isinstance(spec, Mapping) else None
    out: dict[str, StageHooks] = {}
    if not isinstance(hooks, Mapping):
        return out
    for stage in SPEC_HOOK_STAGES:
        entries = hooks.get(stage)
        if not isinstance(entries, list):
            continue
        ours, nvidia = [], []
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                continue
            if entry.get("path") in hook_paths:
                ours.append(i)
            elif _is_nvidia_hook(entry):
                nvidia.append(i)
        if ours or nvidia:
            out[stage] = StageHooks(tuple(ours), tuple(nvidia))
    return out


def runs_after_nvidia(found: Mapping[str, StageHooks]) -> bool | None:
    """Whether every entry of ours runs after every NVIDIA entry (stage order, then array order);
    ``None`` when the spec lacks one of the two, so there is no order to judge."""
    ours = [(SPEC_HOOK_STAGES.index(s), i) for s, h in found.items() for i in h.ours]
    theirs = [(SPEC_HOOK_STAGES.index(s), i) for s, h in found.items() for i in h.nvidia]
    if not ours or not theirs:
        return None
    return min(ours) > max(theirs)
