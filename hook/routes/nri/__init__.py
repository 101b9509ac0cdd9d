"""The NRI route: ``hook nri``, a node daemon the runtime asks about each container over its NRI
socket (no process per container). Routes layer: imports adapters, sources and core."""
