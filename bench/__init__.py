"""Start-path benchmarks for oci-device-hook: ``bench/run`` measures them and writes docs/performance.md."""
