"""runc's reading of a command line: urfave/cli v1 over Go's ``flag`` package.

Rule: pure. Global flags stop at the first non-flag (the command); a flag is ``-name`` or
``--name``, its value ``=value`` or the next argument (bool flags take only ``=value``); ``--``
ends the flags; an unknown flag is an error. A command's flags may also follow its arguments:
urfave/cli moves them to the front first (``reorderArgs``). runc 1.1 vendors v1.22.1, which moves
every ``-x`` argument and the argument after one without ``=``; runc 1.2-1.4 vendor v1.22.14-17,
which moves only the command's own flags, and after them the next argument that is not one.
``bundle, b`` is one flag with two names; an empty bundle means the working directory.
``create``, ``run`` and ``restore`` need exactly one argument (the id). Before any command runs,
``--log-format`` must be empty, ``text`` or ``json``; the id is checked before a container is
made, but after config.json is read, so the wrapper checks it first: letters, digits and ``_+-.``
(1.1's pattern, word characters and the range from ``+`` to ``.``, also takes ``,``), never ``.``
or ``..``. (opencontainers/runc main.go ``configLogrus``, create.go, run.go, restore.go,
libcontainer/factory_linux.go ``validateID``; vendor/github.com/urfave/cli/command.go.)
"""

from __future__ import annotations

from hook.routes.runtimeargs.values import CREATES, ArgsError, Creates

TYPE_CHECKING = False  # collections.abc is not imported at run time: this is on every create's path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    Flags = Mapping[str, tuple[str, bool]]  # name -> (canonical name, takes a value)

__all__ = ["RUNC_GLOBAL", "RUNC_COMMAND", "RUNC_COMMAND_1_1", "read_runc_1_1", "read_runc_1_2"]

def _flags(*specs: str) -> dict[str, tuple[str, bool]]:
    """``"bundle,b=" "debug"``: names sharing one flag, ``=`` when it takes a value."""
    out: dict[str, tuple[str, bool]] = {}
    for spec in specs:
        takes = spec.endswith("=")
        names = spec.rstrip("=").split(",")
        for name in names:
            out[name] = (names[0], takes)
    return out


