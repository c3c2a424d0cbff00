"""A process of tests/host/test_compile_lock.py, run as `python -m tests.helpers.lock_child MODE CACHE [COUNTER GO]`:

- `load`: prints "ready", waits for the file GO, then gets one module through the loader with a fake compiler that
  takes a second and appends a line to COUNTER per build; prints the cubin it loaded.
- `hold`: takes the cache's lock of that module, prints "held", and sleeps until killed.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.helpers.cubin_fakes import CubinBackend, fake_cubin, symbols_of

from jetson_unet.build import compilers
from jetson_unet.build.cache import CubinCache
from jetson_unet.build.loader import load_module
from jetson_unet.build.sources import module_source, nvrtc_options
from jetson_unet.ops.keys import SimpleKey

SOURCE = module_source([SimpleKey("dwconv", "fp16", 7), SimpleKey("final", "fp32", 3)])
OPTIONS, ARCH, TOOLCHAIN, NAME = nvrtc_options(87), 87, "nvrtc 12.6", "seed-unet"


def slow_compiler(counter: Path) -> compilers.Compiler:
    def build(src, name, options, arch):
        with open(counter, "a") as f:
            f.write("build\n")
        time.sleep(1.0)
        return fake_cubin(arch, symbols_of(src))
    return compilers.Compiler("nvrtc", TOOLCHAIN, build)


def main(mode: str, cache_dir: str, counter: str = "", go: str = "") -> None:
    cache = CubinCache(Path(cache_dir))
    if mode == "hold":
        with cache.lock(NAME, SOURCE, OPTIONS, ARCH, TOOLCHAIN):
            print("held", flush=True)
            time.sleep(600)
        return
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    be = CubinBackend()
    load_module(be, SOURCE, NAME, OPTIONS, symbols_of(SOURCE), ARCH, cache=cache, compiler=slow_compiler(Path(counter)),
                shipped=CubinCache(Path(cache_dir) / "no-shipped-cubins", read_only=True))
    print(be.loads[-1], flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
