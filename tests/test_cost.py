"""The GPU cost model (bppo_kit.cost) on hand-computed cases, the traces it reads (the kit engine's pass histogram,
the update's work), `bppo cost` on real runs, and a comparison's predicted GPU column."""
import json, subprocess
import pytest
from conftest import ROOT, bppo_cmd, needs_tiny
from bppo_kit import cost as K

M15 = "Qwen/Qwen2.5-1.5B-Instruct"
SMALL = ["train.prompts_per_step=4", "rollout.group_size=4", "data.eval_size=4", "rollout.max_new_tokens=60"]


def test_one_row_is_the_weights_over_the_bandwidth():
    a, g, eff = K.shape(M15), K.GPUS["H100"], K.ASSUMED
    p = K.decode_pass(M15, "H100", rows=1, context=200)
    weights = 2 * a.matmul  # bf16 bytes of every matmul weight: 3.08 GB
    assert 3.0e9 < weights < 3.2e9
    assert p["bound"] == "memory"
    assert p["seconds"] == pytest.approx(weights / (g.bandwidth * eff.bandwidth), rel=0.01)
    assert K.decode_pass_seconds(M15, "H100", 1, 200) == p["seconds"]


def test_the_roofline_turns_where_it_says():
    "FLOPs 2·W·r against bytes 2·W (bf16): compute-bound past r* = (peak·e_f) / (bandwidth·e_b), a few hundred rows"
    g, eff = K.GPUS["H100"], K.ASSUMED
    ridge = g.flops * eff.decode_flops / (g.bandwidth * eff.bandwidth)
    assert 150 < ridge < 300
    turn = next(r for r in range(1, 2000) if K.decode_pass(M15, "H100", r, 0)["bound"] == "compute")
    # each row's activations and float32 logits add bytes: solve 2·W·r / (F·e_f) = (2·W + r·act) / (B·e_b) by hand
    a = K.shape(M15)
    act = 2 * a.layers * (8 * a.hidden + 3 * a.inter) + 4 * a.vocab
    w = 2 * a.matmul
    mem, comp = g.bandwidth * eff.bandwidth, g.flops * eff.decode_flops
    exact = (w / mem) / (w / comp - act / mem)
    assert ridge < turn and abs(turn - exact) <= 1, (ridge, exact, turn)
    per_row = [K.decode_pass_seconds(M15, "H100", r, 0) / r for r in (1, 8, 64, 512)]
    assert per_row == sorted(per_row, reverse=True)  # a pass is shared by its rows


def test_intensity_grows_with_rows_and_falls_with_context():
    ops = lambda r, c: (lambda p: p["flops"] / p["bytes"])(K.decode_pass(M15, "H100", r, c))
    assert ops(1, 100) < ops(16, 1600) < ops(64, 6400) < ops(256, 25600)
    assert ops(64, 64 * 4000) < ops(64, 64 * 100)  # a long KV cache is read for little work


def test_the_schedule():
    assert K.pipeline([2, 2, 2], [1, 1, 1], 0) == [3, 6, 9]
    assert K.pipeline([2, 2, 2], [1, 1, 1], 1) == [3, 5, 7]
    assert K.pipeline([1, 3, 1], [2, 2, 2], 2)[-1] <= K.pipeline([1, 3, 1], [2, 2, 2], 1)[-1]


@needs_tiny
def test_the_engines_histogram_accounts_for_every_pass():
    from bppo_kit.core import SamplingParams
    from bppo_kit.policy import load_policy
    from bppo_kit.rollout import KitEngine
    model, tok = load_policy("tiny")
    eng = KitEngine(model, tok, max_slots=6)
    prompts = [tok(f"Q: {i}+{i}\nA:").input_ids for i in range(10)]
    eng.generate(prompts, 2, SamplingParams(max_new_tokens=40, seed=0))
    st, hist = eng.stats, eng.stats["rows_hist"]
    assert sum(n for n, _ in hist.values()) == st["decode_steps"]
    assert sum(r * n for r, (n, _) in hist.items()) == st["busy_slot_steps"]
    assert sum(c for _, c in hist.values()) == st["kv_read_tokens"] > 0
    assert max(hist) <= 6 and st["requests"] == 20 and st["prefill_tokens"] >= sum(map(len, prompts))


