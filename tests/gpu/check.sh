#!/usr/bin/env bash
# Real-GPU check for the NVIDIA part of oci-device-hook.
#
# Rule: read-only towards the GPU. It never changes MIG mode, persistence mode or any other card
# setting (no `nvidia-smi -mig`, no `-pm`, nothing that sets). On a host without an NVIDIA GPU it
# prints SKIP and exits 0.
#
# What it does on a GPU host (as root, with `hook`, `runc` and a static `busybox` on PATH):
#   1. prints the driver's real /proc files (devices, mig-minors head, gpus/*/information);
#   2. runs `hook inventory` (text and JSON) and asks real NVML directly, and checks that both
#      agree on every GPU's minor, UUID and PCI bus id;
#   3. runs a busybox container under runc whose config asks for GPU 0 only through
#      NVIDIA_VISIBLE_DEVICES, with `hook prestart` as its prestart hook, and checks that
#      /dev/nvidia0 inside is c 195:<minor> and that open() does not fail with EPERM.
# Optional: HOOK_CHECK_CONFIG=FILE passes `--config FILE` to the hook.
set -euo pipefail

skip() { echo "SKIP: $*"; exit 0; }
fail() { echo "FAIL: $*" >&2; exit 1; }
section() { printf '\n==== %s ====\n' "$*"; }

[[ -r /proc/driver/nvidia/version ]] || skip "no NVIDIA driver loaded (/proc/driver/nvidia/version missing)"
compgen -G "/proc/driver/nvidia/gpus/*" >/dev/null || skip "the NVIDIA driver reports no GPU"
[[ -e /dev/nvidia0 || -e /dev/nvidiactl ]] || skip "no /dev/nvidia* nodes on this host"

HOOK=$(command -v hook) || fail "hook is not on PATH"
PY=$(sed -n '1s/^#! *//p' "$HOOK" | awk '{print $1}')
[[ -x "${PY:-}" ]] || PY=$(command -v python3)
CONFIG_ARGS=()
[[ -n "${HOOK_CHECK_CONFIG:-}" ]] && CONFIG_ARGS=(--config "$HOOK_CHECK_CONFIG")
WORK=$(mktemp -d /tmp/oci-device-hook-gpu.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

section "driver /proc files"
cat /proc/driver/nvidia/version
grep -A200 '^Character devices:' /proc/devices | sed '/^$/q'
if [[ -r /proc/driver/nvidia-caps/mig-minors ]]; then
    echo "-- mig-minors (first 12 of $(wc -l </proc/driver/nvidia-caps/mig-minors) lines)"
    head -n 12 /proc/driver/nvidia-caps/mig-minors
else
    echo "-- no /proc/driver/nvidia-caps/mig-minors (no MIG support)"
fi
for info in /proc/driver/nvidia/gpus/*/information; do echo "-- $info"; cat "$info"; done
ls -l /dev/nvidia* /dev/nvidia-caps 2>/dev/null || true
command -v nvidia-smi >/dev/null && nvidia-smi -L || true

section "hook inventory"
"$HOOK" "${CONFIG_ARGS[@]}" inventory --format text
"$HOOK" "${CONFIG_ARGS[@]}" inventory --format json >"$WORK/inventory.json"
cat "$WORK/inventory.json"

section "hook inventory vs real NVML"
"$PY" - "$WORK/inventory.json" <<'PYEOF'
import json, sys
from hook.sources.nvidia import nvml
inv = json.load(open(sys.argv[1]))
real = nvml.query(need_migs=True)  # real pynvml, imported lazily
print("NVML driver", real.driver_version, "warnings", list(real.warnings))
mine = sorted((g["minor"], g["uuid"].lower(), g["pci_bus_id"]) for g in inv["gpus"])
theirs = sorted((g.minor, g.uuid.lower(), g.pci_bus_id) for g in real.gpus)
for row in theirs:
    print("NVML GPU", row)
for m in real.migs:
    print("NVML MIG", m.uuid, "parent minor", m.parent_minor, "gi", m.gi, "ci", m.ci, m.profile)
if mine != theirs:
    sys.exit(f"FAIL: inventory GPUs {mine} differ from NVML {theirs}")
if inv["driver_version"] != real.driver_version:
    sys.exit(f"FAIL: driver {inv['driver_version']} vs NVML {real.driver_version}")
known = {(m["parent_minor"], m["gi"], m["ci"]) for m in inv["migs"]}
missing = [m for m in real.migs if (m.parent_minor, m.gi, m.ci) not in known]
if missing:
    sys.exit(f"FAIL: MIG devices NVML sees but the inventory lacks: {missing}")
print("OK: inventory agrees with NVML")
PYEOF

section "runc container with GPU 0 from the hook"
command -v runc >/dev/null || fail "runc is not on PATH"
BUSYBOX=$(command -v busybox) || fail "busybox is not on PATH"
[[ $(id -u) -eq 0 ]] || fail "the container part needs root"
MINOR0=$("$PY" -c 'import json,sys; g=[g for g in json.load(open(sys.argv[1]))["gpus"] if g["index"]==0]; print(g[0]["minor"])' "$WORK/inventory.json")
BUNDLE="$WORK/bundle"
mkdir -p "$BUNDLE/rootfs/bin" "$BUNDLE/rootfs/dev" "$BUNDLE/rootfs/proc" "$BUNDLE/rootfs/sys" "$BUNDLE/rootfs/tmp"
cp "$BUSYBOX" "$BUNDLE/rootfs/bin/busybox"
ln -s busybox "$BUNDLE/rootfs/bin/sh"
(cd "$BUNDLE" && runc spec)
"$PY" - "$BUNDLE/config.json" "$HOOK" "${CONFIG_ARGS[@]}" <<'PYEOF'
import json, sys
path, hook, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = json.load(open(path))
probe = (
    "ls -l /dev/nvidia0 || exit 10; "
    "dd if=/dev/nvidia0 of=/dev/null bs=1 count=0 2>/tmp/err; rc=$?; cat /tmp/err; "
    "echo open-rc=$rc; grep -q 'Operation not permitted' /tmp/err && exit 11; exit 0"
)
cfg["process"]["args"] = ["/bin/busybox", "sh", "-c", probe]
cfg["process"]["terminal"] = False
cfg["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"]
# NVIDIA's "privileged" is CAP_SYS_ADMIN in the bounding set; the default devices stay deny-all.
cfg["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
cfg["root"]["readonly"] = False
cfg.setdefault("hooks", {})["prestart"] = [{"path": hook, "args": ["hook", *extra, "prestart"], "timeout": 30}]
json.dump(cfg, open(path, "w"), indent=2)
PYEOF
set +e
OUT=$(timeout 120 runc --root "$WORK/runc-root" run --bundle "$BUNDLE" "ocidh-gpu-check-$$" 2>&1)
RC=$?
set -e
echo "$OUT"
echo "runc exit: $RC"
case $RC in
    0) ;;
    10) fail "/dev/nvidia0 is missing inside the container" ;;
    11) fail "open(/dev/nvidia0) inside the container failed with EPERM (no cgroup allowance)" ;;
    *) fail "runc failed (exit $RC)" ;;
esac
grep -Eq "^c.* 195, +$MINOR0 " <<<"$OUT" || fail "/dev/nvidia0 inside is not c 195:$MINOR0"
echo "OK: the container got /dev/nvidia0 (195:$MINOR0) and could open it"
