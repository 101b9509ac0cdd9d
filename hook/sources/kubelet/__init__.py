"""The kubelet's evidence: device-plugin checkpoint, DRA state, pod identity."""
