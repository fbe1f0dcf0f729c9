"""KitEngine on the shipped policy, as the trainer uses it: identical greedy output, exact log-probs, exact windows,
no leaks."""
import pytest, torch
from bppo_kit.data import load_synthetic_eval
from bppo_kit.policy import completion_logprobs, pack
from bppo_kit.rollout import HFEngine, KitEngine, Request, SamplingParams

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
