#!/bin/sh
# Runs as preStop. A rolling upgrade or rollback stops the old pod while the new one
# installs over it, so by default nothing is removed here (the new version's install
# switches the symlink). Set UNINSTALL_ON_STOP=true (docs/operators.md, "Uninstall"; the chart's
# pre-delete hook does, `installer teardown`) before deleting the DaemonSet to undo exactly
# what install registered.
src=${SRC:-/opt/oci-device-hook/root}
root=${HOST_ROOT:-/host}
[ "${UNINSTALL_ON_STOP:-false}" = true ] || exit 0
touch "${POD_STATE:-/run/pod}/uninstalling" 2>/dev/null || true  # install.sh's loop stops re-applying
# shellcheck disable=SC2086
set -- --root "$root" --src "$src" ${INSTALL_ARGS:-}
[ -n "${PREFIX:-}" ] && set -- "$@" --prefix "$PREFIX"
[ "${RESTART_ENGINE:-false}" = true ] && set -- "$@" --restart-engine
exec "$src/usr/libexec/oci-device-hook/installer" uninstall "$@"
