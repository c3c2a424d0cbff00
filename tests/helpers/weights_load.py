"""A weights load that must fail, watched: which tensors' data was read, and the peak allocation."""
from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import List, Tuple

import pytest

from jetson_unet.errors import WeightsError
from jetson_unet.model import weights as W


def failed_load(path: Path, monkeypatch, reader: str, name_at: int, traced: bool) -> Tuple[WeightsError, List, int]:
    """load_weights(path) raises a WeightsError: (the error, the tensor names `W.<reader>` was called for
    (its positional argument `name_at`), the tracemalloc peak or 0 when not `traced`)."""
    read: list = []
    real = getattr(W, reader)

    def spy(*args):
        read.append(args[name_at])
        return real(*args)

    monkeypatch.setattr(W, reader, spy)
    if traced:
        tracemalloc.start()
    try:
        with pytest.raises(WeightsError) as info:
            W.load_weights(path)
        peak = tracemalloc.get_traced_memory()[1] if traced else 0
    finally:
        tracemalloc.stop()
    return info.value, read, peak
