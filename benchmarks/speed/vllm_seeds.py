"""vLLM sampling with a seed per request (batch-invariant) against one seed a call, on whatever vLLM build is here.

    VLLM_HOST_IP=127.0.0.1 OMP_NUM_THREADS=1 /work/vllm-venv/bin/python benchmarks/speed/vllm_seeds.py \
        [--prompts 64] [--n 8]
        [--wide-vocab]

Builds `VLLMEngine` on the shipped tiny policy once (with `--wide-vocab`: a random 2-layer model with Qwen2.5's
151,936-token vocabulary, where sampling is most of the work), then generates `--prompts` prompts of the synthetic
eval set x `--n` samples (160 new tokens at most), the two settings (`rollout.seed_per_request` on and off)
alternated `--runs` times after one warm-up call each; prints each setting's median seconds, generated tokens per
second, and the ratio. vLLM samples requests that carry a seed one generator at a time, and the others in one batch.
"""
import argparse, os, statistics, tempfile, time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from bppo_kit.data import load_synthetic_eval
from bppo_kit.policy import load_policy, resolve_policy_path
from bppo_kit.rollout import SamplingParams, VLLMEngine
from bppo_kit.shapes import bpe_tokenizer, qwen2_5_config


def wide_vocab(folder: str) -> str:
    "A random 2-layer Qwen2 with Qwen2.5's vocabulary, saved to `folder` with the kit's tokenizer"
    import torch
    from transformers import Qwen2ForCausalLM
    tok = bpe_tokenizer()
    cfg = qwen2_5_config("0.5b", tok, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=256)  # head size 64, as vLLM's CPU kernels need
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8, help="samples a prompt")
    ap.add_argument("--runs", type=int, default=5, help="timed calls of each setting, alternated")
    ap.add_argument("--wide-vocab", action="store_true", help="a random model with a 151,936-token vocabulary")
    a = ap.parse_args()
    path = wide_vocab(tempfile.mkdtemp()) if a.wide_vocab else resolve_policy_path("tiny")
    m, tok = load_policy(path)
    eng = VLLMEngine(m, tok, path, max_model_len=512, enforce_eager=True)
    prompts = [e.prompt for e in load_synthetic_eval()[:a.prompts]]
    res = {True: [], False: []}
    for k in range(a.runs + 1):
        for per_request in (True, False):
            eng.seed_per_request = per_request
            t = time.perf_counter()
            cs = eng.generate(prompts, a.n, SamplingParams(max_new_tokens=160, seed=k))
            if k: res[per_request].append((time.perf_counter() - t, sum(c.n_tokens for c in cs)))
    rows = {}
    for per_request, runs in res.items():
        s = statistics.median(t for t, _ in runs)
        rows[per_request] = statistics.median(n / t for t, n in runs)
        print(f"seed per request {str(per_request):5}: median {s:.3f} s a call, {rows[per_request]:,.0f} tokens/s")
    print(f"one seed a call / a seed per request, tokens/s: {rows[False] / rows[True]:.2f}x "
          f"({a.prompts} prompts x {a.n} samples, {a.runs} calls each, vocabulary {m.config.vocab_size:,})")


if __name__ == "__main__":
    main()
