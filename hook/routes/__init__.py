"""Routes a container takes: fast path, live, precreate, runtime wrapper, the decider and its
client. Import adapters, sources and core."""
