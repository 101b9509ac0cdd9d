"""The command line for people and programs: simulation (``--bundle``) and the tools.

Rule: this is the only place (with ``hook.entry``/``hook.routes.live``) that prints or picks an exit
code; everything below raises ``HookError``. Simulation shares ``gather``/``decide`` with live
mode and differs only in the adapter: it prints the Plan instead of applying it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import click

from hook.core.errors import HookError
from hook.tools.nricmd import nri_cmd

__all__ = ["run", "cli"]

PathArg = click.Path(path_type=Path)


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options common to every mode (interface.md); a subcommand's value overrides the group's."""
    f = click.option("--config", "config_file", type=PathArg, help="settings file (YAML)")(f)
    f = click.option("--driver-root", type=PathArg, help="where driver files and host nodes are read")(f)
    f = click.option(
        "--cdi-spec-dir", "spec_dirs", type=PathArg, multiple=True, help="CDI spec dir, lowest first"
    )(f)
    f = click.option("--inventory", "inventory_file", type=PathArg, help="saved `hook inventory` JSON")(f)
    return click.option("--format", "fmt", type=click.Choice(["text", "json"]), help="output format")(f)


def _merged(ctx: click.Context, /, **kw: Any) -> dict[str, Any]:
    base = dict(ctx.obj or {})
    for key, value in kw.items():
        if value not in (None, ()):
            base[key] = value
    return base


def _version() -> str:
    """The installed distribution's version; the source constant where there is no metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("oci-device-hook")
    except PackageNotFoundError:
        from hook.core.version import VERSION

        return VERSION


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"hook (oci-device-hook) {_version()}")
        ctx.exit(0)


_warned: set[Path] = set()


def _warn_missing_dirs(dirs: Any) -> None:
    """A --cdi-spec-dir that does not exist is a warning (a typo would otherwise look like "no specs")."""
    for d in dirs or ():
        if d not in _warned and not Path(d).is_dir():
            _warned.add(d)
            click.echo(f"hook: warning: --cdi-spec-dir {d}: no such directory", err=True)


def _options(o: dict[str, Any], *, use_cache: bool, resolve: bool = True) -> Any:
    """Options from the command line; with ``resolve``, what is not given comes from the settings
    file (``driver_root``, ``cdi_spec_dirs``), or the defaults when that file cannot be read."""
    from hook.routes.gather import Options, inventory_option, resolved

    _warn_missing_dirs(o.get("spec_dirs"))

    opts = Options(
        driver_root=o.get("driver_root"),
        spec_dirs=tuple(o.get("spec_dirs") or ()),
        inventory_file=inventory_option(o.get("inventory_file")),
        settings_file=o.get("config_file"),
        use_cache=use_cache,
    )
    if not resolve or (opts.driver_root is not None and opts.spec_dirs):
        return opts
    from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

    try:
        settings = load_settings(opts.settings_file or DEFAULT_PATH)
    except HookError:
        settings = Settings()  # a tool still runs; the decision paths report the file's error
    return resolved(opts, settings)


def _finish(text: str, code: int) -> None:
    if text:
        click.echo(text, nl=not text.endswith("\n"))
    raise click.exceptions.Exit(code)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@_common
@click.option("--bundle", type=click.Path(path_type=Path, file_okay=False), help="simulate for this bundle")
@click.option("--state", "state_file", type=PathArg, help="OCI state file (default: made from the bundle)")
@click.option("--output-config", type=PathArg, help="write the config.json with the decision folded in")
@click.option("--kubelet-checkpoint", "checkpoint", type=PathArg, help="kubelet checkpoint (simulation)")
@click.option("--kubelet-dra-state", "dra_state", type=PathArg, help="the kubelet's DRA state (simulation)")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="print the version and exit",
)
@click.pass_context
def cli(
    ctx: click.Context,
    /,
    bundle: Path | None,
    state_file: Path | None,
    output_config: Path | None,
    checkpoint: Path | None,
    dra_state: Path | None,
    **common: Any,
) -> None:
    """oci-device-hook: keep GPU device access honest (see README)."""
    ctx.obj = {k: v for k, v in common.items() if v not in (None, ())}
    if ctx.invoked_subcommand is not None:
        return
    if bundle is None:
        raise click.UsageError("simulation needs --bundle DIR (live mode reads the OCI state on stdin)")
    _simulate(ctx.obj, bundle, state_file, output_config, dra_state, checkpoint)


def _simulate(
    o: dict[str, Any],
    bundle: Path,
    state_file: Path | None,
    output_config: Path | None,
    dra_state: Path | None = None,
    checkpoint: Path | None = None,
) -> None:
    from hook.core.record import replace
    from hook.tools.simulate import simulate

    opts = replace(_options(o, use_cache=False, resolve=False), dra_state=dra_state, checkpoint=checkpoint)
    resolved = partial(_options, o, use_cache=False)
    _finish(*simulate(opts, bundle, state_file, output_config, o.get("fmt") or "text", resolved))


@cli.command()
@_common
@click.pass_context
def inventory(ctx: click.Context, /, **kw: Any) -> None:
    """Print the host's NVIDIA inventory (NVML + /proc) as JSON."""
    from hook.tools.inventorycmd import cmd_inventory

    o = _merged(ctx, **kw)
    _finish(
        *cmd_inventory(
            _options(o, use_cache=False).driver_root, o.get("inventory_file"), None, o.get("fmt") or "json"
        )
    )


