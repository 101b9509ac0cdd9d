"""``hook nri``: the NRI daemon's command line (the daemon is ``hook.routes.nri.daemon``).

Rule: options win over the settings file, which wins over the defaults (``nri_socket``,
``nri_plugin_name``, ``nri_plugin_index``); every option is checked as the setting is, so a bad
one is one line naming it and exit 2 before anything connects. A settings file that does not load
is a warning, not an exit: the daemon serves with the defaults, and every decision (which loads the
file again) refuses the containers that ask for a device and lets the others start. Imports only
click here: the daemon's modules load when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["nri_cmd"]

_Path = click.Path(path_type=Path)


@click.command("nri")
@click.option("--socket", "socket_path", help="the runtime's NRI socket (default: the setting nri_socket)")
@click.option(
    "--config", "config_file", type=_Path, help="settings file (default /etc/oci-device-hook/config.yaml)"
)
@click.option("--plugin-name", help="the name it registers (default: the setting nri_plugin_name)")
@click.option("--plugin-index", help="two digits (default: the setting nri_plugin_index)")
@click.option("--driver-root", type=_Path, help="where the driver's files are (default: the setting)")
@click.option("--cdi-spec-dir", "spec_dirs", multiple=True, type=_Path, help="CDI spec dir (repeatable)")
def nri_cmd(
    socket_path: str | None,
    config_file: Path | None,
    plugin_name: str | None,
    plugin_index: str | None,
    driver_root: Path | None,
    spec_dirs: tuple[Path, ...],
) -> None:
    """Run the NRI daemon (as root): register with the runtime's NRI socket, decide each container
    at create and narrow it at start; connect again whenever the runtime drops it."""
    from hook.core.errors import HookError
    from hook.core.settings import convert
    from hook.routes.nri.daemon import run
    from hook.routes.options import Options
    from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

    try:
        settings = load_settings(config_file or DEFAULT_PATH, required=config_file is not None)
    except HookError as exc:
        # Exiting would leave the node to the runtime, which creates every container unadjusted
        # while no plugin answers. Serving on refuses the device containers (each decision loads
        # the file again and fails closed) and lets every other container start.
        click.echo(
            f"oci-device-hook: warning: {exc}; serving with the default NRI settings: containers that "
            "ask for a device are refused until the file loads",
            err=True,
        )
        settings = Settings()
    try:
        name = (
            convert("nri_plugin_name", plugin_name, "--plugin-name")
            if plugin_name
            else settings.nri_plugin_name
        )
        index = (
            convert("nri_plugin_index", plugin_index, "--plugin-index")
            if plugin_index
            else settings.nri_plugin_index
        )
        sock = convert("nri_socket", socket_path, "--socket") if socket_path else settings.nri_socket
    except HookError as exc:
        click.echo(f"oci-device-hook: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    opts = Options(driver_root=driver_root, spec_dirs=spec_dirs, settings_file=config_file)
    import signal

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(f"oci-device-hook nri: stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, stop)  # a DaemonSet's or systemd's stop: one stderr line, exit 0
    signal.signal(signal.SIGINT, stop)
    try:
        code = run(sock, opts, name, index)
    except SystemExit as exc:
        click.echo(str(exc), err=True)
        code = 0
    raise click.exceptions.Exit(code)
