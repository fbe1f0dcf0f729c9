"""The kit engine's sampler against one decoding pass, at Qwen2.5-0.5B's shape and vocabulary (151,936 tokens), on CPU:
the Gumbel-max draw as it was (int64 hashing, 32-bit values kept from overflowing) and as it is (int32 hashing that
wraps, in place), side by side in one run, with the same tokens.

    OMP_NUM_THREADS=2 python benchmarks/speed/sampler.py --json runs/sampler.json   # about 1 minute

What is measured, for each number of rows (busy slots):
- pass: one `SlotModel.decode` step of a random-weight Qwen2.5-0.5B-shaped model in bfloat16 (24 layers, every row at
  position `--context - 1`, so its attention reads `--context` cached positions), its LM head included.
- sampler: one `sample_tokens` call on that step's logits at temperature 1 (no top-k/top-p): the old draw (copied
  below as it was before) and the new one (`bppo_kit.kit_engine`). Each time is the median of `--repeats` runs after
  one warm-up; all in one process, one after the other.
- share: sampler / (pass + sampler), the sampler's part of a decoding step; and old / new.
The two draws are checked token for token on every timed call, and the noise bit for bit on every row.
"""
import argparse, json, statistics, time
import torch
from transformers import Qwen2ForCausalLM
from bppo_kit.kit_engine import SlotModel, gumbel_noise, mix32, sample_tokens
from bppo_kit.shapes import qwen2_5_config

_M32 = 0xFFFFFFFF

# --- the draw before: int64 tensors holding 32-bit values, every product split to stay below 2^63 -----------------
def _old_mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    return ((((a >> 16) * c) & 0xFFFF) << 16) + ((a & 0xFFFF) * c) & _M32

def _old_mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _old_mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _old_mul32(x, 0x846CA68B)
    return x ^ (x >> 16)

def old_gumbel_noise(seed, uid, t, vocab, start=0, stop=None):
    key = _old_mix32(_old_mix32(_old_mix32(seed & _M32) ^ (uid & _M32)) ^ (t & _M32))
    v = torch.arange(start, vocab if stop is None else stop, device=key.device)
    h = _old_mix32((key[:, None] + _old_mul32(v, 0x9E3779B1)[None]) & _M32)
    u = ((h >> 8).float() + 0.5) / 2 ** 24
    return -torch.log(-torch.log(u))

def old_gumbel_argmax(scores, seed, uid, t, block=1 << 22):
    n, V = scores.shape
    cols = max(1, block // max(n, 1))
    best = torch.full((n,), float("-inf"), dtype=scores.dtype, device=scores.device)
    nxt = torch.zeros(n, dtype=torch.long, device=scores.device)
    for a in range(0, V, cols):
        z = scores[:, a:a + cols] + old_gumbel_noise(seed, uid, t, V, a, min(a + cols, V))
        i = z.argmax(-1)
        top = z.gather(-1, i[:, None])[:, 0]
        won = top > best
        best, nxt = torch.where(won, top, best), torch.where(won, i + a, nxt)
    return nxt

def old_sample_tokens(logits, seed, uid, t):
    "The old `sample_tokens` at temperature 1 without top-k/top-p"
    scores = logits / 1.0
    nxt = old_gumbel_argmax(scores, seed, uid, t)
    return nxt, torch.log_softmax(scores, -1).gather(-1, nxt[:, None])[:, 0]

# --- the measurement ---------------------------------------------------------------------------------------------
def median_s(fn, repeats: int) -> float:
    "Median seconds of `fn()` over `repeats` runs after one warm-up"
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)

def random_model(size: str, dtype=torch.bfloat16):
    "A random-weight Qwen2.5-shaped model, built without the slow default init"
    with torch.device("meta"): m = Qwen2ForCausalLM(qwen2_5_config(size))
    m = m.to_empty(device="cpu").to(dtype)
    torch.manual_seed(0)
    for p in m.parameters(): p.data.normal_(0, 0.02)
    # the rotary buffer was left empty on meta: made again from the config
    m.model.rotary_emb = type(m.model.rotary_emb)(config=m.config)
    return m.eval()

@torch.no_grad()
def measure(lm: SlotModel, rows: int, context: int, repeats: int) -> dict:
    "One row count: the pass, the old and new sampler (seconds), and whether they drew the same tokens"
    lm.reserve(rows, context)
    cur, pos = [11 + r for r in range(rows)], [context - 1] * rows
    logits = lm.decode(cur, pos)
    g = torch.Generator().manual_seed(rows)
    seed, uid = torch.randint(0, 2 ** 40, (rows,), generator=g), torch.randint(0, 2 ** 33, (rows,), generator=g)
    t = torch.randint(0, 4096, (rows,), generator=g)
    # a trained model's logits spread far more than a random model's: scale them so the draws are not uniform
    logits = logits.float() * 50
    new = sample_tokens(logits, 1.0, 0, 1.0, seed, uid, t)
    old = old_sample_tokens(logits, seed, uid, t)
    same = torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    noise_same = torch.equal(gumbel_noise(seed, uid, t, logits.shape[1]),
                             old_gumbel_noise(seed, uid, t, logits.shape[1]))
    out = dict(rows=rows, context=context, vocab=logits.shape[1], same_tokens=same, same_noise=noise_same,
               pass_s=median_s(lambda: lm.decode(cur, pos), repeats),
               old_s=median_s(lambda: old_sample_tokens(logits, seed, uid, t), repeats),
               new_s=median_s(lambda: sample_tokens(logits, 1.0, 0, 1.0, seed, uid, t), repeats))
    out["old_share"] = out["old_s"] / (out["pass_s"] + out["old_s"])
    out["new_share"] = out["new_s"] / (out["pass_s"] + out["new_s"])
    out["old_over_new"] = out["old_s"] / out["new_s"]
    return out

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="0.5b", help="a Qwen2.5 shape of bppo_kit.shapes")
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--context", type=int, default=1024, help="cached positions each row's attention reads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    x = torch.tensor([0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1])
    assert torch.equal(mix32(x), _old_mix32(x))
    lm = SlotModel(random_model(a.size))
    res = [measure(lm, r, a.context, a.repeats) for r in a.rows]
    print(f"Qwen2.5-{a.size} shape, vocabulary {res[0]['vocab']}, {a.context} cached positions, "
          f"{torch.get_num_threads()} threads; medians of {a.repeats}")
    print("| rows | decoding pass ms | sampler before ms | sampler now ms | share before | share now | before/now | "
          "same tokens |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in res:
        print(f"| {r['rows']} | {r['pass_s'] * 1e3:.1f} | {r['old_s'] * 1e3:.1f} | {r['new_s'] * 1e3:.1f} | "
              f"{r['old_share']:.0%} | {r['new_share']:.0%} | {r['old_over_new']:.1f}x | "
              f"{r['same_tokens'] and r['same_noise']} |")
    if a.json:
        with open(a.json, "w") as f: json.dump(res, f, indent=1)
    assert all(r["same_tokens"] and r["same_noise"] for r in res), "the new draw differs from the old one"
    return res

if __name__ == "__main__":
    main()
