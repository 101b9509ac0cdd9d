"""Console entry: the live hook a runtime runs for every container, and the door to the CLI.

Rule: this module is on every container's start path, so at import it pulls in only ``json``,
``os`` and ``sys``. A container that asks for no device and is not widened is answered from
the raw JSON here; everything else (dataclasses, yaml, click, pynvml) loads only when needed.
"""

from __future__ import annotations

import json
import os
import sys

TOOLS = frozenset({"inventory", "cdi", "doctor"})
LIVE_STAGES = frozenset({"prestart", "createRuntime"})
OTHER_STAGES = frozenset({"createContainer", "startContainer", "poststart", "poststop"})
VALUE_OPTIONS = frozenset({"--config", "--driver-root", "--cdi-spec-dir", "--inventory", "--format"})
DEFAULT_SETTINGS = "/etc/oci-device-hook/config.yaml"
MAX_STATE = 1 << 20
MAX_CONFIG = 16 << 20
NVIDIA_ENVS = ("NVIDIA_VISIBLE_DEVICES=", "NVIDIA_MIG_CONFIG_DEVICES=", "NVIDIA_MIG_MONITOR_DEVICES=")
# Nodes every engine may add to any container; anything else in linux.devices takes the slow path.
PLAIN_NODES = frozenset(
    {
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
        "/dev/console",
        "/dev/ptmx",
        "/dev/fuse",
        "/dev/net/tun",
        "/dev/kvm",
    }
)


def _split(argv: list[str]) -> tuple[dict[str, list[str]], list[str]] | None:
    """Parse live-mode argv without argparse; ``None`` means "not live mode" (the CLI handles it)."""
    opts: dict[str, list[str]] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in VALUE_OPTIONS:
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            opts.setdefault(name, []).append(value)
        elif arg.startswith("-"):
            return None  # --bundle, --help, --state, ...: the CLI's business
        else:
            positional.append(arg)
        i += 1
    if len(positional) > 1 or (positional and positional[0] in TOOLS):
        return None
    return opts, positional


def _read(fd_or_path: int | str, limit: int) -> bytes:
    with open(fd_or_path, "rb", closefd=not isinstance(fd_or_path, int)) as f:
        data = f.read(limit + 1)
    if len(data) > limit and not isinstance(fd_or_path, int):
        raise ValueError(f"larger than {limit} bytes")
    return data


def _plain_settings(path: str) -> bool:
    """True when the settings file is absent or all comments: defaults apply, no yaml needed."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return all(
        not line.strip() or line.lstrip().startswith(b"#") or line.strip() == b"---"
        for line in text.splitlines()
    )


def needs_decision(config: dict, annotations: dict) -> bool:
    """A cheap superset of "this container asks for a device or is widened"; false means nothing to do."""
    linux = config.get("linux") or {}
    for rule in (linux.get("resources") or {}).get("devices") or ():
        if isinstance(rule, dict) and rule.get("allow") is True and rule.get("type") in (None, "", "a"):
            return True
    for dev in linux.get("devices") or ():
        if not isinstance(dev, dict) or os.path.normpath(str(dev.get("path", ""))) not in PLAIN_NODES:
            return True
    for key in list(annotations) + list(config.get("annotations") or {}):
        if isinstance(key, str) and key.startswith("cdi.k8s.io/"):
            return True
    for m in config.get("mounts") or ():
        if isinstance(m, dict) and "nvidia-container-devices" in str(m.get("destination", "")):
            return True
    for entry in (config.get("process") or {}).get("env") or ():
        if isinstance(entry, str) and entry.startswith(NVIDIA_ENVS):
            value = entry.partition("=")[2].strip()
            if value and value != "void":
                return True
    return False


def _fast_path(opts: dict[str, list[str]], stdin: bytes) -> bool:
    """Answer "nothing to do" from raw JSON, or return False to take the full path.

    Any doubt (unreadable input, custom settings) returns False: the full path then reports it
    properly, with the file and the field.
    """
    if len(stdin) > MAX_STATE or not _plain_settings((opts.get("--config") or [DEFAULT_SETTINGS])[-1]):
        return False
    try:
        state = json.loads(stdin)
        bundle = state.get("bundle") or state.get("bundlePath")
        config = json.loads(_read(os.path.join(bundle, "config.json"), MAX_CONFIG))
        annotations = state.get("annotations") or {}
        if not isinstance(config, dict) or not isinstance(annotations, dict):
            return False
        return not needs_decision(config, annotations)
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parsed = _split(argv)
    if parsed is None:
        from hook.cli import run

        return run(argv)
    opts, positional = parsed
    stage = positional[0] if positional else "prestart"
    if stage in OTHER_STAGES:
        return 0
    if stage not in LIVE_STAGES:
        sys.stderr.write(f"hook: unknown stage {stage!r} (expected prestart or createRuntime)\n")
        return 2
    try:
        stdin = _read(0, MAX_STATE * 2)
    except (OSError, ValueError):
        stdin = b""
    if _fast_path(opts, stdin):
        return 0
    from hook.live import run_live

    return run_live(opts, stdin)


if __name__ == "__main__":
    sys.exit(main())
