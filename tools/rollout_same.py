"""Exactness check for refactors of `KitEngine`: the same seeded calls must give the same tokens, bit for bit.

    python tools/rollout_same.py --write runs/rollout_before.json    # on the old code
    python tools/rollout_same.py --check runs/rollout_before.json    # on the new code: exit 1 on any difference

Every case is a seeded `KitEngine` call (or a chain of calls: window mode and `resume`) on the shipped tiny policy and
on small random Qwen2 (grouped-query attention), Llama and Qwen3 (q/k norms) models. Recorded per completion: the
token ids, the log-probs as exact floats (`float.hex`), the finish reason, seed, uid and prompt index; per call: the
order in which `on_finish` saw completions and the engine's `stats` counters (all but `seconds`). Covered: greedy and
sampled (temperatures, top-k, top-p), `max_slots` below the number of requests, a small `prefill_batch`, prompts of
different lengths, window mode resumed to the end with varying windows, cancelling through `on_finish` (running
requests, and waiting ones before they get a slot), `run` on requests with a prefix (one already at the length cap),
extra stop tokens, many short requests, and one engine reused across calls (its cache grows and is reused).
"""
import argparse, json, sys, time
from pathlib import Path
import torch

torch.set_num_threads(2)  # float results may depend on the thread count: always the same one

from bppo_kit.core import Request, SamplingParams  # noqa: E402
from bppo_kit.data import load_synthetic_eval  # noqa: E402
from bppo_kit.rollout import KitEngine  # noqa: E402


TIMING = "--timing" in sys.argv


def rec(cs) -> list:
    return [[c.prompt_index, c.seed, c.uid, c.finish_reason, c.completion_ids, [float(x).hex() for x in c.logprobs]]
            for c in cs]


def counters(eng) -> dict:
    return {k: v for k, v in eng.stats.items() if k != "seconds"}


def cancel_siblings(n: int, seen: list):
    "Cancel the other samples of a prompt once `2` of its samples have ended; logs the order of finished completions"
    done: dict[int, int] = {}
    def on_finish(c):
        seen.append([c.uid, c.finish_reason, c.n_tokens])
        if c.finish_reason == "cancelled": return ()
        done[c.prompt_index] = done.get(c.prompt_index, 0) + 1
        return [(c.seed, c.prompt_index * n + j) for j in range(n)] if done[c.prompt_index] >= 2 else ()
    return on_finish


def cancel_next(n: int, seen: list):
    "Cancel every sample of the next prompt (still waiting, most often) when a sample ends"
    def on_finish(c):
        seen.append([c.uid, c.finish_reason, c.n_tokens])
        return [(c.seed, (c.prompt_index + 1) * n + j) for j in range(n)]
    return on_finish


def windows(eng, prompts, n, sp, ws) -> list:
    "`generate` with window `ws[0]`, then `resume` with `ws[1]`, … (the last repeated) until nothing is paused"
    out, k = [], 0
    part = eng.generate(prompts, n, sp, window=ws[0])
    out.append(rec(part))
    while any(c.finish_reason == "window" for c in part):
        k += 1
        part = eng.resume(part, sp, window=ws[min(k, len(ws) - 1)])
        out.append(rec(part))
    return out


