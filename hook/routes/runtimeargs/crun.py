"""crun's reading of a command line: glibc's argp (``getopt_long``, ``ARGP_IN_ORDER``).

Rule: pure. Parsing stops at the first non-option (the command, then the id); long options may
be shortened to any unambiguous prefix (``--bun=X``); short options cluster and take their value
attached (``-bX``) or as the next argument; ``-f``/``--config`` names another config file than
``config.json``. Options act in order, as argp calls crun's handler: ``--help``, ``--usage`` and
``--version`` print and exit there; ``--cgroup-manager`` takes ``systemd``, ``cgroupfs`` or
``disabled`` and ``--log-level`` (1.21 on) ``error``, ``warning`` or ``debug``, anything else
fails at once; ``--systemd-cgroup`` is ``--cgroup-manager=systemd``. ``--log-format`` must be
``text`` or ``json`` (checked before config.json is read). (containers/crun src/crun.c
``parse_opt``, ``init_libcrun_context``, create.c, run.c, restore.c, src/libcrun/error.c
``libcrun_set_log_format``.)
"""

from __future__ import annotations

from hook.routes.runtimeargs.values import CREATES, ArgsError, Creates

TYPE_CHECKING = False  # collections.abc is not imported at run time: this is on every create's path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    Long = Mapping[str, tuple[str, str]]  # long name -> (key, "" none | ":" required | "::" optional)

__all__ = ["CRUN_GLOBAL", "CRUN_GLOBAL_1_8", "CRUN_COMMAND", "read_crun", "read_crun_1_8"]

# short options: key -> the same argument kinds as Long's
_ARGP_DEFAULT = {
    "help": ("?", ""),
    "usage": ("usage", ""),
    "program-name": ("program-name", ":"),
    "HANG": ("HANG", "::"),
}
CRUN_GLOBAL = {
    "debug": ("debug", ""),
    "cgroup-manager": ("cgroup-manager", ":"),
    "systemd-cgroup": ("systemd-cgroup", ""),
    "log": ("log", ":"),
    "log-format": ("log-format", ":"),
    "log-level": ("log-level", ":"),
    "root": ("root", ":"),
    "rootless": ("rootless", ":"),
    "version": ("v", ""),
    **_ARGP_DEFAULT,
}
CRUN_GLOBAL_SHORT = {"v": "", "V": "", "?": ""}
_CRUN_CREATE = {
    "bundle": ("b", ":"),
    "config": ("f", ":"),
    "console-socket": ("console-socket", ":"),
    "preserve-fds": ("preserve-fds", ":"),
    "no-pivot": ("no-pivot", ""),
    "pid-file": ("pid-file", ":"),
    "no-subreaper": ("no-subreaper", ""),
    "no-new-keyring": ("no-new-keyring", ""),
    **_ARGP_DEFAULT,
}
CRUN_COMMAND: dict[str, tuple[Long, dict[str, str], tuple[int, int]]] = {
    "create": (_CRUN_CREATE, {"b": ":", "f": ":", "?": ""}, (1, 1)),
    "run": (
        {**_CRUN_CREATE, "detach": ("d", ""), "keep": ("keep", "")},
        {"b": ":", "f": ":", "d": "", "?": ""},
        (1, 1),
    ),
    "restore": (
        {
            "bundle": ("b", ":"),
            "image-path": ("image-path", ":"),
            "work-path": ("work-path", ":"),
            "tcp-established": ("tcp-established", ""),
            "tcp-close": ("tcp-close", ""),
            "ext-unix-sk": ("ext-unix-sk", ""),
            "shell-job": ("shell-job", ""),
            "detach": ("d", ""),
            "pid-file": ("pid-file", ":"),
            "console-socket": ("console-socket", ":"),
            "file-locks": ("file-locks", ""),
            "manage-cgroups-mode": ("manage-cgroups-mode", ":"),
            "network-lock": ("network-lock", ""),
            "lsm-profile": ("lsm-profile", ":"),
            "lsm-mount-context": ("lsm-mount-context", ":"),
            **_ARGP_DEFAULT,
        },
        {"b": ":", "d": "", "?": ""},
        (1, 2),
    ),
}
_EXITS = frozenset({"?", "usage", "v", "V"})  # argp prints help, usage or the version and exits


