"tools/gpu_check.py --smoke: the GPU check's own code, run on the CPU at tiny shapes, so that it cannot rot"
import importlib.util, json, math, os, subprocess, sys
import pytest, torch
from conftest import ROOT

SCRIPT = ROOT / "tools" / "gpu_check.py"


def _finite(x): return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _env(): return os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def _planner_exists() -> bool:
    if importlib.util.find_spec("bppo_kit.plan") is None: return False
    import bppo_kit.plan
    return callable(getattr(bppo_kit.plan, "plan", None))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    "One smoke run (about 100 s on 2 busy cores): its exit code, its JSON and its printed summary"
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], env=_env(), capture_output=True,
                       text=True, timeout=420, cwd=out.parent)
    return r, json.loads(out.read_text())


def test_every_section_ok(smoke):
    r, res = smoke
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert res["smoke"] is True and _finite(res["total_s"]) and res["failed"] == []
    s = res["sections"]
    # vLLM's section runs where vLLM imports (tests/test_vllm.py runs it there); elsewhere it says why it did not
    vllm = "ok" if importlib.util.find_spec("vllm") else "n/a"
    assert {k: v["status"] for k, v in s.items()} == dict.fromkeys(
        ("preflight", "triton", "kernel", "memory", "train", "engine", "cost"), "ok") | {"vllm": vllm}, \
        {k: v.get("error") for k, v in s.items()}
    if vllm == "n/a": assert "vllm does not import" in s.pop("vllm")["reason"] and "vllm       not run" in r.stdout
    for name, sec in s.items():
        assert _finite(sec["seconds"]) and sec["checks"] and all(sec["checks"].values()), (name, sec["checks"])
    assert "failed: nothing" in r.stdout


def test_preflight(smoke):
    pf = smoke[1]["sections"]["preflight"]
    assert pf["torch"] == torch.__version__ and pf["python"] and pf["transformers"] and pf["device"]
    assert pf["cuda_available"] is False and pf["triton_interpret"] == "1"
    # nothing the check imports plots: a GPU image without matplotlib runs it
    assert pf["kit_imports_matplotlib"] is False and "bppo_kit.trainer" in pf["kit_modules"]
    assert set(pf["optional"]) == {"accelerate", "peft", "vllm", "matplotlib", "math_verify"}
    for name, line in pf["missing"].items(): assert pf["optional"][name] in line and "needed for" in line


def test_triton_matches_float64(smoke):
    tr = smoke[1]["sections"]["triton"]
    for dt, tol in (("bfloat16", dict(loss=1e-4, grad=1e-2)), ("float32", dict(loss=1e-4, grad=1e-4))):
        e = tr[dt]["errors"]
        assert all(_finite(v) for v in e.values()) and e["loss"] < tol["loss"], (dt, e)
        assert max(e["dH"], e["dW"]) < tol["grad"] and tr[dt]["masked_dH_max"] == 0, (dt, e)
        assert all(_finite(v) for v in tr[dt]["repeat"]["max_rel_diff"].values()), tr[dt]["repeat"]
    # bfloat16 gradients carry bfloat16's rounding; float32 ones do not
    assert tr["bfloat16"]["errors"]["dW"] > 10 * tr["float32"]["errors"]["dW"]


def test_kernel_in_the_trainers_dtype(smoke):
    k = smoke[1]["sections"]["kernel"]
    assert k["shape"]["masters"] == "float32" and k["shape"]["compute"] == "bfloat16" and k["auto_is"] == "triton"
    for impl in ("naive", "chunked", "auto"):
        r = k["runs"][impl]
        assert _finite(r["time_s"]) and r["time_s"] > 0 and _finite(r["peak_bytes"]) and _finite(r["loss"]), (impl, r)
        assert _finite(r["loss_rel_err"]), (impl, r)
    # the full-logits path rounds the logits to bfloat16; Triton sums bf16 products in float32
    assert k["runs"]["auto"]["loss_rel_err"] < 1e-4 < k["runs"]["naive"]["loss_rel_err"], k["runs"]
    assert _finite(k["auto_speedup"]) and _finite(k["chunked_memory_ratio"])


def test_memory_against_the_planner(smoke):
    m = smoke[1]["sections"]["memory"]
    assert set(m["runs"]) == {"64", "128"} and m["model"]["gradient_checkpointing"] is True
    for T, r in m["runs"].items():
        assert r["trained_tokens"] == r["micro_batch"] * r["micro_batches"] * int(T), r
        assert _finite(r["peak_bytes"]) and r["peak_bytes"] > 0 and _finite(r["first_call"]["peak_bytes"]), r
        assert _finite(r["grad_norm"]) and r["grad_norm"] > 0 and r["skipped"] == 0, r
        if _planner_exists():
            assert _finite(r["measured_over_predicted"]) and r["predicted_bytes"] > 0, r
            # the ledger: each state row of the plan beside the tensors the trainer holds for it
            assert set(r["ledger"]) == {"weights (float32 masters)", "AdamW state (2 x float32)", "generation copy",
                                        "kit engine KV cache"}, r["ledger"]
            assert all(abs(x["held_over_planned"] - 1) <= 0.1 and x["held_bytes"] > 0 for x in r["ledger"].values())
        else: assert r["planner"] == "unavailable" and r["reason"], r


