"""jetson-bench, its report and tools.lab.roofline on the CPU: a numpy-backend run writes JSON and CSV
with the expected keys and rows, usage errors exit 2 with one line, compare prints ratios, the GPU
path's bookkeeping runs against a recording fake backend, the Orin floors scale with the clock,
and plots are skipped without matplotlib."""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from jetson_unet import logs
from jetson_unet.bench import runner as bench
from jetson_unet.bench import report
from jetson_unet.model.config import Schedule, UNetConfig
from jetson_unet.model.plan import build_plan
from jetson_unet.model.weights import load_weights, random_params, save_weights

ROOT = Path(__file__).resolve().parents[2]
from tests.helpers.fakes import FakeBackend

import tools.lab.roofline as roofline

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32,
                  schedule=Schedule(timesteps=10, beta_end=0.005))
PHASES = ("import_s", "weights_s", "load_s", "first_step_s", "image_s", "total_s", "ready_s")
RUN_KEYS = {"run", "t0", "t1", "wall_s", "s_per_image", "images_per_s", "mean_power_w", "energy_j_per_image",
            "max_temp_c", "max_gpu_mhz", "telemetry_samples"}


@pytest.fixture(scope="module")
def weights_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "tiny.npz"
    save_weights(path, TINY, random_params(TINY, seed=3))
    return path


def base_args(weights_path: Path, out: Path) -> list:
    return ["--weights", str(weights_path), "--backend", "numpy", "--sampler", "ddim", "--steps", "2",
            "--runs", "1", "--warmup", "0", "--telemetry", "none", "--out", str(out)]


