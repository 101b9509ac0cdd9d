#!/bin/sh
# The warm decider: once install.sh has put the hook on the node, run it there (the node's
# python3, chrooted into the node's / (read-only here): the same files and paths the
# per-start hook sees, so its options equal the hooks'). It writes only its socket dir and
# its key. SIGTERM (a rolling upgrade) stops it; the hooks decide in-process until the new
# pod's decider takes the socket over.
# PREFIX is the installer's (the same env in both containers): on a read-only /usr (COS,
# Flatcar) the hook is not under the default, and waiting there would never end.
root=${HOST_ROOT:-/host}
hook=${PREFIX:-/usr/libexec/oci-device-hook}/hook
waited=0
while [ ! -x "$root$hook" ]; do
  [ $((waited % 60)) -eq 0 ] && echo "decider.sh: waiting for the installer to put $hook on the node (PREFIX=${PREFIX:-})" >&2
  sleep 2
  waited=$((waited + 2))
done
exec chroot "$root" "$hook" serve
