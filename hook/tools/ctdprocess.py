"""Which config the node's containerd runs: from its process's command line, else from its unit.

Rule: read, never guess. A running ``containerd`` names its config with ``--config``/``-c`` (Go's
flag syntax: one or two dashes, the value after ``=`` or as the next word), else it reads
``/etc/containerd/config.toml``; k3s and rke2 start theirs with ``-c`` too. With none running,
the ``ExecStart`` of its systemd unit (drop-ins last, an empty ``ExecStart=`` resets) says the
same, or a k3s/rke2 unit says the rendered config is the one. Where none of these answers,
``hook doctor`` says it cannot tell.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hook.core.record import record

__all__ = ["Source", "running", "from_unit", "config_of", "likely_config", "started_at", "cri_socket"]

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_SOCKET = "/run/containerd/containerd.sock"
K3S_SOCKET = "/run/k3s/containerd/containerd.sock"
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
K3S_UNITS = {
    "k3s.service": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "k3s-agent.service": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "rke2-server.service": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
    "rke2-agent.service": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
}
CONFIG_FLAGS = ("c", "config")
ADDRESS_FLAGS = ("a", "address")


@record(kw_only=False)
class Source:
    """Where the answer came from (``pid 123``, ``containerd.service``), the config, the socket
    (``--address``; "" where the flag is not given), and when the process started (epoch seconds;
    0 where ``proc`` cannot tell, or for a unit)."""

    where: str
    config: str
    address: str = ""
    started: float = 0.0


def _flag(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of a Go-style flag (``-c X``, ``--config=X``, ...); the last one wins, as in Go."""
    value = None
    for i, arg in enumerate(argv):
        if not arg.startswith("-") or arg in ("-", "--"):
            continue
        name, eq, rest = arg.lstrip("-").partition("=")
        if name not in names:
            continue
        if eq:
            value = rest
        elif i + 1 < len(argv):
            value = argv[i + 1]
    return value


def config_of(argv: list[str]) -> tuple[str, str]:
    """(config, address) a containerd command line runs with."""
    return _flag(argv, CONFIG_FLAGS) or DEFAULT_CONFIG, _flag(argv, ADDRESS_FLAGS) or ""


SUBCOMMANDS = frozenset({"config", "publish", "oci-hook", "help", "h"})  # containerd's, which serve nothing


def _is_daemon(argv: list[str]) -> bool:
    """``containerd`` itself serving, not a shim and not a subcommand (``containerd config dump``)."""
    if not argv or argv[0].rsplit("/", 1)[-1] != "containerd":
        return False
    return not SUBCOMMANDS & set(argv[1:])


def running(proc: Path) -> list[Source]:
    """Every containerd daemon on the node, from ``proc`` (the node's procfs)."""
    found = []
    for cmdline in sorted(proc.glob("[0-9]*/cmdline"), key=lambda p: int(p.parent.name)):
        try:
            argv = [a.decode("utf-8", "replace") for a in cmdline.read_bytes().split(b"\0") if a]
        except OSError:
            continue  # ended meanwhile
        if _is_daemon(argv):
            config, address = config_of(argv)
            pid = cmdline.parent.name
            found.append(Source(f"pid {pid}", config, address, started_at(proc, pid)))
    return found


START_SLACK = 1.0  # /proc/stat's btime is whole seconds, rounded down: a start reads up to 1 s early


def started_at(proc: Path, pid: str) -> float:
    """When process ``pid`` started, in epoch seconds (boot time plus its ``starttime`` in clock
    ticks, USER_HZ 100 as Linux exports it), up to ``START_SLACK`` early; 0 where ``proc`` cannot
    tell. A file changed within the slack after it is not judged newer (no false alarm)."""
    try:
        boot = re.search(r"^btime (\d+)$", (proc / "stat").read_text(), re.M)
        line = (proc / pid / "stat").read_text()
    except OSError:
        return 0.0
    fields = line[line.rfind(")") + 2 :].split()
    if boot is None or len(fields) < 20 or not fields[19].isdigit():
        return 0.0
    return int(boot.group(1)) + int(fields[19]) / 100


def _exec_start(text: str, current: str) -> str:
    for line in text.splitlines():
        key, eq, value = line.strip().partition("=")
        if eq and key.strip() == "ExecStart":
            current = value.strip()  # empty: reset (a drop-in's first line)
    return current


def from_unit(host_root: Path) -> Source | None:
    """What containerd's systemd unit would start it with, or None where there is no unit."""
    for unit, rendered in K3S_UNITS.items():
        if any((host_root / d.lstrip("/") / unit).is_file() for d in UNIT_DIRS):
            return Source(unit, rendered)
    for d in UNIT_DIRS:
        path = host_root / d.lstrip("/") / "containerd.service"
        if not path.is_file():
            continue
        try:
            start = _exec_start(path.read_text(), "")
            for dropin in sorted((host_root / d.lstrip("/") / "containerd.service.d").glob("*.conf")):
                start = _exec_start(dropin.read_text(), start)
            argv = shlex.split(start.lstrip("-@+!:"))
        except (OSError, ValueError):
            return Source(f"{d}/containerd.service (unreadable ExecStart)", DEFAULT_CONFIG)
        config, address = config_of(argv)
        return Source(f"{d}/containerd.service", config, address)
    return None


def likely_config(host_root: Path) -> str:
    """With no process and no unit to ask: k3s's or rke2's rendered config where one is there (their
    agent runs containerd on it), else containerd's default."""
    return next((c for c in K3S_UNITS.values() if (host_root / c.lstrip("/")).is_file()), DEFAULT_CONFIG)


def _socket(endpoint: str) -> str:
    return endpoint.removeprefix("unix://")


def cri_socket(proc: Path, host_root: Path) -> tuple[str, str]:
    """(the CRI socket this node's kubelet uses, how that is known): its
    ``--container-runtime-endpoint``, else ``containerRuntimeEndpoint`` in the file its
    ``--config`` names, else k3s's or rke2's own containerd where their unit is there, else
    containerd's default socket (the kubelet's default too)."""
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            argv = [a.decode("utf-8", "replace") for a in cmdline.read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if not argv or argv[0].rsplit("/", 1)[-1] != "kubelet":
            continue
        where = f"the kubelet (pid {cmdline.parent.name})"
        endpoint = _flag(argv, ("container-runtime-endpoint",))
        if endpoint:
            return _socket(endpoint), f"{where}: --container-runtime-endpoint"
        config = _flag(argv, ("config",))
        try:
            text = (host_root / config.lstrip("/")).read_text() if config else ""
        except OSError:
            text = ""
        m = re.search(r"(?m)^containerRuntimeEndpoint:[ \t]*[\"']?([^\s\"'#]+)", text)
        if m:
            return _socket(m.group(1)), f"{where}: containerRuntimeEndpoint in {config}"
        return DEFAULT_SOCKET, f"{where}: no endpoint given, its default"
    unit = from_unit(host_root)
    if unit is not None and unit.where in K3S_UNITS:
        return K3S_SOCKET, f"{unit.where}'s own containerd"
    return DEFAULT_SOCKET, "no kubelet running: containerd's default socket"
