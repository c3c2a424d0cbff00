"""The guardrail of refactors: the generated CUDA module text and every launch of the executor (symbol,
grid, block, shared memory, arguments) for the shipped model, hashed per configuration (fp16, bf16,
fp32; batch 1 and 16; the built-in tiles of an 8-SM and a 132-SM GPU, and each shipped tuning file,
whose tiles join every module of its SM count) and held to tests/fixtures/module_text.json. A move or
rename leaves every hash as it was; a change of a kernel file changes `module` only; a change of what
the launchers choose changes `instantiations` and `launches` too. Record an intended change with

    python -m tests.host.test_module_text --write

and say in the commit why the kernels changed (then the GPU suite and a timed A/B on the device).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import pytest

from jetson_unet.build.aot import module_keys
from jetson_unet.build.loader import KernelSet
from jetson_unet.build.sources import module_source
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.model.weights import load_weights
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.ops.tuning import load_tiles
from jetson_unet.paths import models_dir, shipped_tiles_dir
from tests.helpers.fakes import FakeBackend

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "module_text.json"
MARK = "// ==== instantiations (generated) ====\n"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def configurations(weights) -> Iterator[Tuple[str, str, int, int, Optional[dict]]]:
    """(label, precision, batch, SMs, tiles): the built-in tiles for 8 and 132 SMs, and every shipped
    tuning file of the precision and batch (measured on 132-SM GPUs)."""
    for precision in ("fp16", "bf16", "fp32"):
        for batch in (1, 16):
            for sms in (8, 132):
                yield f"{precision}-b{batch}-builtin-{sms}sm", precision, batch, sms, {}
            for f in sorted(shipped_tiles_dir().glob(f"tiles-*-{precision}-b{batch}.json")):
                n = int(f.stem.rsplit("sm-", 1)[0].rsplit("-", 1)[1])
                yield f"{precision}-b{batch}-{f.stem}", precision, batch, n, load_tiles(
                    f, precision, batch, n, weights.config)


def _arg(a) -> str:
    return f"{type(a).__name__}:{a.item() if isinstance(a, np.generic) else a}"


def hashes() -> Dict[str, Dict[str, str]]:
    weights = load_weights(models_dir() / "seed-unet-emoji64.safetensors")
    out = {}
    for label, precision, batch, sms, tiles in configurations(weights):
        text = module_source(module_keys(weights, precision, batch, sms, tiles, dirs=(shipped_tiles_dir(),)))
        KernelSet._cache.clear()
        ex = GpuExecutor(weights, precision, batch=batch, backend=FakeBackend(sms=sms),
                         policy=KernelPolicy(tiles=tiles))
        launches = "\n".join(f"{L.name} {L.fn.symbol} {L.grid} {L.block} {L.smem} " + " ".join(map(_arg, L.args))
                             for L in ex.launches)
        KernelSet._cache.clear()
        out[label] = {"module": sha(text), "instantiations": sha(text.split(MARK, 1)[1]), "launches": sha(launches)}
    return out


@pytest.mark.skipif(not (models_dir() / "seed-unet-emoji64.safetensors").is_file(), reason="no shipped model")
def test_module_text_and_launches_are_as_recorded():
    want = json.loads(FIXTURE.read_text())
    got = hashes()
    assert sorted(got) == sorted(want), "the configurations changed: record them again (see the docstring)"
    changed = [f"{label} {part}" for label in want for part in want[label] if got[label][part] != want[label][part]]
    assert not changed, (f"{len(changed)} hashes changed (first: {changed[:4]}); if intended, record them with "
                         "`python -m tests.host.test_module_text --write` and say why in the commit")


if __name__ == "__main__" and "--write" in sys.argv:
    FIXTURE.write_text(json.dumps(hashes(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
