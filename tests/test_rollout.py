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



def cpu_allocations(fn) -> list[int]:
    "The bytes of every CPU allocation made while `fn()` runs, from the profiler's memory events (in-kernel ones too)"
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof: fn()
    # the raw events: one per allocation (positive bytes) or free (negative)
    return [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.nbytes() > 0]


def expanded_sdpa(self, q, k, v, **kw):
    "The old `SlotModel._sdpa`: grouped-query heads expanded with `repeat_interleave` (copies k and v to H heads)"
    r = self.n_heads // self.n_kv
    return torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1),
                                                            scale=self.scale, **kw)


def test_decode_step_copies_no_kv_cache():
    "Qwen2.5-1.5B's attention (12 query heads, 2 key/value heads of 128): one decode step over 64 slots of 2,048"
    from transformers import Qwen2ForCausalLM
    from bppo_kit.shapes import qwen2_5_config
    from bppo_kit.rollout import SlotModel
    torch.manual_seed(0)
    # the real attention shape; one layer, a small MLP and vocabulary keep it quick
    cfg = qwen2_5_config("1.5b", num_hidden_layers=1, intermediate_size=256, vocab_size=512)
    m = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    lm = SlotModel(m)
    slots, length = 64, 2048
    lm.reserve(slots, length)
    K = lm.cache.K[0]
    assert K.shape == (slots, 2, length, 128)
    cur, pos = [5] * slots, [length - 1 - 3 * i for i in range(slots)]  # slot 0 attends over all 2,048 positions
    def step(): lm.decode(cur, pos)
    with torch.no_grad():
        # the instrument sees a copy: the old expansion allocates 6 x the cache (12 / 2 heads) for keys, and values
        with mock.patch.object(SlotModel, "_sdpa", expanded_sdpa):
            ref = lm.decode(cur, pos)
            old = cpu_allocations(step)
        assert max(old) >= 6 * K.nbytes, (max(old), K.nbytes)
        for fold in (None, True):  # CPU's own way (enable_gqa), and the way taken on CUDA (groups as query rows)
            lm.fold_groups = fold
            sizes = cpu_allocations(step)
            assert max(sizes) < K.nbytes / 4, (fold, max(sizes), K.nbytes)
            assert sum(sizes) < K.nbytes / 2, (fold, sum(sizes), K.nbytes)
            logits = lm.decode(cur, pos)
            # CPU's kernel reads the shared heads with the bits of the copies; the folded rows agree to rounding
            if fold is None: assert torch.equal(logits, ref)
            else: assert (logits - ref).abs().max().item() < 0.05



def test_moving_a_slot_copies_only_its_positions():
    "Finishing a slot moves the last busy slot's written positions (here 64 of 4,096), not its whole cache row"
    from bppo_kit.rollout import SlotCache
    sc = SlotCache(layers=2, kv_heads=2, head_dim=128)
    sc.ensure(4, 4096, torch.float32, "cpu")
    for x in sc.K + sc.V: x.normal_()
    before = [x.clone() for x in sc.K + sc.V]
    sizes = cpu_allocations(lambda: sc.move([1], [3], length=64))
    used = sc.K[0][3, :, :64].nbytes  # one slot's 64 positions of one layer's keys
    assert max(sizes) <= used and sum(sizes) <= 4 * used + 1024, sizes  # keys and values of 2 layers; the indices
    for x, y in zip(sc.K + sc.V, before):
        assert torch.equal(x[1, :, :64], y[3, :, :64]) and torch.equal(x[1, :, 64:], y[1, :, 64:])
        assert torch.equal(x[[0, 2, 3]], y[[0, 2, 3]])
    # the instrument sees the whole row that the old move copied
    assert max(cpu_allocations(lambda: sc.move([1], [3]))) >= sc.K[0][3].nbytes

class IntegerTensors:
    "A dispatch mode that records the number of elements of every int64 / int32 tensor an op returns"
    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        sizes = self.sizes = []
        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in (out if isinstance(out, (tuple, list)) else [out]):
                    if isinstance(t, torch.Tensor) and t.dtype in (torch.int64, torch.int32): sizes.append(t.numel())
                return out
        self.mode = Mode()
    def __enter__(self):
        self.mode.__enter__()
        return self.sizes
    def __exit__(self, *exc): self.mode.__exit__(*exc)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 20)])
def test_sampling_makes_no_vocab_sized_integers(temperature, top_k):
    "64 rows of Qwen's 151,936 tokens: the hash's integers come a block at a time, and the tokens are the same"
    n, V = 64, 151936
    torch.manual_seed(0)
    logits = torch.randn(n, V) * 3
    seed, uid, t = torch.full((n,), 7), torch.arange(n) + 1000, torch.randint(0, 3000, (n,))
    with IntegerTensors() as whole:  # the draw over whole rows, as it was: [n, V] int64 temporaries
        scores = rollout.filter_logits(logits / temperature, top_k)
        ref = (scores + rollout.gumbel_noise(seed, uid, t, V)).argmax(-1)
    assert max(whole) == n * V
    with IntegerTensors() as sizes:
        nxt, lp = rollout.sample_tokens(logits, temperature, top_k, 1.0, seed, uid, t)
    assert max(sizes) <= 1 << 22 < n * V // 2, max(sizes)
    assert torch.equal(nxt, ref)
    # the log-prob each token was drawn with: under the filtered logits (top-k truncates), as every engine records
    assert torch.equal(lp, torch.log_softmax(scores, -1)[torch.arange(n), ref])


