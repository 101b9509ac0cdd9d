"""Live apply: a Plan carried out on a running container, all or nothing.

Rule: device cgroup v1 writes, cgroup v2 eBPF and nodes in the container's mount namespace; each
step checks that what it touches is the container's own (its cgroup, its /dev, never the host's),
and ``transaction`` rolls every step back when one fails.
"""
