"""KitEngine on the shipped policy, as the trainer uses it: identical greedy output, exact log-probs, exact windows,
no leaks; its slot compaction; VLLMEngine's version-dependent calls, on fakes of the old and the new vLLM API."""
import os, sys, types
from types import SimpleNamespace as NS
from unittest import mock
import pytest, torch
from bppo_kit.data import load_synthetic_eval
from bppo_kit.policy import completion_logprobs, pack
from bppo_kit import rollout
from bppo_kit.rollout import HFEngine, KitEngine, Request, SamplingParams, compaction

@pytest.fixture(scope="module")
def prompts():
    return [e.prompt for e in load_synthetic_eval()[:24]]

def test_greedy_identical_to_hf(shipped, prompts):
    m, tok = shipped
    sp = SamplingParams(temperature=0, max_new_tokens=160)
    kit, hf = KitEngine(m, tok, max_slots=7).generate(prompts, 1, sp), HFEngine(m, tok).generate(prompts, 1, sp)
    assert [c.completion_ids for c in kit] == [c.completion_ids for c in hf]
    assert [c.finish_reason for c in kit] == [c.finish_reason for c in hf]
    assert [c.text for c in kit] == [c.text for c in hf]

def test_sampled_logprobs_match_teacher_forcing(shipped, prompts):
    m, tok = shipped
    for temp in (1.0, 0.7):
        cs = KitEngine(m, tok).generate(prompts[:8], 4, SamplingParams(temperature=temp, max_new_tokens=160, seed=3))
        b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], tok.pad_token_id)
        with torch.no_grad(): lp = completion_logprobs(m, b, temperature=temp)
        diff = max((lp[i, :c.n_tokens] - torch.tensor(c.logprobs)).abs().max().item() for i, c in enumerate(cs))
        assert diff < 1e-4, (temp, diff)

def test_windows_resume_exactly(shipped, prompts):
    m, tok = shipped
    eng, sp = KitEngine(m, tok, max_slots=16), SamplingParams(max_new_tokens=160, seed=11, top_k=20, top_p=0.95)
    whole = eng.generate(prompts[:8], 4, sp)
    part, calls = eng.generate(prompts[:8], 4, sp, window=10), 1
    while any(c.finish_reason == "window" for c in part):
        assert all(c.n_tokens <= 10 * calls for c in part)
        part, calls = eng.resume(part, sp, window=10), calls + 1
    assert calls >= 4
    assert [c.completion_ids for c in part] == [c.completion_ids for c in whole]
    assert [c.finish_reason for c in part] == [c.finish_reason for c in whole]

def test_same_seed_any_slot_count(shipped, prompts):
    m, tok = shipped
    sp = SamplingParams(max_new_tokens=160, seed=5)
    a = KitEngine(m, tok, max_slots=256).generate(prompts[:6], 4, sp)
    b = KitEngine(m, tok, max_slots=5, prefill_batch=2).generate(prompts[:6], 4, sp)
    assert [c.completion_ids for c in a] == [c.completion_ids for c in b]
    c = KitEngine(m, tok).generate(prompts[:6], 4, SamplingParams(max_new_tokens=160, seed=6))
    assert [x.completion_ids for x in a] != [x.completion_ids for x in c]

def test_bad_requests_fail_fast(shipped):
    m, tok = shipped
    eng = KitEngine(m, tok)
    with pytest.raises(ValueError, match="n must be"): eng.generate(["Q: 1+1\nA:"], 0)
    with pytest.raises(ValueError, match="empty prompt"): eng.generate(["Q: 1+1\nA:", ""], 2)
    with pytest.raises(ValueError, match="exceeds the context"): eng.generate(["1" * 600], 1)
    with pytest.raises(ValueError, match="empty prompt"): eng.run([Request([], 0, 0, 0)])
    with pytest.raises(ValueError, match="KitEngine supports"):
        KitEngine(type("M", (), {"config": type("C", (), {"model_type": "gpt2"})()})(), tok)

@pytest.mark.slow  # 2,000 requests (23 s on 2 busy cores)
def test_many_short_requests_keep_memory_flat(shipped):
    "2,000 requests in 8 calls: the cache is reused, the resident set does not grow"
    m, tok = shipped
    eng = KitEngine(m, tok, max_slots=64)
    ps = [e.prompt for e in load_synthetic_eval()[:50]]
    rss = []
    for k in range(8):
        cs = eng.generate(ps, 5, SamplingParams(max_new_tokens=6, seed=k))
        assert len(cs) == 250 and all(c.n_tokens <= 6 for c in cs)
        rss.append(int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20)
    assert rss[-1] - rss[1] < 20, rss  # MiB; after the first call has allocated the cache
    assert eng.stats["busy_slot_steps"] <= eng.stats["slot_steps"]


def test_compaction_packs_the_busy_slots():
    "Every way of freeing slots of 6: the survivors end up in slots 0…keep-1, and only slots that must move do"
    import itertools
    for n in range(1, 7):
        for k in range(n + 1):
            for dead in itertools.combinations(range(n), k):
                holes, movers = compaction(n, list(dead))
                slots = list(range(n))
                for h, m in zip(holes, movers): slots[h] = slots[m]
                kept = slots[:n - k]
                assert sorted(kept) == [s for s in range(n) if s not in dead], (n, dead)
                assert all(kept[s] == s for s in range(n - k) if s not in dead)  # the others stay where they are
                assert len(holes) == len(movers) and all(m >= n - k for m in movers)


