"""Console entry: the live hook a runtime runs for every container, and the door to the CLI.

Rule: this module is on every container's start path, so at import it pulls in only ``posix``,
``sys`` and ``hook.routes.fastpath`` (itself posix-only; not ``os``, and no ``from __future__``:
hook.sources.privatefile says why): it parses live-mode argv and hands the
container to the fast path, the full path (``hook.routes.live``) or the CLI. Nothing imports it back;
the rules it applies live in ``hook.routes.fastpath``, and everything else (records, yaml, click,
pynvml) loads only when needed.
"""

import posix
import sys

from hook.routes.fastpath import MAX_CONFIG, MAX_STATE, look_at, precreate_fast, read_limited

TOOLS = frozenset({"inventory", "cdi", "doctor", "log", "metrics", "settings", "serve", "nri"})
LIVE_STAGES = frozenset({"prestart", "createRuntime"})
OTHER_STAGES = frozenset({"createContainer", "startContainer", "poststart", "poststop"})
VALUE_OPTIONS = frozenset({"--config", "--driver-root", "--cdi-spec-dir", "--inventory", "--format"})
FLAG_OPTIONS = frozenset({"--log", "--help", "-h"})  # live mode's flags (``--log``: log even by hand)
LIVE_HELP = """Usage: hook [prestart|createRuntime] [OPTIONS] < STATE

  Live mode, as an OCI runtime runs it: reads the container's OCI state JSON on stdin, decides,
  and applies the decision to the starting container. The stages createContainer,
  startContainer, poststart and poststop are a no-op. Simulate instead with: hook --bundle DIR
  Spec level: hook precreate [OPTIONS] < config.json > decided config.json

Options:
  --config FILE          settings file (YAML)
  --driver-root DIR      where driver files and host nodes are read
  --cdi-spec-dir DIR     CDI spec dir, lowest first (repeatable)
  --inventory FILE       saved `hook inventory` JSON
  --log                  append to the log even when run from a terminal
  -h, --help             show this message
"""


def _split(argv: "list[str]") -> "tuple[dict[str, list[str]], list[str]] | None":
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
        elif arg in FLAG_OPTIONS:
            opts.setdefault(arg, []).append("")
        elif arg.startswith("-"):
            return None  # --bundle, --state, --version, ...: the CLI's business
        else:
            positional.append(arg)
        i += 1
    if len(positional) > 1 or (positional and positional[0] in TOOLS):
        return None
    if ("--help" in opts or "-h" in opts) and not positional:
        return None  # `hook --help`: the CLI's own help
    return opts, positional


def _unknown_word(word: str) -> int:
    """A word that is neither an OCI stage nor a subcommand: a usage error, never a silent no-op."""
    from difflib import get_close_matches

    known = sorted(TOOLS | LIVE_STAGES | OTHER_STAGES | {"precreate"})
    close = get_close_matches(word, known, n=1, cutoff=0.6) or get_close_matches(
        word.lower(), [k.lower() for k in known], n=1, cutoff=0.6
    )
    hint = ""
    if close:
        hint = f"; did you mean {next(k for k in known if k.lower() == close[0].lower())!r}?"
    shown = word.encode("ascii", "backslashreplace").decode()[:64]
    sys.stderr.write(
        f"hook: usage error: {shown!r} is not a subcommand ({', '.join(sorted(TOOLS))}) "
        f"nor an OCI stage{hint} (see hook --help)\n"
    )
    return 2


def _write_out(data: bytes) -> None:
    _write_fd(1, data)


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view) :]


def precreate(opts: "dict[str, list[str]]") -> int:
    """Config in on stdin, decided config out on stdout (hooks.d ``precreate``, the runtime wrapper)."""
    if posix.isatty(0):
        sys.stderr.write("hook: precreate reads an OCI config.json on stdin: hook precreate < config.json\n")
        return 2
    try:
        stdin = read_limited(0, MAX_CONFIG)
    except (OSError, ValueError):
        stdin = b""
    if len(stdin) <= MAX_CONFIG and precreate_fast(opts, stdin):
        return _hand_over(stdin, 0)
    try:
        from hook.routes.offer import spec_level

        code, out = spec_level("precreate", opts, stdin)
    except Exception as exc:  # the runtime shows one line, never a traceback
        from hook.core.escape import clean

        sys.stderr.write(f"oci-device-hook: internal error: {type(exc).__name__}: {clean(exc)}\n")
        return 1
    return _hand_over(out, code) if out else code


def _hand_over(out: bytes, code: int) -> int:
    """The config on stdout; a write that fails (a full disk under the wrapper's temp file, a
    closed pipe) is one line and exit 1: the engine must not start on a cut config."""
    try:
        _write_out(out)
    except OSError as exc:
        from hook.routes.act import runtime_log

        line = f"oci-device-hook: stdout: cannot write the config for the runtime: {exc.strerror or exc}"
        sys.stderr.write(line + "\n")
        runtime_log(line)
        return 1
    return code


def main(argv: "list[str] | None" = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["runtime-wrapper"]:  # packaging/runtime, for create/run/restore: decides, then execs
        from hook.routes.wrapper import main as wrapper_main

        return wrapper_main(argv[1:])
    parsed = _split(argv)
    if parsed is None:
        from hook.cli import run

        return run(argv)
    opts, positional = parsed
    stage = positional[0] if positional else "prestart"
    if stage == "precreate" and not ("--help" in opts or "-h" in opts):
        return precreate(opts)
    if stage not in LIVE_STAGES and stage not in OTHER_STAGES and stage != "precreate":
        return _unknown_word(stage)
    if "--help" in opts or "-h" in opts:
        sys.stdout.write(LIVE_HELP)
        return 0
    if stage in OTHER_STAGES:  # interface.md: the other OCI stages are a no-op
        return 0
    if posix.isatty(0):
        sys.stderr.write(
            "hook: live mode expects the OCI state JSON on stdin (an OCI runtime runs it as a hook); "
            "to try a bundle: hook --bundle DIR; see hook --help\n"
        )
        return 2
    try:
        stdin = read_limited(0, MAX_STATE * 2)
    except (OSError, ValueError):
        stdin = b""
    look = look_at(opts, stdin)
    if look.done:
        return 0
    try:
        from hook.routes.offer import live_level

        return live_level(stage, opts, look)
    except Exception as exc:  # the runtime shows one line, never a traceback
        from hook.core.escape import clean

        sys.stderr.write(f"oci-device-hook: internal error: {type(exc).__name__}: {clean(exc)}\n")
        return 1


def run() -> None:
    """Entry of the launcher, ``python -m hook`` and the console script: ``main()``, then exit.

    A live run (fast path or full) leaves nothing that interpreter finalization would finish:
    the log and caches are written with ``os.write``/``fsync`` and closed, so after flushing
    stdout and stderr it ends with ``os._exit`` and skips the teardown of every module (~5 ms on
    the slice pod's path). If a flush fails, the normal ``sys.exit`` runs instead, which reports
    it as usual. The CLI (simulation, tools) always exits normally.
    """
    argv = sys.argv[1:]
    code = main(argv)
    if _split(argv) is not None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            sys.exit(code)
        posix._exit(code & 0xFF if isinstance(code, int) else 1)
    sys.exit(code)


if __name__ == "__main__":
    run()
