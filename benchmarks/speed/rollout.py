"""Generation engines side by side, in one process: HFEngine (padded `generate`), transformers' continuous batching
(`generate_batch`, when the installed transformers has it) and the kit's KitEngine.

    python benchmarks/speed/rollout.py --json runs/rollout.json   # the README's numbers (~1 min on 2 cores)
    python benchmarks/speed/rollout.py --small --json runs/rollout_small.json   # seconds

Workload: the shipped tiny policy, the first 16 prompts of the synthetic eval set x 8 samples = 128 completions,
temperature 1.0, max 160 new tokens (concise ~30-token and verbose ~110-token traces: mixed lengths). Every engine
runs `--rounds` times, interleaved (hf, hf_cb, kit, hf, ...), each round with a fresh seed; tokens/s is the median
over rounds of generated tokens / seconds of that call.

Checks written to the JSON as well:
- `greedy_identical`: KitEngine greedy output token-identical to HFEngine greedy, on 64 eval prompts.
- `logprob_max_abs_diff`: KitEngine's sampling log-probs vs a teacher-forced recompute by the policy (fp32).
- `window_identical`: 128 completions generated in windows of 16 tokens (resumed until done) equal one uninterrupted
  call.
- memory (`--memory`): 10,000 short requests (8 new tokens) in 10 calls of 1,000; resident set size after each call.
"""
import argparse, json, statistics, time
from pathlib import Path
import torch
from bppo_kit.data import load_synthetic_eval
from bppo_kit.policy import completion_logprobs, load_policy, pack
from bppo_kit.rollout import HFBatchEngine, HFEngine, KitEngine, SamplingParams, hf_batch_available, idle_fraction

def rss_mib() -> float:
    "Current resident set size of this process in MiB (Linux)"
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"): return int(line.split()[1]) / 1024
    return float("nan")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="runs/rollout.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--small", action="store_true", help="4 prompts x 4 samples, 1 round, no memory run")
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    a = ap.parse_args()
    if a.small: a.prompts, a.n, a.rounds, a.memory = 4, 4, 1, False
    torch.manual_seed(0)
    model, tok = load_policy("tiny")
    ev = load_synthetic_eval()
    prompts = [e.prompt for e in ev[:a.prompts]]
    engines = {"hf": HFEngine(model, tok), "kit": KitEngine(model, tok)}
    if hf_batch_available(model): engines["hf_cb"] = HFBatchEngine(model, tok)
    rates = {k: [] for k in engines}
    idle = []
    for r in range(a.rounds):
        for name, eng in engines.items():
            sp = SamplingParams(temperature=1.0, max_new_tokens=160, seed=100 + r)
            t0 = time.perf_counter()
            cs = eng.generate(prompts, a.n, sp)
            dt = time.perf_counter() - t0
            rates[name].append(sum(c.n_tokens for c in cs) / dt)
            if name == "hf": idle.append(idle_fraction(cs, len(cs)))
            print(f"round {r} {name:6s} {sum(c.n_tokens for c in cs):6d} tokens {dt:6.2f} s "
                  f"{rates[name][-1]:8.0f} tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    # correctness
    gp = [e.prompt for e in ev[:64]]
    greedy = SamplingParams(temperature=0, max_new_tokens=160)
    g_kit, g_hf = engines["kit"].generate(gp, 1, greedy), engines["hf"].generate(gp, 1, greedy)
    greedy_identical = [c.completion_ids for c in g_kit] == [c.completion_ids for c in g_hf]
    cs = engines["kit"].generate(prompts, a.n, SamplingParams(temperature=1.0, max_new_tokens=160, seed=7))
    b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], tok.pad_token_id)
    with torch.no_grad(): lp = completion_logprobs(model, b)
    diff = max((lp[i, :c.n_tokens] - torch.tensor(c.logprobs)).abs().max().item() for i, c in enumerate(cs))
    part = engines["kit"].generate(prompts, a.n, SamplingParams(temperature=1.0, max_new_tokens=160, seed=7), window=16)
    rounds = 1
    while any(c.finish_reason == "window" for c in part):
        part = engines["kit"].resume(part, SamplingParams(temperature=1.0, max_new_tokens=160, seed=7), window=16)
        rounds += 1
    window_identical = [c.completion_ids for c in part] == [c.completion_ids for c in cs]
    res = dict(kit_tokens_per_s=round(med["kit"], 1), hf_tokens_per_s=round(med["hf"], 1),
               hf_cb_tokens_per_s=round(med["hf_cb"], 1) if "hf_cb" in med else None,
               kit_over_hf=round(med["kit"] / med["hf"], 2),
               kit_over_hf_cb=round(med["kit"] / med["hf_cb"], 2) if "hf_cb" in med else None,
               hf_idle_fraction=round(statistics.mean(idle), 3), greedy_identical=greedy_identical,
               greedy_prompts=len(gp), logprob_max_abs_diff=diff, window_identical=window_identical,
               window_rounds=rounds,
               completions=len(cs), rounds=a.rounds, threads=torch.get_num_threads(), rates=rates)
    if a.memory:
        kit = engines["kit"]
        short = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0)
        rss = []
        for call in range(10):
            kit.generate([e.prompt for e in ev[call * 100:(call + 1) * 100]], 10, short)
            rss.append(round(rss_mib(), 1))
        res.update(memory_requests=10_000, rss_mib_after_each_call=rss,
                   rss_growth_mib_after_first=round(rss[-1] - rss[0], 1))
    print(json.dumps({k: v for k, v in res.items() if k != "rates"}, indent=1))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1))

if __name__ == "__main__":
    main()
