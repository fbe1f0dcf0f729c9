"""The GPU path in one run: the fused loss, the engines and a training step at Qwen2.5's real shapes; one JSON.

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out gpu_check.json      # one GPU (H200: within 8 minutes)
    OMP_NUM_THREADS=2 PYTHONPATH=. python3 benchmarks/gpu_check.py --smoke --out runs/gpu_check_smoke.json  # CPU

Needs torch, transformers (and its tokenizers), triton on the GPU; no hub, no network, no vLLM: the models are
random-weight Qwen2.5 shapes with a byte-level BPE tokenizer trained on the kit's own text (`bppo_kit.shapes`).

Sections, in this order; each one is guarded (an error or a time-out is recorded under its name, with what it had
measured so far, and the next section runs), and the JSON is rewritten after each:

1. `kernel`: `bppo_kit.kernels.prefix_policy_loss` forward + backward at Qwen2.5-1.5B's LM head (N = 16,384 tokens,
   H = 1,536, V = 151,936, bfloat16, half of every 1,024-token sequence trained), naive logits vs the chunked PyTorch
   path vs the Triton kernels: median time of 3 (CUDA events) and peak memory above the inputs, after a warm-up (inputs
   and measurement from `benchmarks/loss_kernel.py`).
2. `engine`: tokens/s of the kit's `KitEngine` vs transformers' `generate` (`HFEngine`) vs its continuous batching
   (`HFBatchEngine`, when this transformers has it) on a random Qwen2.5-1.5B-shaped model in bfloat16: 16 prompts x 8
   = 128 sequences, temperature 1, up to 512 new tokens (random weights rarely stop), after a small warm-up call.
3. `train`: one training run per algorithm through the kit's loop (`bppo_kit.trainer.setup` and `train_step`: rollout
   with the kit's engine, grading, advantages, the update) on a random Qwen2.5-0.5B-shaped checkpoint:
   model.dtype=bfloat16, train.loss_kernel=chunked, model.gradient_checkpointing=True, 16 prompts x group 8, 512 new
   tokens, micro-batches of 8, lr 1e-6, 3 steps each of GRPO and BPPO; step, rollout and update time (median of the
   steps after the first) and peak memory per step. A random model never answers right, so rewards are coin flips
   (`benchmarks/coin_rewards.py`: the algorithms `grpo_coin`, `bppo_coin`); otherwise nothing would train.

`--smoke` runs the same code on the CPU at tiny shapes (the `tiny` Qwen2.5 shape keeps the real vocabulary) in well
under 2 minutes, the Triton kernels under Triton's interpreter: `tests/test_gpu_check.py` runs it, so that this script
cannot rot. Its figures only show that the code runs. A total time budget (`--budget-s`) bounds the whole run.
"""
import argparse, gc, json, math, os, platform, signal, statistics, sys, tempfile, time, traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# --smoke runs the Triton kernels under Triton's CPU interpreter, which must be chosen before anything imports triton
# (transformers' model code does)
if "--smoke" in sys.argv[1:]: os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402
import coin_rewards  # noqa: E402,F401 -- registers grpo_coin and bppo_coin
import loss_kernel as lk  # noqa: E402
from bppo_kit.config import get_config  # noqa: E402
from bppo_kit.data import load_synthetic_eval  # noqa: E402
from bppo_kit.kernels import triton_available  # noqa: E402
from bppo_kit.rollout import HFBatchEngine, HFEngine, KitEngine, SamplingParams, hf_batch_available  # noqa: E402
from bppo_kit.runs import open_run  # noqa: E402
from bppo_kit.shapes import bpe_tokenizer, param_count, qwen2_5_config, real_shaped, save_real_shaped  # noqa: E402
from bppo_kit.trainer import setup, train_step  # noqa: E402

FULL = dict(kernel=dict(N=16384, H=1536, V=151936, seq=1024, repeats=3),
            engine=dict(size="1.5b", prompts=16, n=8, max_new=512, engines=("kit", "hf", "hf_cb")),
            train=dict(size="0.5b", prompts=16, group=8, max_new=512, steps=3, micro_batch=8),
            shares=dict(kernel=0.26, engine=0.37, train=1.0), budget_s=460)  # kernel <= 120 s, engine <= 170 s