def test_train_step_per_kernel(smoke):
    tr = smoke[1]["sections"]["train"]
    assert set(tr["runs"]) == {"naive", "chunked", "auto"} and tr["workload"]["auto_is"] == "triton"
    for k, r in tr["runs"].items():
        assert _finite(r["loss"]) and _finite(r["grad_norm"]) and r["grad_norm"] > 0 and r["skipped"] == 0, (k, r)
        # bfloat16 with tis_cap > 0 records the engine's log-probs: the sampler's KL to the trainer is measured
        assert _finite(r["sampler_kl"]) and r["sampler_kl"] >= 0, (k, r)
        assert _finite(r["wall_s"]) and r["peak_bytes"] > 0 and r["trained_tokens"] > 0, (k, r)
        assert r["grad_norm_rel_diff"] < 0.05, (k, r)
    assert len({r["rollout_digest"] for r in tr["runs"].values()}) == 1  # one seed, one rollout


def test_engine_throughput_and_greedy_identity(smoke):
    e = smoke[1]["sections"]["engine"]
    assert e["kit"]["sequences"] == 4 and e["kit"]["prompt_tokens"] == 4 * 48 and e["kit"]["new_tokens"] > 0
    assert _finite(e["kit"]["tokens_per_s"]) and e["kit"]["tokens_per_s"] > 0
    g = e["greedy"]["float32"]
    assert g["prompts"] == 3 and g["identical_fraction"] == 1.0 and g["first_divergence"] is None, g
    assert all(r["identical"] and r["kit_tokens"] == r["hf_tokens"] > 0 for r in g["rows"]), g["rows"]


def test_preflight_without_matplotlib(tmp_path):
    "A GPU image may have no plotting: the preflight alone, with matplotlib made unimportable, passes"
    out = tmp_path / "preflight.json"
    code = ("import runpy, sys\nsys.modules['matplotlib'] = None\n"
            f"sys.argv = ['gpu_check.py', '--smoke', '--only', '', '--out', {str(out)!r}]\n"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    pf = json.loads(out.read_text())["sections"]["preflight"]
    assert pf["status"] == "ok" and pf["kit_imports_matplotlib"] is False and pf["checks"], pf


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stop is for a machine without CUDA")
def test_full_mode_stops_without_cuda(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=_env(), capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 3, (r.stdout[-2000:], r.stderr[-2000:])
    assert r.stdout.strip().splitlines()[-1] == "gpu_check: stopped at the preflight: no CUDA device " \
                                                "(torch.cuda.is_available() is False)"
    res = json.loads(out.read_text())
    assert res["sections"]["preflight"]["status"] == "stopped" and res["failed"] == ["preflight (stopped)"]
    assert set(res["sections"]) == {"preflight"} and res["sections"]["preflight"]["torch"] == torch.__version__


def test_cost_points_beside_the_model(smoke):
    "The cost section measures each point and sets the cost model's prediction beside it (CPU: numbers only)"
    c = smoke[1]["sections"]["cost"]
    decode = [p for p in c["points"] if p["phase"] == "decode pass"]
    update = [p for p in c["points"] if p["phase"] == "update"]
    assert [p["rows"] for p in decode] == [1, 4] and [p["tokens"] for p in update] == [64, 128]
    for p in c["points"]:
        assert _finite(p["measured_s"]) and p["measured_s"] > 0 and _finite(p["predicted_s"]) and p["predicted_s"] > 0
        assert p["error"] == pytest.approx(p["predicted_s"] / p["measured_s"] - 1)
    assert c["priced_as"] == "H100" and c["checks"] == {"measured": True}


def test_the_full_run_fits_five_minutes_and_says_so(smoke):
    "Issue 43: the full run's budget is at most 300 s, printed section by section before anything runs"
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    line = gc.estimate_line(gc.FULL, gc.FULL["budget_s"], list(gc.SECTIONS))
    assert gc.FULL["budget_s"] <= 300 and sum(gc.FULL["caps"].values()) <= 300, gc.FULL["caps"]
    assert line.startswith("gpu_check: at most 300 s: preflight 25 s, triton 35 s"), line
    # the memory section measures at the math preset's shape: micro-batches of 8 x (1,024 + 3,072) tokens at 1.5B
    m = gc.FULL["memory"]
    assert (m["size"], m["micro_batch"], m["prompt"] + max(m["tokens"]), m["kernel"]) == ("1.5b", 8, 4096, "auto"), m
    r, _ = smoke
    first = r.stdout.splitlines()[0]
    assert first.startswith("gpu_check: at most ") and all(f"{n} " in first for n in gc.SECTIONS), first
