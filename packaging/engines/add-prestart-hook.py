#!/usr/bin/python3 -I
"""Read an OCI spec on stdin, append the oci-device-hook prestart hook once, print it."""

import json
import sys

HOOK = {
    "path": "/usr/libexec/oci-device-hook/hook",
    "args": ["hook", "prestart"],
    "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
    "timeout": 10,
}

spec = json.load(sys.stdin)
prestart = spec.setdefault("hooks", {}).setdefault("prestart", [])
if not any(h.get("path") == HOOK["path"] for h in prestart):
    prestart.append(HOOK)
json.dump(spec, sys.stdout, indent=2)
sys.stdout.write("\n")
