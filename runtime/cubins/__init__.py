"""The shipped model's kernel modules as cubins (build.cache entries: `<name>-sm<arch>-<key>.cubin` and its
JSON sidecar), built by `python -m tools.build_kernels`; the loader looks here before the user's cache."""
