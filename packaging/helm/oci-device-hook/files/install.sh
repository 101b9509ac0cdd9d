#!/bin/sh
# Install this version in its own directory on the node, switch the `current` symlink,
# register with hooks.d (CRI-O, podman) and with containerd's runc handlers when the node
# runs containerd; then re-apply the settings ConfigMap whenever it changes.
# Paths are overridable for tests only.
set -eu
src=${SRC:-/opt/oci-device-hook/root}
root=${HOST_ROOT:-/host}
settings=${SETTINGS:-/config/config.yaml}
installer="$src/usr/libexec/oci-device-hook/installer"
# shellcheck disable=SC2086  # INSTALL_ARGS: extra installer options, word-split (tests)
set -- --root "$root" --src "$src" ${INSTALL_ARGS:-}
[ -n "${ENGINE:-}" ] && set -- "$@" --engine "$ENGINE"
[ -n "${HOOK_MODE:-}" ] && set -- "$@" --mode "$HOOK_MODE"
[ -n "${ROUTE:-}" ] && set -- "$@" --route "$ROUTE"  # containerd: wrapper (default), nri, both
[ "${ACCEPT_UNADJUSTED:-false}" = true ] && set -- "$@" --accept-unadjusted
[ -n "${PREFIX:-}" ] && set -- "$@" --prefix "$PREFIX"
[ -n "${NODE_PYTHON:-}" ] && set -- "$@" --python "$NODE_PYTHON"
[ "${RESTART_ENGINE:-false}" = true ] && set -- "$@" --restart-engine
if [ -f "$settings" ]; then
  "$installer" install "$@" --settings "$settings"
else
  "$installer" install "$@"
fi
state=${POD_STATE:-/run/pod}
# Drift: register again where another tool (the GPU operator's toolkit) rewrote containerd's
# config (`installer repair` logs each repair), then keep the verdict in $state/registration.json:
# the readiness probe (ready only while containerd runs the hook for every handler) and the
# metrics container (oci_device_hook_registered) read it. A change of verdict is logged once.
drift() {
  [ -d "$state" ] || return 0  # no pod state dir (run by hand): nothing to keep it in
  [ ! -e "$state/uninstalling" ] || return 0  # the preStop is uninstalling: never repair over it
  "$installer" repair "$@" || true
  "$installer" status --check "$@" --write "$state/registration.json" >/dev/null 2>"$state/drift.new" || true
  if ! cmp -s "$state/drift.new" "$state/drift.last" 2>/dev/null; then
    if [ -s "$state/drift.new" ]; then cat "$state/drift.new" >&2
    else echo "install.sh: registered: containerd runs the hook for every handler (no drift)" >&2; fi
  fi
  mv -f "$state/drift.new" "$state/drift.last"
}
drift "$@"
[ "${WATCH_SETTINGS:-true}" = true ] || exit 0
while sleep "${SETTINGS_POLL_SECONDS:-60}"; do
  # uninstall.sh (preStop) is undoing the install: re-applying now would undo the uninstall
  [ -e "$state/uninstalling" ] && continue
  if [ -f "$settings" ]; then "$installer" settings "$@" --settings "$settings" || true; fi
  drift "$@"
done