SMOKE = dict(kernel=dict(N=128, H=32, V=1024, seq=64, repeats=1),
             engine=dict(size="tiny", prompts=2, n=2, max_new=8, engines=("kit", "hf")),  # hf_cb: 30 s to start here
             train=dict(size="tiny", prompts=2, group=4, max_new=8, steps=2, micro_batch=8),
             shares=dict(kernel=0.3, engine=0.3, train=1.0), budget_s=110)

class SectionTimeout(Exception):
    "A section ran past its share of the time budget"

def _alarm(signum, frame): raise SectionTimeout("ran past its share of the time budget")

def finite(x) -> bool: return isinstance(x, (int, float)) and math.isfinite(x)

def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:600]

def kernel_section(P: dict, dev: str, res: dict):
    "Naive vs chunked vs Triton `prefix_policy_loss`, forward + backward, bfloat16"
    k = P["kernel"]
    res["shape"] = dict(N=k["N"], H=k["H"], V=k["V"], seq=k["seq"], masked_frac=0.5, dtype="bfloat16")
    x = lk.make_inputs(k["N"], k["H"], k["V"], torch.bfloat16, dev, seq=k["seq"])
    res["runs"] = runs = {}
    def clear(): x["hidden"].grad = x["weight"].grad = None
    for impl in ("naive", "chunked", "triton"):
        if impl == "triton" and not triton_available():
            runs[impl] = dict(skipped="triton is not installed"); continue
        try: runs[impl] = lk.measure(lambda impl=impl: lk.step(x, impl), k["repeats"], dev, reset=clear)
        except SectionTimeout: raise
        except Exception as e: runs[impl] = dict(error=error_text(e))
        clear(); gc.collect()
        if dev == "cuda": torch.cuda.empty_cache()
    ok = {n: r for n, r in runs.items() if "time_s" in r}
    if "naive" in ok:
        for n in ok.keys() - {"naive"}:
            res[f"{n}_speedup"] = ok["naive"]["time_s"] / ok[n]["time_s"]
            res[f"{n}_memory_ratio"] = ok["naive"]["peak_bytes"] / max(ok[n]["peak_bytes"], 1)
            res[f"{n}_loss_abs_diff"] = abs(ok[n]["loss"] - ok["naive"]["loss"])
    res["logits_bytes_bf16"] = k["N"] * k["V"] * 2

def time_engine(eng, prompts: list[str], n: int, max_new: int, dev: str) -> dict:
    "One warm-up call, then `n` completions of each prompt, timed, with the peak memory of the call"
    eng.generate(prompts[:2], 2, SamplingParams(temperature=1.0, max_new_tokens=8, seed=1, logprobs=False))
    peak = lk.Peak(dev); peak.reset()
    t0 = time.perf_counter()
    cs = eng.generate(prompts, n, SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=0, logprobs=False))
    dt = time.perf_counter() - t0
    toks = sum(c.n_tokens for c in cs)
    return dict(sequences=len(cs), tokens=toks, seconds=dt, tokens_per_s=toks / dt, peak_bytes=peak.read()[0],
                stopped_early=sum(c.finish_reason == "eos" for c in cs), mean_tokens=toks / max(len(cs), 1))

def engine_section(P: dict, dev: str, tok, res: dict):
    "KitEngine vs HFEngine vs HFBatchEngine tokens/s on a random model of the engine shape"
    e = P["engine"]
    model, tok = real_shaped(e["size"], tok, "bfloat16", seed=0, device=dev)
    res["model"] = dict(size=e["size"], parameters=param_count(model.config), dtype="bfloat16")
    res["workload"] = dict(prompts=e["prompts"], n=e["n"], max_new_tokens=e["max_new"], temperature=1.0)
    prompts = [x.prompt for x in load_synthetic_eval()[:e["prompts"]]]
    makers = {k: v for k, v in dict(kit=KitEngine, hf=HFEngine, hf_cb=HFBatchEngine).items() if k in e["engines"]}
    if "hf_cb" in makers and not hf_batch_available(model):
        del makers["hf_cb"]; res["hf_cb"] = dict(skipped="this transformers has no generate_batch")
    for name, make in makers.items():
        try: res[name] = time_engine(make(model, tok), prompts, e["n"], e["max_new"], dev)
        except SectionTimeout: raise
        except Exception as ex: res[name] = dict(error=error_text(ex))
        gc.collect()
        if dev == "cuda": torch.cuda.empty_cache()
    if finite(res.get("kit", {}).get("tokens_per_s")) and finite(res.get("hf", {}).get("tokens_per_s")):
        res["kit_over_hf"] = res["kit"]["tokens_per_s"] / res["hf"]["tokens_per_s"]

