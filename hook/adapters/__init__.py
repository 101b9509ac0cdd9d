"""Adapters that carry out a plan: live apply (cgroups, eBPF, /dev), the spec writer, the marker,
the log. Import sources and core only."""
