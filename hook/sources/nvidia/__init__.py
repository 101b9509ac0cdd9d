"""NVIDIA host knowledge: inventory (procfs, mig-minors, NVML), ID resolution and device nodes.

Rule: pure modules (``model``, ``snapshot``, ``migminors``, ``ids``, ``nodes``) never touch the host; the
I/O modules (``procfs``, ``nvml``, ``inventory``, ``hostcheck``) only read it (``hook inventory`` is
``hook.tools.inventorycmd``).
"""