def train_config(algo: str, folder: Path, out: Path, t: dict, dev: str):
    "The run's config: the kit's defaults, then the real-shape settings this check is about"
    return get_config("cpu-demo", overrides=[
        f"algo.name={algo}", f"model.name_or_path={folder}", "model.dtype=bfloat16",
        "model.gradient_checkpointing=True", "train.loss_kernel=chunked", "rollout.engine=kit",
        f"rollout.group_size={t['group']}", f"train.prompts_per_step={t['prompts']}",
        f"rollout.max_new_tokens={t['max_new']}", f"train.micro_batch={t['micro_batch']}", "train.lr=1e-6",
        f"train.steps={t['steps']}", f"train.device={dev}", f"train.out={out}"])

def train_runs(algo: str, folder: Path, tmp: Path, t: dict, dev: str) -> dict:
    "`t['steps']` steps of `algo` through `setup` and `train_step`, with each step's metrics and peak memory"
    cfg = train_config(algo, folder, tmp / f"run-{algo}", t, dev)
    peak = lk.Peak(dev); peak.reset()
    s = setup(cfg, open_run(cfg, overwrite=True))
    out = dict(setup_peak_bytes=peak.read()[1], steps=[])
    for step in range(t["steps"]):
        peak.reset()
        row = train_step(cfg, s, step)
        extra, total = peak.read()
        out["steps"].append({k: row.get(k) for k in ("wall_s", "rollout_s", "reward_s", "update_s", "loss", "grad_norm",
                                                      "trained_tokens", "generated_tokens", "skipped")}
                            | dict(peak_bytes=total, step_extra_bytes=extra))
    del s; gc.collect()
    if dev == "cuda": torch.cuda.empty_cache()
    later = out["steps"][1:] or out["steps"]  # the first step pays for warm-up (allocator, kernels)
    for k in ("wall_s", "rollout_s", "update_s"): out[f"median_{k}"] = statistics.median(r[k] for r in later)
    out["peak_bytes"] = max(r["peak_bytes"] for r in out["steps"])
    out["trained_tokens"] = statistics.median(r["trained_tokens"] for r in later)
    return out

def train_section(P: dict, dev: str, tok, res: dict):
    "GRPO vs BPPO steps (coin-flip rewards) on a random checkpoint of the train shape"
    t = P["train"]
    with tempfile.TemporaryDirectory() as d:
        folder = save_real_shaped(Path(d) / "model", t["size"], "bfloat16", seed=0, tok=tok, device=dev)
        res["model"] = dict(size=t["size"], parameters=param_count(qwen2_5_config(t["size"])), dtype="bfloat16")
        res["workload"] = dict(prompts=t["prompts"], group=t["group"], max_new_tokens=t["max_new"], steps=t["steps"],
                               micro_batch=t["micro_batch"], loss_kernel="chunked", gradient_checkpointing=True)
        for algo in ("grpo_coin", "bppo_coin"):
            name = algo.split("_")[0]
            try: res[name] = train_runs(algo, folder, Path(d), t, dev)
            except SectionTimeout: raise
            except Exception as e: res[name] = dict(error=error_text(e), traceback=traceback.format_exc()[-2000:])
    g, b = res.get("grpo", {}), res.get("bppo", {})
    if finite(g.get("median_wall_s")) and finite(b.get("median_wall_s")):
        res["bppo_step_speedup"] = g["median_wall_s"] / b["median_wall_s"]
        res["bppo_update_speedup"] = g["median_update_s"] / max(b["median_update_s"], 1e-9)

