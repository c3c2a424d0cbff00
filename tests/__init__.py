"""The test suite, grouped by what it needs: core (no GPU logic), host (host-side GPU logic on fake
backends), emulated (kernels on the CPU SIMT emulator), gpu (a CUDA GPU; marked gpu), bench
(benchmarks, telemetry, tools)."""