@cli.group()
def cdi() -> None:
    """CDI specs: list, validate, resolve."""


@cdi.command("list")
@_common
@click.pass_context
def cdi_list(ctx: click.Context, /, **kw: Any) -> None:
    """List every CDI device the spec dirs define, and every broken spec file."""
    from hook.tools.cdicmd import cmd_list

    o = _merged(ctx.find_root(), **kw)
    dirs = list(_options(o, use_cache=False).spec_dirs)
    text, code = cmd_list(dirs, o.get("fmt") or "text")
    if not text.strip():
        text = f"no CDI specs in {', '.join(map(str, dirs))}\n"
    _finish(text, code)


@cdi.command("validate")
@_common
@click.argument("files", nargs=-1, required=True, type=PathArg)
@click.pass_context
def cdi_validate(ctx: click.Context, /, files: tuple[Path, ...], **kw: Any) -> None:
    """Validate spec files; exit 1 and one line per problem when any is invalid."""
    from hook.tools.cdicmd import cmd_validate

    o = _merged(ctx.find_root(), **kw)
    _finish(*cmd_validate(list(files), o.get("fmt") or "text"))


@cdi.command("resolve")
@_common
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def cdi_resolve(ctx: click.Context, /, names: tuple[str, ...], **kw: Any) -> None:
    """Print the merged container edits for qualified device names."""
    from hook.tools.cdicmd import cmd_resolve

    o = _merged(ctx.find_root(), **kw)
    opts = _options(o, use_cache=False)
    _finish(*cmd_resolve(list(names), list(opts.spec_dirs), opts.driver_root, o.get("fmt") or "text"))


@cli.command()
@_common
@click.option("--hooks-dir", "hooks_dirs", type=PathArg, multiple=True, help="hooks.d directory to check")
@click.option("--containerd-config", type=PathArg, help="containerd config to check")
@click.pass_context
def doctor(
    ctx: click.Context, /, hooks_dirs: tuple[Path, ...], containerd_config: Path | None, **kw: Any
) -> None:
    """Check this node's readiness: driver, CDI specs, cgroups, hooks.d, settings."""
    from hook.sources.settingsfile import DEFAULT_PATH
    from hook.tools.doctor import run_doctor

    o = _merged(ctx, **kw)
    opts = _options(o, use_cache=False)
    dirs = list(hooks_dirs) or [
        Path("/usr/share/containers/oci/hooks.d"),
        Path("/etc/containers/oci/hooks.d"),
    ]
    _finish(
        *run_doctor(
            opts.driver_root,
            list(opts.spec_dirs),
            dirs,
            o.get("config_file") or DEFAULT_PATH,
            o.get("fmt") or "text",
            containerd_config=containerd_config,
            driver_root_given=o.get("driver_root") is not None,
        )
    )


@cli.command("serve")
@click.option(
    "--socket-dir", default="/run/oci-device-hook", type=PathArg, help="where the socket is made (0700)"
)
@click.option("--config", "config_file", help="settings (`decider: off`: do not serve)")
@click.option("--driver-root", help="as the hooks it serves give it")
@click.option("--cdi-spec-dir", "spec_dirs", multiple=True, help="as the hooks give it (repeatable)")
@click.option("--inventory", help="as the hooks it serves give it")
def serve_cmd(
    socket_dir: Path, config_file: str | None, driver_root: str | None, spec_dirs: tuple[str, ...],
    inventory: str | None,
) -> None:  # fmt: skip
    """Run the warm decider (as root). It decides for the hooks on this node that run with exactly
    these options and the settings file they name; any other hook decides in-process."""
    from hook.routes.serve import serve

    opts: dict[str, list[str]] = {}
    given = (("--config", config_file), ("--driver-root", driver_root), ("--inventory", inventory))
    for name, value in given:
        if value is not None:
            opts[name] = [value]
    if spec_dirs:
        opts["--cdi-spec-dir"] = list(spec_dirs)
    _finish("", serve(opts, str(socket_dir)))