def run_section(name: str, fn, result: dict, deadline: float, cap: float, out: Path):
    "Run `fn(res)` under the smaller of `cap` and the budget left; record its status and whatever it measured"
    res = result["sections"][name] = dict(status="running")
    left = deadline - time.time()
    if left < 5:
        res.update(status="skipped", reason=f"{left:.0f} s of the time budget left"); return write(result, out)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, min(cap, left))
    t0 = time.time()
    try: fn(res); res["status"] = "ok"
    except SectionTimeout as e: res.update(status="timeout", error=str(e))
    except Exception as e: res.update(status="error", error=error_text(e), traceback=traceback.format_exc()[-2000:])
    finally: signal.setitimer(signal.ITIMER_REAL, 0)
    gc.collect()
    if torch.cuda.is_available(): torch.cuda.empty_cache()
    res["seconds"] = round(time.time() - t0, 2)
    print(f"[{name}] {res['status']} in {res['seconds']:.1f} s", flush=True)
    write(result, out)

def write(result: dict, out: Path):
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n"); tmp.replace(out)

def environment(dev: str, smoke: bool) -> dict:
    import transformers
    env = dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
               device=torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
               threads=torch.get_num_threads(), smoke=smoke, triton_interpret=os.environ.get("TRITON_INTERPRET"))
    if triton_available():
        import triton
        env["triton"] = triton.__version__
    return env

def summary(result: dict) -> str:
    "A few lines a person reads first"
    s, lines = result["sections"], []
    for impl, r in s.get("kernel", {}).get("runs", {}).items():
        lines.append(f"kernel {impl:8s} " + (f"{r['time_s'] * 1e3:9.1f} ms {r['peak_bytes'] / 2**30:7.2f} GiB"
                                             if "time_s" in r else str(r)[:100]))
    for name in ("kit", "hf", "hf_cb"):
        r = s.get("engine", {}).get(name, {})
        if r: lines.append(f"engine {name:6s} " + (f"{r['tokens_per_s']:10.0f} tok/s ({r['tokens']} tokens, "
                                                   f"{r['seconds']:.1f} s)" if "tokens_per_s" in r else str(r)[:100]))
    for name in ("grpo", "bppo"):
        r = s.get("train", {}).get(name, {})
        if r: lines.append(f"train  {name:6s} " + (f"step {r['median_wall_s']:.2f} s (update {r['median_update_s']:.2f}"
                                                   f" s), peak {r['peak_bytes'] / 2**30:.2f} GiB"
                                                   if "median_wall_s" in r else str(r)[:100]))
    return "\n".join(lines)

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu_check.json", help="the JSON result")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (the test's mode)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="total time budget; each section gets a share of it (default: 460 s, smoke 110 s)")
    ap.add_argument("--only", default="kernel,engine,train", help="comma-separated sections to run")
    a = ap.parse_args(argv)
    P = SMOKE if a.smoke else FULL
    dev = "cpu" if a.smoke else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device; use --smoke for the CPU smoke run")
    t_start, out = time.time(), Path(a.out)
    budget = a.budget_s or P["budget_s"]
    deadline = t_start + budget
    result = dict(command=" ".join(["python3", "benchmarks/gpu_check.py"] + (argv or sys.argv[1:])),
                  environment=environment(dev, a.smoke), budget_s=budget, sections={})
    tok = bpe_tokenizer()
    result["tokenizer"] = dict(tokens=len(tok), seconds=round(time.time() - t_start, 2))
    sections = dict(kernel=lambda r: kernel_section(P, dev, r), engine=lambda r: engine_section(P, dev, tok, r),
                    train=lambda r: train_section(P, dev, tok, r))
    for name in a.only.split(","):
        run_section(name, sections[name], result, deadline, P["shares"][name] * budget, out)
    result["total_s"] = round(time.time() - t_start, 2)
    write(result, out)
    print(summary(result))
    print(f"wrote {out} ({result['total_s']:.0f} s)")

if __name__ == "__main__":
    main()
