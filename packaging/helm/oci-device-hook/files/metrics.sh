#!/bin/sh
# The counters over the decision log, on the interpreter the image bundles (nothing of the
# node's runs). It reads the log (the settings' log_file, in the hook's own log directory,
# the only node path mounted, read-only). METRICS_LISTEN=ADDR:PORT: serve /metrics there
# (`hook metrics --serve`, for Prometheus). Empty: keep a node_exporter textfile instead,
# `hook metrics --textfile` every METRICS_SECONDS from where the textfile's counts end,
# replacing TEXTFILE (a *.prom file or node_exporter's directory) in one rename.
src=${SRC:-/opt/oci-device-hook/root}
settings=${SETTINGS:-/config/config.yaml}
dir=$src/usr/libexec/oci-device-hook
if [ -n "${METRICS_LISTEN:-}" ]; then
  set -- metrics --serve "$METRICS_LISTEN"
else
  set -- metrics --textfile "${TEXTFILE:-/var/lib/node_exporter/textfile_collector}"
fi
[ -f "$settings" ] && set -- "$@" --config "$settings"
# install.sh's drift verdict (oci_device_hook_registered); absent until its first check
[ -d "${POD_STATE:-/run/pod}" ] && set -- "$@" --registration "${POD_STATE:-/run/pod}/registration.json"
for loader in "$dir"/python/lib/ld-linux*.so* "$dir"/python/lib/ld64.so*; do
  [ -x "$loader" ] && break
done
[ -x "$loader" ] || { echo "metrics.sh: $dir/python: no bundled interpreter" >&2; exit 1; }
if [ -n "${METRICS_LISTEN:-}" ]; then
  exec "$loader" --library-path "$dir/python/lib" "$dir/python/bin/python3" -ISB "$dir/launcher.py" "$@"
fi
while :; do
  "$loader" --library-path "$dir/python/lib" "$dir/python/bin/python3" -ISB "$dir/launcher.py" "$@"
  rc=$?
  [ "${METRICS_SECONDS:-60}" -gt 0 ] || exit "$rc"  # 0: once (tests)
  sleep "${METRICS_SECONDS:-60}"
done