def _getopt(
    args: Sequence[str],
    long: Long,
    short: Mapping[str, str],
    check: Callable[[str, str], None] = lambda k, v: None,
) -> tuple[dict[str, str], list[str]]:
    """``getopt_long`` in order, stopping at the first non-option (argp then leaves the rest).

    ``check`` sees each option as argp hands it to crun, in order; an option that prints and exits
    (``_EXITS``) ends the parse there: what follows it is never read."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        i += 1
        found: list[tuple[str, str]] = []
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name in long:
                key, kind = long[name]
            else:
                hits = {long[n] for n in long if n.startswith(name)}
                if len(hits) != 1:
                    raise ArgsError(f"option '--{name}' is {'ambiguous' if hits else 'unrecognized'}")
                key, kind = hits.pop()
            if kind == "" and eq:
                raise ArgsError(f"option '--{name}' doesn't allow an argument")
            if kind == ":" and not eq:
                if i >= len(args):
                    raise ArgsError(f"option '--{name}' requires an argument")
                value = args[i]
                i += 1
            found.append((key, value))
        else:
            i = _short(arg, args, i, short, found)
        for key, value in found:
            values[key] = value
            if key in _EXITS:
                return values, []
            check(key, value)
    return values, list(args[i:])


def _short(
    arg: str, args: Sequence[str], i: int, short: Mapping[str, str], found: list[tuple[str, str]]
) -> int:
    """One cluster of short options (``-dbX``) into ``found``; the index of the next argument."""
    j = 1
    while j < len(arg):
        key = arg[j]
        if key not in short:
            raise ArgsError(f"invalid option -- '{key}'")
        kind = short[key]
        j += 1
        if kind == "":
            found.append((key, ""))
            if key in _EXITS:
                break
            continue
        value = arg[j:]
        if not value and kind == ":":
            if i >= len(args):
                raise ArgsError(f"option requires an argument -- '{key}'")
            value = args[i]
            i += 1
        found.append((key, value))
        break
    return i


_MANAGERS = frozenset({"systemd", "cgroupfs", "disabled"})
_LEVELS = frozenset({"error", "warning", "debug"})


def _check_global(key: str, value: str) -> None:
    if key == "cgroup-manager" and value not in _MANAGERS:
        raise ArgsError("unknown cgroup manager specified")
    if key == "log-level" and value not in _LEVELS:
        raise ArgsError(f"unknown verbosity `{value}` specified")


def _read_crun(args: Sequence[str], global_long: Long) -> Creates | None:
    manager = ["cgroupfs"]

    def check(key: str, value: str) -> None:
        _check_global(key, value)
        if key in ("cgroup-manager", "systemd-cgroup"):
            manager[0] = value or "systemd"

    glob, rest = _getopt(args, global_long, CRUN_GLOBAL_SHORT, check)
    if _EXITS & glob.keys():
        return None
    if not rest:
        raise ArgsError("please specify a command")
    command, tail = rest[0], rest[1:]
    if command not in CREATES:
        return None
    long, short, (least, most) = CRUN_COMMAND[command]
    values, positional = _getopt(tail, long, short)
    if _EXITS & values.keys():
        return None
    if not least <= len(positional) <= most:
        raise ArgsError(f"`{command}` requires {least} to {most} arguments")
    if "b" in values and not values["b"]:
        raise ArgsError("realpath `` failed")
    if "log-format" in glob and glob["log-format"] not in ("text", "json"):
        raise ArgsError(f"unknown log format type `{glob['log-format']}`")
    return Creates(
        command=command,
        bundle=values.get("b", ""),
        config=values.get("f", "config.json"),
        ident=positional[0],
        log=glob.get("log", ""),
        log_format=glob.get("log-format", ""),
        cgroup_manager=manager[0],
    )


def read_crun(args: Sequence[str]) -> Creates | None:
    """crun 1.21 and later (argp; its global options, then ``create``/``run``/``restore``'s)."""
    return _read_crun(args, CRUN_GLOBAL)


# crun up to 1.20 gave --rootless the key of --root (so ``--ro`` was no abbreviation of two
# options) and had no --log-level
CRUN_GLOBAL_1_8 = {
    **{k: v for k, v in CRUN_GLOBAL.items() if k != "log-level"},
    "rootless": CRUN_GLOBAL["root"],
}


def read_crun_1_8(args: Sequence[str]) -> Creates | None:
    """crun 1.8-1.20."""
    return _read_crun(args, CRUN_GLOBAL_1_8)
