"benchmarks/gpu_check.py --smoke: the GPU check's own code, run on the CPU at tiny shapes, so that it cannot rot"
import json, math, os, subprocess, sys
from conftest import ROOT


def _finite(x): return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_gpu_check_smoke(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    # the smoke run takes about a minute on 2 idle cores; the budget leaves room for a busy machine
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke", "--budget-s", "280",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["environment"]["smoke"] is True and _finite(res["total_s"])
    s = res["sections"]
    assert {k: v["status"] for k, v in s.items()} == dict(kernel="ok", engine="ok", train="ok"), \
        {k: v.get("error") for k, v in s.items()}
    # 1. the loss: every implementation measured (triton under its interpreter) and agreeing with the naive loss
    runs = s["kernel"]["runs"]
    impls = ("naive", "chunked", "triton") if "skipped" not in runs["triton"] else ("naive", "chunked")
    for impl in impls:
        assert _finite(runs[impl]["time_s"]) and runs[impl]["time_s"] > 0, (impl, runs[impl])
        assert _finite(runs[impl]["peak_bytes"]) and _finite(runs[impl]["loss"]), (impl, runs[impl])
    for impl in impls[1:]:
        assert s["kernel"][f"{impl}_loss_abs_diff"] < 1e-2, s["kernel"]
        assert _finite(s["kernel"][f"{impl}_speedup"]) and _finite(s["kernel"][f"{impl}_memory_ratio"])
    # 2. the engines: tokens generated, a rate, the ratio
    eng = s["engine"]
    for name in ("kit", "hf"):
        assert eng[name]["sequences"] == 4 and eng[name]["tokens"] > 0, eng[name]
        assert _finite(eng[name]["tokens_per_s"]) and eng[name]["tokens_per_s"] > 0
    assert _finite(eng["kit_over_hf"]) and eng["model"]["parameters"] > 9_700_000  # the real 151,936-row vocabulary
    # 3. the training steps: both algorithms trained tokens with finite losses, times and memory
    tr = s["train"]
    for name in ("grpo", "bppo"):
        assert len(tr[name]["steps"]) == 2, tr[name]
        for row in tr[name]["steps"]:
            assert _finite(row["loss"]) and _finite(row["grad_norm"]) and row["skipped"] == 0, row
            assert _finite(row["wall_s"]) and _finite(row["update_s"]) and row["peak_bytes"] > 0, row
        assert tr[name]["trained_tokens"] > 0 and _finite(tr[name]["median_wall_s"]), tr[name]
    assert _finite(tr["bppo_step_speedup"]) and _finite(tr["bppo_update_speedup"])