def fake_vllm(new: bool, log: list):
    "A `vllm` module that logs the calls `VLLMEngine` makes: the current API (`new`) or an older one"
    eos = 1
    runner = (NS(get_model=lambda: None, reload_weights=lambda weights_iterator=None, is_checkpoint_format=True: None)
              if new else NS(model=NS(load_weights=lambda w: log.append(("load_weights", len(w))))))
    worker = NS(model_runner=runner, reload_weights=(lambda **kw: None) if new else None)

    class SamplingParams:
        def __init__(self, **kw): self.__dict__.update({"top_k": 0 if new else -1, **kw})

    class LLM:
        def __init__(self, **kw):
            keys = ("skip_tokenizer_init", "logprobs_mode", "enable_sleep_mode", "seed")
            log.append(("LLM", {k: kw[k] for k in keys}, os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")))
            self.llm_engine = NS(model_config=NS(max_model_len=kw["max_model_len"]),
                                 model_executor=NS(driver_worker=NS(worker=worker)))
        def sleep(self, level): log.append(("sleep", level))
        def reset_prefix_cache(self): log.append(("reset_prefix_cache",))
        def generate(self, prompts, params, use_tqdm):
            log.append(("generate", len(prompts), [(p.n, p.top_k, p.seed, p.logprobs) for p in params]))
            def out(j):  # even samples stop on EOS, odd ones at the length cap
                toks = [5, 6, eos] if j % 2 == 0 else [5, 6, 7, 8]
                return NS(index=j, token_ids=toks, logprobs=[{t: NS(logprob=-0.5)} for t in toks],
                          finish_reason="stop" if j % 2 == 0 else "length", stop_reason=None)
            return [NS(outputs=[out(j) for j in reversed(range(p.n))]) for p in params]  # any order: sorted by index

    class NewLLM(LLM):
        def wake_up(self, tags=None): log.append(("wake_up", tags))
        def collective_rpc(self, method, kwargs=None):
            if callable(method): return [method(worker)]
            log.append((method, len(list(kwargs["weights_iterator"]))))

    class OldLLM(LLM):
        def wake_up(self): log.append(("wake_up", None))

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = (NewLLM if new else OldLLM), SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    return {"vllm": vllm, "vllm.inputs": inputs}


def vllm_trace(module, model, tok, new: bool):
    "A `module.VLLMEngine` on a fake vLLM: sleep, generate, sync weights, generate; the calls it made and its results"
    log = []
    with mock.patch.dict(sys.modules, fake_vllm(new, log)), mock.patch.dict(os.environ):
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        eng = module.VLLMEngine(model, tok, "unused", max_model_len=512)
        eng.sleep_mode = True; eng._sleep()  # sleep mode is CUDA-only: switched on by hand
        a = eng.generate(["Q: 1+2\nA:", "Q: 7\nA:"], 2, SamplingParams(max_new_tokens=8, seed=1))
        eng.sync_weights()
        b = eng.generate(["Q: 1+2\nA:"], 2, SamplingParams(temperature=0, max_new_tokens=8))
        c = eng.generate(["Q: 7\nA:"], 3, SamplingParams(top_p=0.9, max_new_tokens=8, seed=2))  # recomputed log-probs
    res = [[(x.prompt_index, x.completion_ids, x.finish_reason, x.logprobs) for x in cs] for cs in (a, b, c)]
    return log, res, eng.last_sync, sorted(eng.asleep)


@pytest.mark.parametrize("new", [True, False])
def test_vllm_engine_on_fake_vllm(shipped, new):
    "Each vLLM variant gets the calls that suit it: top-k off, wake-up tags, the weight-loading route"
    m, tok = shipped
    log, res, how, asleep = vllm_trace(rollout, m, tok, new)
    off = 0 if new else -1
    n_weights = len(m.state_dict())
    wake_all, wake_w = (["kv_cache", "weights"], ["weights"]) if new else (None, None)
    expected = [("LLM", dict(skip_tokenizer_init=True, logprobs_mode="processed_logprobs", enable_sleep_mode=False,
                             seed=0), "0"),
                ("sleep", 1),
                ("wake_up", wake_all), ("generate", 2, [(2, off, 1, 0), (2, off, 3, 0)]), ("sleep", 1),
                ("wake_up", wake_w), ("reload_weights" if new else "load_weights", n_weights), ("reset_prefix_cache",)]
    expected += ([("wake_up", ["kv_cache"])] if new else []) + [("generate", 2, [(1, off, None, 0)] * 2), ("sleep", 1)]
    expected += [("wake_up", ["kv_cache", "weights"]) if new else ("wake_up", None),
                 ("generate", 1, [(3, off, 2, 0)]), ("sleep", 1)]
    assert log == expected
    assert (how, asleep) == ("reload_weights" if new else "load_weights", ["kv_cache", "weights"])
    a, b, c = res
    assert [(i, why) for i, _, why, _ in a] == [(0, "eos"), (0, "length"), (1, "eos"), (1, "length")]
    assert [x[1] for x in b] == [[5, 6, 1]] * 2 and all(x[3] == [-0.5] * len(x[1]) for x in a + b)
    assert all(x[3] != [-0.5] * len(x[1]) for x in c)  # top-p truncates: recomputed by the training model
