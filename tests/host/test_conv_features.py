"""The op features each GEMM-conv kernel is compiled for (ops/keys.py FEATURES, kernels/conv.cu
CONV_FEATURE_ARGS) against the arguments its launch passes: a feature the key leaves out is compiled
as a null pointer or a constant, so an op that has it would silently lose it. Every launch of the
shipped model's executors, for the tiles of every shipped tuning file and the built-in ones."""
from __future__ import annotations

import functools

import pytest

from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.ops.keys import FEATURES, ConvKey
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.ops.tuning import SHIPPED
from jetson_unet.model.weights import load_weights
from jetson_unet.pipeline import default_weights_path
from tests.helpers.fakes import FakeBackend

shipped_weights = functools.lru_cache(maxsize=None)(lambda: load_weights(default_weights_path()))

PARAMS = ("x_ Hin Win Cin ldx xr_ Cr ldr w_ ldw nk0 nk1 bias tbias tb_stride t_idx gn_w gn_b gn_fold gn_part "
          "gn_P gn_eps res_ ldres out_ Hout Wout N ldo st_part act psi_w psi_b splits ws counters oscale").split()


def arg_features(args) -> str:
    """The letters of FEATURES that a launch's CONV_PARAMS arguments use."""
    a = dict(zip(PARAMS, (int(v) if not isinstance(v, float) else v for v in args)))
    has = {"g": a["act"] == 1, "t": a["tbias"] != 0, "n": a["gn_part"] != 0,
           "k": a["nk1"] > 0 and a["Cr"] > 0 and a["xr_"] != 0, "r": a["res_"] != 0, "s": a["st_part"] != 0,
           "p": a["splits"] > 1, "o": a["oscale"] != 0}
    return "".join(c for c in FEATURES if has[c])


def tuned_runs():
    """(precision, batch, SM count, tiles file or "builtin") of every shipped tuning file, and built-in runs."""
    runs = [("fp16", 1, 8, "builtin"), ("fp16", 16, 132, "builtin"), ("fp32", 1, 8, "builtin"),
            ("bf16", 4, 8, "builtin"), ("fp32", 64, 132, "builtin")]
    for f in sorted(SHIPPED.glob("tiles-*.json")):
        sms, batch = int(f.name.split("sm-")[0].rsplit("-", 1)[1]), int(f.stem.rsplit("-b", 1)[1])
        runs.append(("fp16", batch, sms, str(f)))
    return runs


@pytest.mark.parametrize("run", tuned_runs(), ids=lambda r: f"{r[0]}-b{r[1]}-{r[2]}sm-{r[3].rsplit('/', 1)[-1]}")
def test_every_gemm_launch_has_the_features_its_kernel_was_compiled_for(run):
    precision, batch, sms, tiles = run
    be = FakeBackend(arch=90, sms=sms, free=64 << 30)
    with GpuExecutor(shipped_weights(), precision, batch=batch, backend=be, policy=KernelPolicy(tiles=tiles)) as ex:
        seen = 0
        for spec, L in zip(ex.specs, ex.launches):
            if not isinstance(spec.key, ConvKey):
                continue
            seen += 1
            got = arg_features(L.args)
            want = FEATURES if "p" in got else got   # split-K: the generic kernel (ops.conv.with_features)
            assert spec.key.feat == want, (L.name, spec.key.symbol, got)
        assert seen > 40


def test_feature_letters_are_checked():
    with pytest.raises(ValueError):
        ConvKey("fp16", 64, 64, 64, 2, 2, 3, 1, 1, 8, False, feat="ng")
    k = ConvKey("fp16", 64, 64, 64, 2, 2, 3, 1, 1, 8, False, 3, feat="gns")
    assert k.symbol.endswith("_s3_xgns") and k.instance().endswith(", 37)")   # bits 0, 2, 5
    assert ConvKey("fp16", 64, 64, 64, 2, 2, 3, 1, 1, 8, False, 3).symbol.endswith("_x0")