_HELP = ("help,h",)
RUNC_GLOBAL = _flags(
    "debug", "log=", "log-format=", "root=", "criu=", "systemd-cgroup", "rootless=", *_HELP, "version,v"
)
_RUNC_CREATE = (
    "bundle,b=",
    "console-socket=",
    "pidfd-socket=",
    "pid-file=",
    "no-pivot",
    "no-new-keyring",
    "preserve-fds=",
)
RUNC_COMMAND = {
    "create": _flags(*_RUNC_CREATE, *_HELP),
    "run": _flags(*_RUNC_CREATE, "detach,d", "keep", "no-subreaper", *_HELP),
    "restore": _flags(
        "console-socket=",
        "image-path=",
        "work-path=",
        "tcp-established",
        "ext-unix-sk",
        "shell-job",
        "file-locks",
        "manage-cgroups-mode=",
        "bundle,b=",
        "detach,d",
        "pid-file=",
        "no-subreaper",
        "no-pivot",
        "empty-ns=",
        "auto-dedup",
        "lazy-pages",
        "lsm-profile=",
        "lsm-mount-context=",
        *_HELP,
    ),
}
# runc 1.1 has no --pidfd-socket (added in 1.2)
RUNC_COMMAND_1_1 = {
    name: {k: v for k, v in flags.items() if k != "pidfd-socket"} for name, flags in RUNC_COMMAND.items()
}
_ID_1_2 = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-.")
_ID_1_1 = _ID_1_2 | {","}  # 1.1's `[\\w+-\\.]`: the range from + to . holds the comma too
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _go_parse(args: Sequence[str], flags: Flags) -> tuple[dict[str, str], list[str]]:
    """Go's ``flag.FlagSet.Parse``: the values (last one wins) and the arguments left."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if len(arg) < 2 or arg[0] != "-":
            break
        i += 1
        if arg == "--":
            break
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if not body or body[0] in "-=":
            raise ArgsError(f"bad flag syntax: {arg}")
        name, eq, value = body.partition("=")
        if name not in flags:
            raise ArgsError(f"flag provided but not defined: -{name}")
        canonical, takes = flags[name]
        if takes and not eq:
            if i >= len(args):
                raise ArgsError(f"flag needs an argument: -{name}")
            value = args[i]
            i += 1
        elif not takes:
            if eq and value not in _GO_TRUE | _GO_FALSE:
                raise ArgsError(f"invalid boolean value {value!r} for -{name}")
            value = "false" if eq and value in _GO_FALSE else "true"
        values[canonical] = value
    return values, list(args[i:])


def _reorder_v1_22_1(args: Sequence[str], flags: Flags) -> list[str]:
    """urfave/cli v1.22.1: every ``-x`` first, each with the non-dash argument after it."""
    moved: list[str] = []
    rest: list[str] = []
    value_next = False
    for i, arg in enumerate(args):
        if arg == "--":
            rest += args[i:]
            break
        if value_next and not arg.startswith("-"):
            value_next = False
            moved.append(arg)
            continue
        value_next = False
        if arg != "-" and arg.startswith("-"):
            moved.append(arg)
            value_next = "=" not in arg
        else:
            rest.append(arg)
    return moved + rest


def _is_flag(flags: Flags, arg: str) -> bool:
    if arg in ("-", "--") or not arg.startswith("-"):
        return False
    name = arg.replace("-", "", 2) if arg.startswith("--") else arg.replace("-", "", 1)
    return name.split("=")[0] in flags


def _reorder_v1_22_14(args: Sequence[str], flags: Flags) -> list[str]:
    """urfave/cli v1.22.14-17: the command's own flags first, each with the next non-flag argument."""
    moved: list[str] = []
    rest: list[str] = []
    value_next = False
    for i, arg in enumerate(args):
        if value_next and not _is_flag(flags, arg):
            value_next = False
            moved.append(arg)
        elif arg == "--":
            rest = ["--", *rest, *args[i + 1 :]]
            break
        elif _is_flag(flags, arg):
            moved.append(arg)
            value_next = "=" not in arg
        else:
            rest.append(arg)
    return moved + rest


def _read_runc(
    args: Sequence[str],
    reorder: Callable[[Sequence[str], Flags], list[str]],
    commands: Mapping[str, Flags],
    id_chars: frozenset[str],
) -> Creates | None:
    glob, rest = _go_parse(args, RUNC_GLOBAL)
    if glob.get("help") == "true" or glob.get("version") == "true" or not rest:
        return None  # help or version is printed; nothing runs
    if glob.get("log-format", "") not in ("", "text", "json"):
        raise ArgsError(f"invalid log-format: {glob['log-format']}")
    command, tail = rest[0], rest[1:]
    if command not in CREATES:
        return None
    flags = commands[command]
    values, positional = _go_parse(reorder(tail, flags), flags)
    if values.get("help") == "true":
        return None
    if len(positional) != 1:
        raise ArgsError(f'"{command}" requires exactly 1 argument(s)')
    if not (positional[0] not in (".", "..") and positional[0] and set(positional[0]) <= id_chars):
        raise ArgsError(f"invalid id format: {positional[0]!r}")
    return Creates(
        command=command,
        bundle=values.get("bundle", ""),
        ident=positional[0],
        log=glob.get("log", ""),
        log_format=glob.get("log-format", ""),
        cgroup_manager="systemd" if glob.get("systemd-cgroup") == "true" else "cgroupfs",
    )


def read_runc_1_1(args: Sequence[str]) -> Creates | None:
    """runc 1.1 (urfave/cli v1.22.1)."""
    return _read_runc(args, _reorder_v1_22_1, RUNC_COMMAND_1_1, _ID_1_1)


def read_runc_1_2(args: Sequence[str]) -> Creates | None:
    """runc 1.2-1.4 (urfave/cli v1.22.14-17). A flag one version lacks (``--criu`` is gone in 1.4)
    is read here all the same: that version rejects a command line carrying it."""
    return _read_runc(args, _reorder_v1_22_14, RUNC_COMMAND, _ID_1_2)
