"""tools.serve_batches on the CPU: the served model's batches timed per set of engines, on NumPy and
on the recording fake GPU (each batch on the smallest engine that holds it)."""
from __future__ import annotations

import pytest

from tests.helpers.cubin_fakes import CubinBackend, cupy_nvrtc
from jetson_unet.backends import _CACHE
from jetson_unet.build.loader import KernelSet
from jetson_unet.sampling.gpu import GpuSampler
from tools import serve_batches

ARGS = ["--requests", "1", "3", "--sampler", "ddim", "--steps", "2", "--repeats", "2"]


def test_numpy_prints_one_row_per_batch(tiny_weights_path, capsys):
    assert serve_batches.main(["--weights", str(tiny_weights_path), "--backend", "numpy", "--precision", "fp32",
                               "--engines", "4", *ARGS]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("one batch of n one-image requests") and "numpy fp32, the CPU; median of 2" in out[0]
    assert out[1] == "| requests in the batch | engines (none: numpy) |"
    assert [line.split(" | ")[0] for line in out[3:]] == ["| 1", "| 3"] and len(out) == 5


def test_each_set_of_engines_is_a_column(tiny_weights_path, tmp_path, monkeypatch, capsys):
    cupy_nvrtc(monkeypatch)
    monkeypatch.setitem(_CACHE, ("cupy", None), CubinBackend())
    monkeypatch.setattr(KernelSet, "_cache", {})
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path / "cache"))
    batches = []
    real = GpuSampler.images
    monkeypatch.setattr(GpuSampler, "images", lambda self, *a: batches.append(self.batch) or real(self, *a))
    assert serve_batches.main(["--weights", str(tiny_weights_path), "--engines", "4", "1,4", *ARGS]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "| requests in the batch | engines 4 | engines 1,4 |" and len(out) == 5
    first = batches.index(1)   # the second column's first run: its batch-1 engine warmed
    assert set(batches[:first]) == {4} and set(batches[first:]) == {1, 4}


@pytest.mark.parametrize("argv, message", [(["--engines", "1,x"], "batch sizes joined by commas"),
                                           (["--engines", "0"], "batch sizes >= 1"),
                                           (["--engines", "4", "--requests", "8"], "more than the engines")])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        serve_batches.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
