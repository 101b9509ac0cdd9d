"""Which bundle a runtime's command line creates a container from, read the way runc and crun read it.

Rule: pure functions of the argument list. The runtime wrapper cannot know which runtime it
fronts (the ``runtime`` setting may name runc, crun, or a runtime that passes its arguments on to
either), so it reads the command line with each grammar below. A reading that the runtime would
reject creates nothing; every reading that is accepted and creates a container must name the
same ``config.json``, or the wrapper refuses: where it cannot tell, it fails closed.

Facts the grammars follow (checked against runc 1.1.5 and crun 1.8.1 here, and the sources):

- runc parses with urfave/cli v1 over Go's ``flag`` package. Global flags stop at the first
  non-flag (the command); a flag is ``-name`` or ``--name``, its value ``=value`` or the next
  argument (bool flags take only ``=value``); ``--`` ends the flags; an unknown flag is an error.
  A command's flags may also follow its arguments: urfave/cli moves them to the front first
  (``reorderArgs``). runc 1.1 vendors v1.22.1, which moves every ``-x`` argument and the argument
  after one without ``=``; runc 1.2-1.4 vendor v1.22.14-17, which moves only the command's own
  flags, and after them the next argument that is not one. ``bundle, b`` is one flag with two
  names; an empty bundle means the working directory. ``create``, ``run`` and ``restore`` need
  exactly one argument (the id). (opencontainers/runc create.go, run.go, restore.go, main.go;
  vendor/github.com/urfave/cli/command.go.)
- crun parses with glibc's argp (``getopt_long``, ``ARGP_IN_ORDER``): parsing stops at the first
  non-option (the command, then the id), long options may be shortened to any unambiguous
  prefix (``--bun=X``), short options cluster and take their value attached (``-bX``) or as the
  next argument; ``-f``/``--config`` names another config file than ``config.json``.
  (containers/crun src/crun.c, create.c, run.c, restore.c, run_create.c.)
"""

from __future__ import annotations

from hook.core.record import record

TYPE_CHECKING = False  # collections.abc is not imported at run time: this is on every create's path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    Flags = Mapping[str, tuple[str, bool]]  # name -> (canonical name, takes a value)
    Long = Mapping[str, tuple[str, str]]  # long name -> (key, "" none | ":" required | "::" optional)
    Reader = Callable[[Sequence[str]], "Creates | None"]

__all__ = [
    "read_crun_1_8",
    "ArgsError",
    "Creates",
    "CREATES",
    "READERS",
    "creates",
    "read_runc_1_1",
    "read_runc_1_2",
    "read_crun",
]

CREATES = frozenset({"create", "run", "restore"})  # the commands that build a container from a bundle


class ArgsError(ValueError):
    """The command line is one the runtime would reject, or one the wrapper cannot read for sure."""


@record
class Creates:
    """What one reading says a create-like command line does: the config file it reads."""

    command: str
    bundle: str  # "" = the working directory
    config: str = "config.json"  # relative to the bundle (crun's -f may name another file)
    ident: str = ""
    log: str = ""
    log_format: str = ""

    @property
    def config_path(self) -> str:
        return f"{self.bundle or '.'}/{self.config}"


# --- runc: urfave/cli v1 over Go's flag package ------------------------------------------------------


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
) -> Creates | None:
    glob, rest = _go_parse(args, RUNC_GLOBAL)
    if glob.get("help") == "true" or glob.get("version") == "true" or not rest:
        return None  # help or version is printed; nothing runs
    command, tail = rest[0], rest[1:]
    if command not in CREATES:
        return None
    flags = commands[command]
    values, positional = _go_parse(reorder(tail, flags), flags)
    if values.get("help") == "true":
        return None
    if len(positional) != 1:
        raise ArgsError(f'"{command}" requires exactly 1 argument(s)')
    return Creates(
        command=command,
        bundle=values.get("bundle", ""),
        ident=positional[0],
        log=glob.get("log", ""),
        log_format=glob.get("log-format", ""),
    )


def read_runc_1_1(args: Sequence[str]) -> Creates | None:
    """runc 1.1 (urfave/cli v1.22.1)."""
    return _read_runc(args, _reorder_v1_22_1, RUNC_COMMAND_1_1)


def read_runc_1_2(args: Sequence[str]) -> Creates | None:
    """runc 1.2-1.4 (urfave/cli v1.22.14-17). A flag one version lacks (``--criu`` is gone in 1.4)
    is read here all the same: that version rejects a command line carrying it."""
    return _read_runc(args, _reorder_v1_22_14, RUNC_COMMAND)


# --- crun: glibc argp / getopt_long ------------------------------------------------------------------

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


def _getopt(args: Sequence[str], long: Long, short: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``getopt_long`` in order, stopping at the first non-option (argp then leaves the rest)."""
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
            values[key] = value
            continue
        j = 1
        while j < len(arg):
            key = arg[j]
            if key not in short:
                raise ArgsError(f"invalid option -- '{key}'")
            kind = short[key]
            j += 1
            if kind == "":
                values[key] = ""
                continue
            value = arg[j:]
            if not value and kind == ":":
                if i >= len(args):
                    raise ArgsError(f"option requires an argument -- '{key}'")
                value = args[i]
                i += 1
            values[key] = value
            break
    return values, list(args[i:])


def _read_crun(args: Sequence[str], global_long: Long) -> Creates | None:
    glob, rest = _getopt(args, global_long, CRUN_GLOBAL_SHORT)
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
    return Creates(
        command=command,
        bundle=values.get("b", ""),
        config=values.get("f", "config.json"),
        ident=positional[0],
        log=glob.get("log", ""),
        log_format=glob.get("log-format", ""),
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


READERS: tuple[tuple[str, Reader], ...] = (
    ("runc 1.1", read_runc_1_1),
    ("runc 1.2", read_runc_1_2),
    ("crun 1.8", read_crun_1_8),
    ("crun", read_crun),
)


def creates(args: Sequence[str], is_dir: Callable[[str], bool] = lambda _: True) -> Creates | None:
    """The config file this command line creates a container from, or None when no reading
    creates one (pass it through). ``ArgsError`` when no runtime would accept it, when one reading
    creates and another accepts it without creating, when they name different config files, or
    when crun would read another file than the bundle's ``config.json``.

    ``is_dir`` says whether a bundle directory exists: a reading whose bundle does not is one its
    runtime rejects (runc's chdir, crun's realpath fail), as ``-b=X`` is for crun (bundle ``=X``).
    """
    accepted: list[tuple[str, Creates | None]] = []
    errors: list[str] = []
    for name, reader in READERS:
        try:
            found = reader(args)
            if found is not None and not is_dir(found.bundle or "."):
                raise ArgsError(f"no bundle directory {found.bundle!r}")
            accepted.append((name, found))
        except ArgsError as exc:
            errors.append(f"{name}: {exc}")
    if not accepted:
        raise ArgsError("no runtime accepts it: " + "; ".join(errors))
    creating = [c for _, c in accepted if c is not None]
    if not creating:
        return None
    if len(creating) != len(accepted):
        names = ", ".join(n for n, c in accepted if c is None)
        raise ArgsError(f"{names} would not create a container from it, the others would")
    paths = {c.config_path for c in creating}
    if len(paths) != 1:
        raise ArgsError(f"runtimes would read different configs: {', '.join(sorted(paths))}")
    first = creating[0]
    if first.config != "config.json":
        raise ArgsError(f"crun --config {first.config}: the wrapper decides only the bundle's config.json")
    return first