@pytest.fixture(scope="module")
def numpy_result(weights_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "out"
    assert bench.main(base_args(weights_path, out) + ["--batch", "1", "2"]) == 0
    return out


def test_a_run_samples_again_until_it_has_lasted_min_run_s(weights_path: Path, tmp_path: Path):
    """Power and energy need a window of many telemetry samples: --min-run-s repeats the sampling
    back to back and counts every image; without telemetry a run is one pass."""
    assert bench.main(base_args(weights_path, tmp_path / "a") + ["--batch", "2"]) == 0
    one = json.loads((tmp_path / "a" / "bench.json").read_text())["configs"][0]["runs"][0]
    assert one["passes"] == 1 and one["images"] == 2
    # at least two passes of about that length, even where a pass runs 2.5x slower than the first run
    # (1.5x failed once with a 2-core machine shared with a compile)
    least = 3 * one["wall_s"]
    assert bench.main(base_args(weights_path, tmp_path / "b") + ["--batch", "2", "--min-run-s", str(least)]) == 0
    run = json.loads((tmp_path / "b" / "bench.json").read_text())["configs"][0]["runs"][0]
    assert run["passes"] >= 2 and run["images"] == 2 * run["passes"] and run["wall_s"] >= least, run
    assert run["s_per_image"] == pytest.approx(run["wall_s"] / run["images"])
    args = bench.build_parser().parse_args(["--interval", "0.05"])
    assert bench.min_run_s(args, SimpleNamespace(source="nvml")) == pytest.approx(1.0)
    assert bench.min_run_s(args, SimpleNamespace(source="none")) == 0.0


def test_numpy_run_writes_json_and_csv(numpy_result: Path, weights_path: Path):
    doc = json.loads((numpy_result / "bench.json").read_text())
    assert doc["schema"] == report.SCHEMA
    for key in ("system", "model", "telemetry", "configs", "cold_starts", "notices", "args"):
        assert key in doc, key
    assert {"python", "numpy", "platform", "jetson", "gpu"} <= set(doc["system"])
    assert doc["model"]["content_hash"] == load_weights(weights_path).manifest["content_hash"]
    assert doc["model"]["config"]["schedule"]["timesteps"] == 10
    assert doc["telemetry"]["source"] == "none"
    assert [c["config"]["batch"] for c in doc["configs"]] == [1, 2]
    for c in doc["configs"]:
        assert c["config"]["steps"] == 2 and c["setup_s"] >= 0 and len(c["runs"]) == 1
        assert RUN_KEYS <= set(c["runs"][0]), RUN_KEYS - set(c["runs"][0])
        assert c["runs"][0]["s_per_image"] > 0 and c["runs"][0]["t1"] > c["runs"][0]["t0"] >= 0
    # one cold start serves both batches (it always runs --batch 1); numpy has no kernel cache
    assert len(doc["cold_starts"]) == 1 and doc["cold_starts"][0]["cold"]["rc"] == 0
    cold = doc["cold_starts"][0]["cold"]
    assert "warm" not in doc["cold_starts"][0] and "aot" not in doc["cold_starts"][0]
    assert all(cold[k] >= 0 for k in PHASES) and cold["compiles"] == 0 and cold["error"] is None
    assert cold["s"] >= cold["total_s"] >= (cold["import_s"] + cold["ready_s"] + cold["image_s"]) * (1 - 1e-12)
    for c in doc["configs"]:
        assert (c["cold_start_s"], c["cold_ready_s"]) == (cold["s"], cold["ready_s"])
        assert c["warm_ready_s"] is None and c["aot_ready_s"] is None and c["prepare_s"] is None
    rows = list(csv.DictReader((numpy_result / "bench.csv").open()))
    assert len(rows) == 2 and list(rows[0]) == list(report.CSV_FIELDS)
    for row, batch in zip(rows, ("1", "2")):
        assert (row["backend"], row["precision"], row["sampler"], row["steps"], row["batch"]) == \
            ("numpy", "fp32", "ddim", "2", batch)
        assert float(row["s_per_image"]) > 0 and float(row["cold_start_s"]) > 0 and float(row["cold_ready_s"]) > 0
        assert row["warm_ready_s"] == row["aot_ready_s"] == row["prepare_s"] == ""
        assert row["mean_power_w"] == "" and row["telemetry"] == "none"


@pytest.mark.parametrize("extra, needle", [
    (["--batch", "0"], "--batch must be >= 1"),
    (["--runs", "0"], "--runs must be >= 1"),
    (["--warmup", "-1"], "--warmup"),
    (["--interval", "0"], "--interval"),
    (["--precision", "fp16"], "numpy backend computes in fp32 or fp64"),
    (["--sampler", "ddpm", "--steps", "3"], "DDPM runs all 10 steps"),
    (["--steps", "11"], "DDIM steps must be in 1..10"),
    (["--telemetry", "bogus"], "invalid choice"),
    (["--weights", "/nonexistent/w.npz"], "no weights file"),
])
def test_bad_arguments_exit_2_with_one_line(weights_path, tmp_path, capsys, extra, needle):
    assert bench.main(base_args(weights_path, tmp_path / "o") + ["--cold", "none"] + extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jetson-bench: error:") and needle in err and "\n" not in err, err


def test_out_must_not_be_a_file(weights_path, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert bench.main(base_args(weights_path, tmp_path / "f")) == 2
    assert "not a folder" in capsys.readouterr().err


def test_compare_prints_ratios(numpy_result, tmp_path, capsys):
    doc = json.loads((numpy_result / "bench.json").read_text())
    for c in doc["configs"]:
        c["summary"]["s_per_image"] *= 2.0
        c["summary"]["images_per_s"] /= 2.0
    other = tmp_path / "b.json"
    other.write_text(json.dumps(doc))
    assert bench.main(["compare", str(numpy_result / "bench.json"), str(other)]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "s/image" in ln]
    assert len(lines) == 2 and all(ln.split()[-1] == "2.00" for ln in lines), out
    assert any(ln.split()[-1] == "0.50" for ln in out.splitlines() if "images/s" in ln)
    assert out.startswith("A: ") and "B/A" in out


def test_compare_rejects_what_is_not_a_result(numpy_result, tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{\"a\": 1}")
    assert bench.main(["compare", str(numpy_result / "bench.json"), str(bad)]) == 2
    assert "not a jetson-bench result" in capsys.readouterr().err
    assert bench.main(["compare", str(tmp_path / "missing.json"), str(bad)]) == 2


def test_plots_skipped_without_matplotlib(numpy_result, tmp_path, monkeypatch, notes):
    monkeypatch.setitem(sys.modules, "matplotlib", None)    # import matplotlib raises ImportError
    doc = json.loads((numpy_result / "bench.json").read_text())
    assert report.write_plots(doc, tmp_path) == []
    assert len(notes) == 1 and "matplotlib" in notes[0]
    assert list(tmp_path.iterdir()) == []


# ---- the GPU path's bookkeeping, against a backend that records instead of running ------------------

class FakeEvent:
    clock = 0

    def __init__(self) -> None:
        self.t = 0

    def record(self, stream) -> None:
        FakeEvent.clock += 1
        self.t = FakeEvent.clock

    def synchronize(self) -> None:
        pass

    def done(self) -> bool:
        return True

    def elapsed_ms(self, later: "FakeEvent") -> float:
        return 0.01 * (later.t - self.t)


class FakeGraph:
    def launch(self, stream) -> None:
        pass


class EventFakeBackend(FakeBackend):
    def event(self, timing: bool = True) -> FakeEvent:
        return FakeEvent()

    def wait(self, stream, event) -> None:
        pass

    def capture_begin(self, stream) -> None:
        pass

    def capture_end(self, stream) -> FakeGraph:
        return FakeGraph()


@pytest.mark.parametrize("mode, batch", [("gpu", 2), ("cpu", 3)])
def test_gpu_bookkeeping_with_a_fake_backend(weights_path, tmp_path, monkeypatch, mode, batch):
    fake = EventFakeBackend()
    monkeypatch.setattr(bench, "resolve_backend", lambda name, sms=None: ("cupy", fake))
    args = base_args(weights_path, tmp_path / "o") + ["--cold", "none", "--batch", str(batch), "--mode", mode]
    args[args.index("--backend") + 1] = "cupy"
    assert bench.main(args) == 0
    doc = json.loads((tmp_path / "o" / "bench.json").read_text())
    rec = doc["configs"][0]
    assert rec["config"] == {"backend": "cupy", "precision": "fp16", "mode": mode, "sampler": "ddim",
                             "steps": 2, "batch": batch, "graphs": mode == "gpu",
                             "noise": "device" if mode == "gpu" else "host"}   # --noise auto, as jetson-sample
    run = rec["runs"][0]
    assert run["gpu_ms_per_step"] > 0 and 0 < run["gpu_busy_fraction"] <= 1
    assert (run["cpu_ms_per_step"] > 0) == (mode == "cpu")
    eng = rec["engine"]
    assert eng["executors"] == (2 if mode == "cpu" else 1) and eng["launches_per_unet"] > 10
    assert eng["arena_bytes"] > 0 and eng["weights_bytes"] > 0
    assert rec["memory"]["device_mem_bytes"] == 0          # the fake's free memory never moves
    assert doc["system"]["gpu"]["name"] == "fake"


def test_breakdown_counts_overlapping_gpu_spans_once():
    ev = [{"ph": "X", "name": "unet 0", "ts": 0.0, "dur": 100.0},
          {"ph": "X", "name": "unet 0", "ts": 50.0, "dur": 100.0},       # the other half, overlapping
          {"ph": "X", "name": "p_sample 0.0", "ts": 100.0, "dur": 40.0},
          {"ph": "M", "name": "thread_name"}]
    b = report.breakdown(ev, n_steps=1, wall_s=300e-6)
    assert b["gpu_ms_per_step"] == pytest.approx(0.150) and b["gpu_kernel_ms_per_step"] == pytest.approx(0.2)
    assert b["cpu_ms_per_step"] == pytest.approx(0.04) and b["gpu_busy_fraction"] == pytest.approx(0.5)


# ---- roofline ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tc", roofline.ORIN_TC_PER_SM_CLK)
def test_roofline_orin_floors_positive_and_scale_with_clock(tc):
    plan = build_plan(UNetConfig())
    slow, fast = roofline.orin(625, tc), roofline.orin(1020, tc)
    f_slow, f_fast = roofline.call_floor_s(plan, slow), roofline.call_floor_s(plan, fast)
    assert 0 < f_fast < f_slow
    assert roofline.image_floor_s(plan, slow, steps=100) > 100 * f_slow > 0
    compute = [sum(o.compute_s for o in roofline.op_floors(plan, m)) for m in (slow, fast)]
    assert compute[0] / compute[1] == pytest.approx(1020 / 625)
    same_bw = roofline.call_floor_s(plan, roofline.orin(1020, tc, bw=roofline.NANO_8GB.bw[625]))
    assert f_slow * 625 / 1020 <= same_bw < f_slow        # clock alone: compute-bound ops only
    with pytest.raises(ValueError):
        roofline.orin(800, tc)


def test_roofline_prediction_without_a_gpu_is_the_floor_range():
    plan = build_plan(UNetConfig())
    pred = roofline.predict_orin(plan, "fp16", 1, 100)
    assert set(pred) == {"625 MHz", "1020 MHz"}
    for lo, hi in pred.values():
        assert 0 < lo <= hi < roofline.SEED_REPORT_S
    assert pred["1020 MHz"][1] < pred["625 MHz"][1]


def test_roofline_call_model_fit_and_prediction():
    plan = build_plan(UNetConfig())
    big = roofline.Machine("big GPU", 4e12, 7e14, 5e13)
    f1, f32 = (roofline.call_floor_s(plan, big, "fp16", b) for b in (1, 32))
    fixed = 4e-6     # measured = 1.5 x floor + 75 launches x 4 us, at both batches
    n = len(roofline.op_floors(plan, big))
    model = roofline.fit_call_model(plan, big, "fp16", (1, 1.5 * f1 + n * fixed), (32, 1.5 * f32 + n * fixed))
    assert model.k == pytest.approx(1.5) and model.fixed_s == pytest.approx(fixed) and model.n_ops == n
    floor = roofline.predict_orin(plan, "fp16", 1, 100)
    pred = roofline.predict_orin(plan, "fp16", 1, 100, model.k, model.fixed_s, this_mhz=1980.0)
    worst = roofline.predict_orin(plan, "fp16", 1, 100, model.e_call)
    for clock in floor:
        assert floor[clock][0] < pred[clock][0] <= pred[clock][1] < worst[clock][1]


def test_roofline_orin_nano_4gb_has_half_the_sms_and_a_third_of_the_8gb_super_bandwidth():
    plan = build_plan(UNetConfig())
    for mhz in (625, 1020):
        for tc in roofline.ORIN_TC_PER_SM_CLK:
            big, small = (roofline.orin(mhz, tc, board=b) for b in (roofline.NANO_8GB, roofline.NANO_4GB))
            assert small.tc == big.tc / 2 and small.ffma == big.ffma / 2 and small.bw == 34e9
            assert roofline.call_floor_s(plan, small) > roofline.call_floor_s(plan, big)
    preds = roofline.predictions(plan, "fp16", 1, 100, None)
    assert list(preds) == ["Orin Nano 8GB", "Orin Nano 4GB"]
    assert all([what for what, _ in lines] == ["floor"] for lines in preds.values())
    (_, p8), = preds["Orin Nano 8GB"]
    (_, p4), = preds["Orin Nano 4GB"]
    assert all(p4[c][0] > p8[c][0] for c in p8)


def test_roofline_rows_per_op_and_per_class(capsys):
    plan = build_plan(UNetConfig())
    big = roofline.Machine("big GPU", 4e12, 7e14, 5e13)
    floors = roofline.op_floors(plan, big, "fp16", 4)
    times = {o.name: 3.0 * o.floor_s + 1e-6 for o in floors}
    rows = roofline.roofline_rows(floors, times)
    assert [r.name for r in rows] == [o.name for o in floors] and all(r.ops == 1 for r in rows)
    r0 = rows[0]
    assert r0.tflops == pytest.approx(floors[0].flops / times[r0.name] / 1e12)
    assert r0.gbs == pytest.approx(floors[0].bytes / times[r0.name] / 1e9)
    classes = roofline.class_rows(rows)
    assert sum(c.ops for c in classes) == len(floors) == 75
    assert sum(c.time_s for c in classes) == pytest.approx(sum(times.values()))
    assert [c.time_s for c in classes] == sorted((c.time_s for c in classes), reverse=True)
    conv = next(c for c in classes if c.name == "conv3x3")
    assert conv.flops == pytest.approx(sum(o.flops for o in floors if o.op_class == "conv3x3"))
    levels = roofline.level_rows(plan, rows)
    assert [lv.name for lv in levels] == ["64x64", "32x32", "16x16", "8x8"]
    assert sum(lv.ops for lv in levels) == 75
    assert sum(lv.time_s for lv in levels) == pytest.approx(sum(times.values()))
    small = [o for o in floors if plan.tensors[o.name].size == 8]   # mid and downs.2's down conv among them
    assert levels[-1].ops == len(small) and levels[-1].bytes == pytest.approx(sum(o.bytes for o in small))
    ops_ms = {n: {"hot_ms": 1e3 * t, "cold_ms": 2e3 * t} for n, t in times.items()}
    model = roofline.CallModel(3.0, 1e-6, 75, 3.5)
    roofline.print_measured(plan, big, "fp16", 4, ops_ms, model, {4: 1.0, 32: 2.0}, top=5)
    out = capsys.readouterr().out
    assert "share" in out and "the 5 slowest ops, hot" in out and "100.0%" in out and "per level" in out
    eff = roofline.class_efficiency(plan, big, "fp16", 4, ops_ms)
    assert eff["cold"]["conv3x3"] == pytest.approx(2 * eff["hot"]["conv3x3"])


def child_line(ready: float, compiles: int) -> str:
    return json.dumps({"import_s": 0.5, "weights_s": 0.1, "load_s": ready - 0.2, "first_step_s": 0.1,
                       "image_s": 0.1, "total_s": ready + 0.6, "ready_s": ready, "compiles": compiles})


def test_gpu_cold_start_runs_cold_warm_and_aot_on_fresh_caches(weights_path, tmp_path, monkeypatch):
    calls = []
    lines = iter([child_line(9.0, 1), child_line(0.5, 0), None, child_line(0.4, 0)])   # None: --prepare

    def fake_child(cmd, env, timeout):
        calls.append((cmd, env))
        return {"s": 1.0 + len(calls), "rc": 0, "error": None, "out": next(lines)}

    monkeypatch.setattr(bench, "time_child", fake_child)
    args = bench.build_parser().parse_args(base_args(weights_path, tmp_path))
    cfg = bench.BenchConfig("cupy", "fp16", "gpu", "ddim", 2, 4, False)
    with logs.captured() as notes:
        rec = bench.cold_start(cfg, args)
    assert notes == []
    assert [rec[k]["s"] for k in ("cold", "warm", "aot")] == [2.0, 3.0, 5.0]
    assert [rec[k]["ready_s"] for k in ("cold", "warm", "aot")] == [9.0, 0.5, 0.4]
    assert [rec[k]["compiles"] for k in ("cold", "warm", "aot")] == [1, 0, 0] and rec["aot"]["prepare_s"] == 4.0
    (cold_cmd, cold_env), (warm_cmd, warm_env), (prep_cmd, prep_env), (aot_cmd, aot_env) = calls
    assert cold_cmd == warm_cmd == aot_cmd == rec["cmd"] and prep_cmd == rec["prepare_cmd"]
    for flags in (["--batch", "1"], ["--backend", "cupy"], ["--mode", "gpu"], ["--steps", "2"], ["--no-graphs"]):
        i = cold_cmd.index(flags[0])
        assert cold_cmd[i:i + len(flags)] == flags, (flags, cold_cmd)
    assert cold_cmd[:3] == [sys.executable, "-m", "jetson_unet.bench.coldstart"]
    assert prep_cmd[:4] == [sys.executable, "-m", "jetson_unet.cli", "--prepare"]
    for flags in (["--precision", "fp16"], ["--batch", "1"], ["--arch", "native"]):
        i = prep_cmd.index(flags[0])
        assert prep_cmd[i:i + 2] == flags, (flags, prep_cmd)
    for key in ("CUPY_CACHE_DIR", "JETSON_UNET_CACHE", "CUDA_CACHE_PATH"):
        assert warm_env[key] == cold_env[key] != os.environ.get(key)
        assert prep_env[key] == aot_env[key] != cold_env[key], "aot: caches of its own, filled by --prepare"
    assert not Path(cold_env["CUPY_CACHE_DIR"]).parent.parent.exists()     # the temporary caches are removed
    fields = report.cold_fields(rec)
    assert (fields["cold_ready_s"], fields["warm_ready_s"], fields["aot_ready_s"], fields["prepare_s"]) == \
        (9.0, 0.5, 0.4, 4.0)


@pytest.mark.parametrize("run, failure, needle", [
    ("cold", {"s": 1.0, "rc": 1, "error": "jetson: error: GPU error at step 0", "out": None}, "GPU error at step 0"),
    ("warm", {"s": None, "rc": None, "error": "no exit within 5 s", "out": None}, "no exit within 5 s"),
    ("warm", {"s": 1.0, "rc": 0, "error": None, "out": "Segmentation fault"}, "no phase times"),
    ("prepare", {"s": 1.0, "rc": 1, "error": "nvrtc: error", "out": None}, "--prepare failed: nvrtc: error"),
])
def test_a_failed_cold_start_process_is_a_notice_and_nulls(weights_path, tmp_path, monkeypatch, run, failure, needle,
                                                           notes):
    order = ["cold", "warm", "prepare", "aot"]

    def fake_child(cmd, env, timeout):
        name = order.pop(0)
        return dict(failure) if name == run else {"s": 1.0, "rc": 0, "error": None, "out": child_line(0.3, 0)}

    monkeypatch.setattr(bench, "time_child", fake_child)
    args = bench.build_parser().parse_args(base_args(weights_path, tmp_path))
    rec = bench.cold_start(bench.BenchConfig("cupy", "fp16", "gpu", "ddpm", 10, 1, True), args)
    failed = "aot" if run == "prepare" else run
    assert len(notes) == 1 and f"cold start ({failed})" in notes[0] and needle in notes[0], notes
    assert all(rec[failed][k] is None for k in PHASES + ("compiles",))
    assert all(rec[k]["ready_s"] == 0.3 for k in ("cold", "warm", "aot") if k != failed)
    if run == "prepare":
        assert order == ["aot"] and rec["aot"]["prepare_s"] is None, "no child on caches --prepare did not fill"


def test_a_real_failing_child_does_not_stop_the_bench(weights_path, tmp_path, monkeypatch, capsys):
    """The child itself fails (here: its weights vanish after the benchmark loaded them)."""
    real = bench.cold_commands

    def gone(cfg, args):
        cmd, prepare = real(cfg, args)
        cmd[cmd.index("--weights") + 1] = str(tmp_path / "gone.npz")
        return cmd, prepare

    monkeypatch.setattr(bench, "cold_commands", gone)
    assert bench.main(base_args(weights_path, tmp_path / "o")) == 0
    doc = json.loads((tmp_path / "o" / "bench.json").read_text())
    cold = doc["cold_starts"][0]["cold"]
    assert cold["rc"] == 2 and "gone.npz" in cold["error"] and cold["ready_s"] is None
    assert len(doc["notices"]) >= 1 and any("cold start (cold)" in n and "gone.npz" in n for n in doc["notices"])
    assert doc["configs"][0]["summary"]["cold_ready_s"] is None
    assert "cold start (cold)" in capsys.readouterr().err


def test_compare_reads_a_result_without_the_cold_start_phases(numpy_result, tmp_path, capsys):
    """A bench.json from before the phases (no *_ready_s, aot_start_s, prepare_s) still compares."""
    doc = json.loads((numpy_result / "bench.json").read_text())
    for c in doc["configs"]:
        for k in ("aot_start_s", "prepare_s", "cold_ready_s", "warm_ready_s", "aot_ready_s"):
            c["summary"].pop(k)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert bench.main(["compare", str(old), str(numpy_result / "bench.json")]) == 0
    out = capsys.readouterr().out
    ready = [ln for ln in out.splitlines() if "cold ready s" in ln]
    assert len(ready) == 2, out
    for ln in ready:
        a, b, ratio = ln.split()[-3:]
        assert a == "-" and float(b) > 0 and ratio == "-", ln