def fake_vllm(new: bool, log: list):
    "A `vllm` module that logs the calls `VLLMEngine` makes: the current API (`new`) or an older one"
    eos = 1
    runner = (NS(get_model=lambda: None, reload_weights=lambda weights_iterator=None, is_checkpoint_format=True: None)
              if new else NS(model=NS(load_weights=lambda w: log.append(("load_weights", len(list(w)))))))
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
    vllm.__version__ = "0.11.0" if new else "0.10.2"
    vllm.LLM, vllm.SamplingParams = (NewLLM if new else OldLLM), SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    return {"vllm": vllm, "vllm.inputs": inputs}


def vllm_trace(module, model, tok, new: bool):
    "A `module.VLLMEngine` on a fake vLLM: generate, sleep, sync weights, generate twice; its calls and results"
    log = []
    with mock.patch.dict(sys.modules, fake_vllm(new, log)), mock.patch.dict(os.environ):
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        eng = module.VLLMEngine(model, tok, "unused", max_model_len=512)
        eng.sleep_mode = True  # sleep mode is CUDA-only: switched on by hand
        a = eng.generate(["Q: 1+2\nA:", "Q: 7\nA:"], 2, SamplingParams(max_new_tokens=8, seed=1))
        eng.sleep()  # as the trainer does before the update: level 2, the weights are discarded
        with pytest.raises(RuntimeError, match="sync_weights"): eng.generate(["Q: 7\nA:"], 1)
        eng.sync_weights()
        b = eng.generate(["Q: 1+2\nA:"], 2, SamplingParams(temperature=0, max_new_tokens=8))
        c = eng.generate(["Q: 7\nA:"], 3, SamplingParams(top_p=0.9, max_new_tokens=8, seed=2))  # vLLM's own log-probs
    res = [[(x.prompt_index, x.completion_ids, x.finish_reason, x.logprobs) for x in cs] for cs in (a, b, c)]
    return log, res, eng.last_sync, sorted(eng.asleep)


@pytest.mark.parametrize("new", [True, False])
def test_vllm_engine_on_fake_vllm(shipped, new):
    "Each vLLM variant gets the calls that suit it: top-k off, wake-up tags, the weight-loading route"
    m, tok = shipped
    log, res, how, asleep = vllm_trace(rollout, m, tok, new)
    off = 0 if new else -1
    n_weights = len(m.state_dict())
    wake_w = ["weights"] if new else None
    expected = [("LLM", dict(skip_tokenizer_init=True, logprobs_mode="processed_logprobs", enable_sleep_mode=False,
                             seed=0), "0"),
                ("generate", 2, [(2, off, None, 0), (2, off, None, 0)]), ("sleep", 2),  # one seed a call
                ("wake_up", wake_w), ("reload_weights" if new else "load_weights", n_weights), ("reset_prefix_cache",)]
    # older vLLM wakes everything at once; current vLLM wakes the KV cache when it is needed
    expected += ([("wake_up", ["kv_cache"])] if new else []) + [("generate", 2, [(1, off, None, 0)] * 2)]
    expected += [("generate", 1, [(3, off, None, 0)])]
    assert log == expected
    assert (how, asleep) == ("reload_weights" if new else "load_weights", [])
    a, b, c = res
    assert [(i, why) for i, _, why, _ in a] == [(0, "eos"), (0, "length"), (1, "eos"), (1, "length")]
    assert [x[1] for x in b] == [[5, 6, 1]] * 2 and all(x[3] == [-0.5] * len(x[1]) for x in a + b)
    assert all(x[3] == [-0.5] * len(x[1]) for x in c)  # top-p: vLLM's processed log-probs (the sampler's), kept


def real_vocab_model():
    "A one-layer Qwen2 with Qwen2.5's 151,936-token vocabulary (random weights) and the shipped character tokenizer"
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from bppo_kit.policy import char_tokenizer
    tok = char_tokenizer()
    cfg = Qwen2Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, eos_token_id=None, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval(), tok, cfg


def hf_generate_peak(m, tok, new_tokens: int, rows: int = 8) -> int:
    "Peak bytes of the tensors one HFEngine.generate call allocates (weights excluded), by the planner's LiveBytes"
    from bppo_kit.plan import LiveBytes
    sp = SamplingParams(max_new_tokens=new_tokens, seed=0, stop_token_ids=[])
    with LiveBytes(keep=list(m.parameters())) as live:
        cs = HFEngine(m, tok).generate([[5, 6, 7, 8]], rows, sp)
    assert all(len(c.logprobs) == c.n_tokens for c in cs)
    return live.peaks["update"]

def test_hf_engine_keeps_no_logits_per_step():
    "At Qwen2.5's vocabulary, a longer generate grows like the KV cache, not like vocabulary x steps (issue 43)"
    m, tok, cfg = real_vocab_model()
    rows, short, long = 8, 8, 40
    grow = hf_generate_peak(m, tok, long, rows) - hf_generate_peak(m, tok, short, rows)
    logits_kept = (long - short) * rows * cfg.vocab_size * 4  # what output_logits would add: 156 MB here
    assert grow < 0.1 * logits_kept, (grow, logits_kept)