@needs_tiny
@pytest.mark.slow
def test_bppo_cost_on_a_run_and_a_comparison(tmp_path):
    sets = [x for o in SMALL for x in ("--set", o)]
    run = tmp_path / "run"
    r = subprocess.run(bppo_cmd() + ["train", "--preset", "cpu-demo", "--algo", "grpo", "--steps", "2", "--out",
                                     str(run), "--quiet", *sets], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run(bppo_cmd() + ["cost", str(run), "--gpu", "H200", "--async", "1"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "| run |" in r.stdout and "H200" in r.stdout, r.stderr[-2000:]
    c = json.loads((run / "cost.json").read_text())
    assert c["predicted"] and c["trace"] == "passes" and c["staleness"] == 1 and len(c["steps"]) == 2
    for s in c["steps"]:
        assert {"decode_s", "prefill_s", "update_s", "sync_s", "ops_per_byte", "gpu_s"} <= set(s)
        assert s["decode_s"] > 0 and s["update_s"] > 0 and s["ops_per_byte"] > 0
    assert c["summary"]["total_s"] == pytest.approx(sum(s["gpu_s"] for s in c["steps"]))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    mean = sum(r["generated_tokens"] for r in rows) / sum(r["requests"] for r in rows)
    r = subprocess.run(bppo_cmd() + ["cost", str(run), "--gpu", "H200", "--async", "1", "--mean-length", "500"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    long = json.loads((run / "cost.json").read_text())
    assert r.returncode == 0 and "as long as the run's" in r.stdout, r.stderr[-2000:]
    assert long["lengths_scale"] == pytest.approx(500 / mean) and c["lengths_scale"] == 1.0
    assert long["summary"]["decode_s_per_step"] > 0.9 * (500 / mean) * c["summary"]["decode_s_per_step"]
    bad = subprocess.run(bppo_cmd() + ["cost", str(tmp_path / "none"), "--gpu", "H100"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "neither a run folder" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_plan_prints_predicted_seconds():
    r = subprocess.run(bppo_cmd() + ["plan", "--preset", "math-qwen2.5-1.5b", "--gpu", "A100"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    line = next(x for x in lines if x.startswith("predicted seconds per step on 1 x A100"))
    assert "decode" in line and "update" in line and "fits" in lines[-1]  # the verdict stays last


def test_a_comparison_reads_predicted_gpu_seconds(tmp_path):
    "cost.json's per-step gpu_s is a unit of the report like the others: totals, curves, the GPU column"
    from bppo_kit.report import accuracy_curve, metric_rows, run_summary
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(dict(step=i, wall_s=1.0)) + "\n" for i in range(3)))
    (run / "eval.jsonl").write_text('{"step": 0, "accuracy": 0.5}\n{"step": 3, "accuracy": 0.7}\n')
    (run / "cost.json").write_text(json.dumps(dict(steps=[dict(step=i, gpu_s=0.25) for i in range(3)])))
    assert [r["gpu_s"] for r in metric_rows(run)] == [0.25] * 3
    assert run_summary(run)["total_gpu_s"] == 0.75
    assert accuracy_curve(run, "gpu_s") == [(0.0, 0.5), (0.75, 0.7)]


def test_the_kit_samplers_bytes_are_counted_and_priced():
    "Issue 52: the kit engine's draw at Qwen2.5's vocabulary, op by op, and what it adds to a decoding pass"
    import torch
    from bppo_kit.config import get_config
    from bppo_kit.kit_engine import sample_tokens
    V = 151936
    for n in (8, 64):
        logits, keys = torch.randn(n, V), torch.arange(n)
        for truncated, top_p in ((False, 1.0), (True, 0.9)):
            got = K.op_bytes(sample_tokens, logits, 1.0, 0, top_p, keys, keys, keys) / (n * V)
            assert abs(got / K.SAMPLER_BYTES[truncated] - 1) < 0.1, (n, truncated, got)
    kit = get_config("cpu-demo", overrides=[f"model.name_or_path={M15}", "rollout.engine=kit"])
    hf = get_config("cpu-demo", overrides=[f"model.name_or_path={M15}", "rollout.engine=hf"])
    nucleus = get_config("cpu-demo", overrides=[f"model.name_or_path={M15}", "rollout.engine=kit", "rollout.top_p=0.9"])
    assert (K.sampler_bytes(kit), K.sampler_bytes(nucleus), K.sampler_bytes(hf)) == \
        (K.SAMPLER_BYTES[False], K.SAMPLER_BYTES[True], 0)
    rows = kit.train.prompts_per_step * kit.rollout.group_size
    extra = kit.rollout.max_new_tokens * K.SAMPLER_BYTES[False] * rows * V / (3.35e12 * K.ASSUMED.bandwidth)
    with_draw, without = K.plan_seconds(kit, "H100")["decode_s"], K.plan_seconds(hf, "H100")["decode_s"]
    # memory-bound passes: the draw's bytes over the bandwidth, pass by pass
    assert abs((with_draw - without) / extra - 1) < 1e-6, (with_draw, without, extra)


def _run(folder, steps: int = 4):
    "A run folder of `steps` steps at the default config (the tiny policy: its tokens are characters)"
    from bppo_kit.config import Config, save_config
    folder.mkdir()
    save_config(Config(), folder / "config.yaml")
    row = dict(decode_rows={"128": [40, 128 * 40 * 120], "16": [60, 16 * 60 * 200]}, prefill_tokens=128 * 80,
               update_tokens=128 * 300, logprob_tokens=0, generated_tokens=6000, requests=128)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row | dict(step=i)) + "\n" for i in range(steps)))
    return folder


def test_the_band_widens_with_the_overhead_range(tmp_path):
    "Issue 55: a prediction's band over the cost model's assumptions; wider assumptions, a wider band"
    run = _run(tmp_path / "r")
    bands = {o: K.price_band(run, overheads=(0.0, o), model=M15, gpu="H100") for o in (1e-3, 2.5e-3, 5e-3)}
    widths = [b["high"] - b["low"] for b in bands.values()]
    assert widths == sorted(widths) and widths[0] < widths[-1], widths
    for b in bands.values(): assert b["low"] <= b["default"] <= b["high"]
    # in turn every second adds up: 5 ms on each of 4 x 100 passes and 0.1 s on each of 4 steps, exactly
    assert bands[5e-3]["high"] == pytest.approx(bands[5e-3]["default"] + 400 * 5e-3 + 4 * K.SLEEP_WAKE_S, rel=1e-12)
    full = K.price_band(run, model=M15, gpu="H100")
    default = K.predict_run(run, M15, "H100")["summary"]["total_s"]
    assert len(full["grid"]) == 8 and full["default"] == pytest.approx(default)
    # a default that is no point of the grid (an overhead of 10 ms) may fall outside the band, and here it does
    off = K.price_band(run, eff=K.Efficiency(pass_overhead_s=1e-2), model=M15, gpu="H100")
    assert off["default"] > off["high"]


def test_cost_json_holds_the_band_and_the_token_unit(tmp_path):
    run = _run(tmp_path / "r")
    out = K.write_cost(run, model=M15, gpu="H100", k=1)
    saved = json.loads((run / "cost.json").read_text())
    assert saved["band"] == out["band"] and saved["token_unit"] == "characters"
    assert saved["band"]["default"] == pytest.approx(saved["summary"]["total_s"])
    assert "overhead of 0, 1, 2.5 or 5 ms" in K.cost_lines({"r": out})[0]