@cli.command("log")
@click.option("--config", "config_file", type=PathArg, help="settings file naming the log (log_file)")
@click.option("--file", "log_file", type=PathArg, help="log file to read (default: the settings' log_file)")
@click.option("--since", default="", help="today, yesterday, 2h, 30m, 7d, or a date/RFC 3339 time")
@click.option("--verdict", "verdicts", multiple=True, type=click.Choice(["none", "apply", "deny", "error"]))
@click.option("--narrowed", is_flag=True, help="only containers narrowed to their allocation")
@click.option("--namespace", default="", help="only pods of this namespace")
@click.option("--pod", default="", help="only this pod (name)")
@click.option("--warnings", is_flag=True, help="only records with warnings (text shows them under each)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), help="output format")
@click.pass_context
def log_cmd(
    ctx: click.Context,
    /,
    config_file: Path | None,
    log_file: Path | None,
    fmt: str | None,
    **filters: Any,
) -> None:
    """Read the decision log: e.g. which containers were narrowed today (--since today --narrowed)."""
    from hook.tools.logread import cmd_log

    named = log_file is not None
    if log_file is None:
        log_file = Path(_tool_settings(ctx, config_file, ("log_file",))[0].log_file)
    _finish(*cmd_log(log_file, fmt or ctx.find_root().obj.get("fmt") or "text", must_exist=named, **filters))


def _tool_settings(ctx: click.Context, config_file: Path | None, keys: tuple[str, ...]) -> tuple[Any, Path]:
    """(settings, path) for ``hook log``/``hook metrics``, which must report the failure of a broken
    settings file rather than share it: the defaults with ``keys`` salvaged, and a warning."""
    from hook.sources.settingsfile import DEFAULT_PATH, lenient

    path = config_file or (ctx.find_root().obj or {}).get("config_file")
    settings, error = lenient(path or DEFAULT_PATH, keys, required=bool(path))
    if error is not None:
        used = ", ".join(f"{k} {getattr(settings, k) or '(none)'}" for k in keys)
        click.echo(f"hook: warning: {error}; read with the defaults and what it still says ({used})",
                   err=True)  # fmt: skip
    return settings, path or DEFAULT_PATH


@cli.command("metrics")
@click.option("--config", "config_file", type=PathArg, help="settings file (log_file, metrics_textfile)")
@click.option("--file", "log_file", type=PathArg, help="log file to read (default: the settings' log_file)")
@click.option("--textfile", is_flag=False, flag_value="", default=None, metavar="[PATH]",
              help="replace the node_exporter textfile (*.prom or its dir; default: the settings' "
              "metrics_textfile)")  # fmt: skip
@click.option("--since", default="", help="only records since then, as hook log (not with --textfile)")
@click.option("--serve", "listen", default="", metavar="ADDR:PORT", help="serve /metrics there (Prometheus)")
@click.option("--registration", type=PathArg, help="`installer status --write` file: the registered gauge")
@click.pass_context
def metrics_cmd(ctx: click.Context, /, config_file: Path | None, log_file: Path | None, textfile: str | None,
                since: str, listen: str, registration: Path | None) -> None:  # fmt: skip
    """Counters and a latency histogram over the decision log, in the Prometheus text format."""
    from hook.tools.metricslog import cmd_metrics, node_gauges, textfile_path
    from hook.tools.metricsserve import serve_metrics

    settings, path = _tool_settings(ctx, config_file, ("log_file", "metrics_textfile"))
    log = log_file or Path(settings.log_file)
    gauges = partial(node_gauges, path, registration)  # each scrape or run: what the node says now
    if listen:
        _finish(*serve_metrics(listen, log, alone=textfile is None and not since, gauges=gauges))
    target = textfile or settings.metrics_textfile
    if (textfile == "" and not target) or (since and textfile is not None):
        raise click.UsageError("--textfile: needs a PATH (or the metrics_textfile setting) and no --since")
    out = textfile_path(Path(target)) if target and not since else None
    write, named = textfile is not None, log_file is not None
    _finish(*cmd_metrics(log, out, write=write, must_exist=named, since=since, gauges=gauges()))


@cli.group("settings")
def settings_group() -> None:
    """The settings file: check one before it is deployed."""


@settings_group.command("check")
@click.argument("file", type=PathArg)
def settings_check(file: Path) -> None:
    """Validate FILE as the live hook would (unknown or duplicate keys, bad values): every error, one
    line each (an unknown key names the closest known one), exit 1; or one ok line, exit 0."""
    from hook.sources.settingsfile import check_file

    errors = check_file(file)
    for error in errors:
        click.echo(f"hook: {error}", err=True)
    _finish("" if errors else f"{file}: ok", 1 if errors else 0)


def run(argv: list[str]) -> int:
    """Run the CLI and translate every outcome to the contract's exit codes."""
    try:
        # standalone_mode=False: click returns an Exit's code instead of raising it
        code = cli.main(args=argv, prog_name="hook", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.UsageError) else 1
    except click.exceptions.Abort:
        return 1
    except HookError as exc:
        sys.stderr.write(f"hook: {exc}\n")
        _json_error(argv, exc.as_object())
        return exc.exit_code
    except Exception as exc:  # one escaped line, never a traceback (a container's config may be anything)
        from hook.core.escape import clean

        sys.stderr.write(f"hook: internal error: {type(exc).__name__}: {clean(exc)}\n")
        _json_error(argv, {"message": f"internal error: {type(exc).__name__}: {clean(exc)}", "exit_code": 1})
        return 1


def _json_error(argv: list[str], error: dict[str, object]) -> None:
    """With ``--format json`` stdout is a program's: an error is an object there too (stderr keeps
    its line)."""
    from itertools import pairwise

    if "--format=json" in argv or ("--format", "json") in pairwise(argv):
        sys.stdout.write(json.dumps({"error": error}, sort_keys=True) + "\n")


cli.add_command(nri_cmd)  # `hook nri`, the NRI route's daemon