def suite(name, m, tok, prompts, big: bool) -> dict:
    "The cases on one model; `big`: the shipped policy (which stops on EOS), with the larger sizes"
    res = {}
    L = 160 if big else 40
    def case(key, eng, fn):
        seen, t = [], time.time()
        torch.manual_seed(0)  # an unseeded call draws its seed from torch's generator
        res[key] = dict(out=fn(eng, seen), finished=seen, stats=counters(eng))
        if TIMING: print(f"{name:13s} {key:34s} {time.time() - t:5.1f} s", flush=True)
    P = prompts
    case("greedy_slots5", KitEngine(m, tok, max_slots=5),
         lambda e, s: rec(e.generate(P[:12], 1, SamplingParams(temperature=0, max_new_tokens=L))))
    case("sampled_t1", KitEngine(m, tok),
         lambda e, s: rec(e.generate(P[:8], 4, SamplingParams(max_new_tokens=L, seed=3))))
    case("sampled_t07_topk_topp_slots5_pb2", KitEngine(m, tok, max_slots=5, prefill_batch=2),
         lambda e, s: rec(e.generate(P[:6], 4, SamplingParams(temperature=0.7, top_k=20, top_p=0.95,
                                                              max_new_tokens=L, seed=11))))
    case("window10_resume", KitEngine(m, tok, max_slots=16),
         lambda e, s: windows(e, P[:6], 3, SamplingParams(max_new_tokens=L, seed=11, top_k=20, top_p=0.95), [10]))
    case("window_varying_slots3", KitEngine(m, tok, max_slots=3),
         lambda e, s: windows(e, P[:3], 3, SamplingParams(max_new_tokens=L, seed=4), [7, 25, 3, None]))
    case("window_greedy", KitEngine(m, tok, max_slots=6),
         lambda e, s: windows(e, P[:5], 2, SamplingParams(temperature=0, max_new_tokens=L), [12]))
    case("cancel_slots16", KitEngine(m, tok, max_slots=16),
         lambda e, s: rec(e.generate(P[:8], 8, SamplingParams(max_new_tokens=L, seed=2),
                                     on_finish=cancel_siblings(8, s))))
    case("cancel_slots4_pb3", KitEngine(m, tok, max_slots=4, prefill_batch=3),
         lambda e, s: rec(e.generate(P[:5], 4, SamplingParams(max_new_tokens=L, seed=8),
                                     on_finish=cancel_siblings(4, s))))
    case("cancel_window", KitEngine(m, tok, max_slots=8),
         lambda e, s: rec(e.generate(P[:4], 4, SamplingParams(max_new_tokens=L, seed=9), window=15,
                                     on_finish=cancel_siblings(4, s))))
    case("cancel_waiting_slots3", KitEngine(m, tok, max_slots=3),
         lambda e, s: rec(e.generate(P[:6], 2, SamplingParams(max_new_tokens=L, seed=12), on_finish=cancel_next(2, s))))
    def prefixed(e, s):
        sp = SamplingParams(max_new_tokens=L, seed=21, top_p=0.9)
        first = e.generate(P[:3], 2, sp, window=5)
        reqs = [Request(c.prompt_ids, c.prompt_index, c.uid, c.seed, list(c.completion_ids), list(c.logprobs))
                for c in first]
        full = Request(first[0].prompt_ids, 0, 99, 21, [5] * L, [0.0] * L)  # already at the length cap
        return [rec(first), rec(e.run(reqs + [full], sp, window=9, on_finish=cancel_siblings(2, s)))]
    case("run_prefix_and_cap", KitEngine(m, tok, max_slots=4), prefixed)
    stop = tok("=")["input_ids"][-1]
    case("extra_stop_token", KitEngine(m, tok, max_slots=5),
         lambda e, s: rec(e.generate(P[:4], 3, SamplingParams(max_new_tokens=L, seed=13, stop_token_ids=[stop]))))
    case("many_short", KitEngine(m, tok, max_slots=64),
         lambda e, s: [rec(e.generate(P[:12] * 2, 5, SamplingParams(max_new_tokens=6, seed=k))) for k in range(2)])
    def reused(e, s):  # one engine, a growing cache: short calls, then a longer and a wider one
        return [rec(e.generate(P[:2], 2, SamplingParams(max_new_tokens=8, seed=1))),
                rec(e.generate(P[:6], 3, SamplingParams(max_new_tokens=L, seed=2))),
                rec(e.generate(P[:3], 1, SamplingParams(temperature=0, max_new_tokens=L)))]
    case("reused_engine", KitEngine(m, tok, max_slots=12), reused)
    return res


def random_models(tok):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    common = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    out = {}
    for name, cls, cfg in (("qwen2_gqa", Qwen2ForCausalLM, Qwen2Config(**common, tie_word_embeddings=True)),
                           ("llama_gqa", LlamaForCausalLM, LlamaConfig(**common)),
                           ("qwen3_qknorm", Qwen3ForCausalLM, Qwen3Config(**common, head_dim=24))):
        torch.manual_seed(0)
        out[name] = cls(cfg).eval()
    return out


def record() -> dict:
    from bppo_kit.policy import load_policy
    ev = [e.prompt for e in load_synthetic_eval()]
    pm, ptok = load_policy("tiny")
    res = {"tiny": suite("tiny", pm, ptok, ev[:24], big=True)}
    short = ["Q: 1+2\nA:", "Q: (3*4)-5\nA:", "Q: 7\nA:", "Q: 12*(3+4)\nA:", "Q: 9-8\nA:", "Q: ((1+2)*(3+4))-5\nA:"]
    for name, m in random_models(ptok).items():
        res[name] = suite(name, m, ptok, short, big=False)
    return res


def compare(a, b, path="") -> list[str]:
    if type(a) is not type(b): return [f"{path}: {type(a).__name__} != {type(b).__name__}"]
    if isinstance(a, dict):
        bad = [f"{path}/{k}: missing" for k in a if k not in b] + [f"{path}/{k}: extra" for k in b if k not in a]
        return bad + [d for k in a if k in b for d in compare(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list):
        if len(a) != len(b): return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in compare(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def summary(res) -> str:
    calls = sum(c["stats"]["calls"] for s in res.values() for c in s.values())
    comps = toks = 0
    def walk(x):
        nonlocal comps, toks
        if isinstance(x, list) and len(x) == 6 and isinstance(x[3], str):
            comps += 1
            toks += len(x[4])
            return
        if isinstance(x, list):
            for y in x: walk(y)
    for s in res.values():
        for c in s.values(): walk(c["out"])
    return (f"{len(res)} models, {sum(len(s) for s in res.values())} cases, {calls} engine calls, "
            f"{comps} completions, {toks} tokens (ids and log-probs)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path)
    g.add_argument("--check", type=Path)
    ap.add_argument("--timing", action="store_true", help="print each case's seconds")
    a = ap.parse_args()
    t0 = time.time()
    res = record()
    print(summary(res), f"in {time.time() - t0:.0f} s")
    if a.write:
        a.write.parent.mkdir(parents=True, exist_ok=True)
        a.write.write_text(json.dumps(res))
        print(f"wrote {a.write}")
    else:
        # through JSON, as the record went: a histogram's integer keys are strings there
        bad = compare(json.loads(a.check.read_text()), json.loads(json.dumps(res)))
        for d in bad[:20]: print("DIFF", d)
        print(f"{len(bad)} differences" if bad
              else "identical: every token id, log-prob bit, finish reason and counter")
        sys.exit(1 if bad else 0)
