"""The tail variant of the synthetic task (`data.ops_tail > 0`): its chains, its lengths' law, its eval set and
stream, SFT from a checkpoint, and the `cpu-tail` preset's policy."""
import json, random
import pytest, torch
from conftest import ROOT
from bppo_kit.config import Config, DataConfig, get_config
from bppo_kit.data import (load_synthetic_eval, make_chain, make_synthetic_eval, make_tail_eval, make_trace,
                           problem_stream, synthetic_eval, synthetic_prompt, synthetic_stream, tail_n_ops, tail_stream)
from bppo_kit.evaluate import eval_examples
from bppo_kit.policy import char_tokenizer, load_policy, tiny_config
from bppo_kit.sampler import PromptSource, step_seed
from bppo_kit.verifier import score

def _values(p):
    vals = [p.operands[0]]
    for op, x in zip(p.ops, p.operands[1:]): vals.append(vals[-1] + x if op == "+" else vals[-1] - x if op == "-"
                                                         else vals[-1] * x)
    return vals

def test_chain_invariants():
    rng = random.Random(0)
    for _ in range(300):
        n = tail_n_ops(rng, 0.85, 40)
        p = make_chain(rng, n)
        vals = _values(p)
        assert len(p.ops) == n == len(p.operands) - 1 and all(1 <= x <= 12 for x in p.operands)
        assert all(0 <= v <= 99 for v in vals) and p.answer == vals[-1]
        assert synthetic_prompt(p) == f"Q: {p.expr}\nA:" and p.expr.count("(") == p.expr.count(")") == n - 1
        assert score(make_trace(p, rng, "concise", wrong_p=0), str(p.answer), "synthetic").correct
        assert not score(make_trace(p, rng, "concise", wrong_p=1), str(p.answer), "synthetic").correct
        assert score(make_trace(p, rng, "verbose", wrong_p=1, catch_p=1), str(p.answer), "synthetic").correct

@pytest.mark.parametrize("a,top", [(0.85, 40), (1.5, 12)])
def test_tail_law(a, top):
    "P(n >= k) = ((k/2)^-a - c) / (1 - c), c = ((top+1)/2)^-a: a Pareto's whole part, redrawn above `top` (no spike)"
    draws = 40000
    rng = random.Random(1)
    ns = [tail_n_ops(rng, a, top) for _ in range(draws)]
    c = ((top + 1) / 2) ** -a
    sf = lambda k: ((k / 2) ** -a - c) / (1 - c)
    assert min(ns) == 2 and max(ns) == top
    for k in [2, 3, 4, 6, 10, 16, 25, top]:
        if k > top: continue
        want, got = sf(k), sum(n >= k for n in ns) / draws
        assert abs(got - want) <= 4 * (want * (1 - want) / draws) ** 0.5 + 1e-9, (k, got, want)
    at_top = sum(n == top for n in ns) / draws  # the last length holds its own mass, not the clipped tail's
    want = sf(top)
    assert abs(at_top - want) <= 4 * (want / draws) ** 0.5 + 1e-9, (at_top, want)

def test_tail_eval_fixed_and_never_trained_on():
    d = DataConfig(ops_tail=0.85, max_ops=40)
    ev = synthetic_eval(d)
    assert ev == make_tail_eval(0.85, 40) and len({e.meta["expr"] for e in ev}) == len(ev) == 200
    assert {e.task for e in ev} == {"synthetic"} and max(e.meta["n_ops"] for e in ev) > 10
    held = {e.meta["expr"] for e in ev}
    cfg = get_config("cpu-demo", overrides=["data.ops_tail=0.85"])
    src = PromptSource(cfg)
    assert eval_examples(cfg) == ev  # eval_size 200
    steps = [e.meta["expr"] for s in range(50) for e in src(s)]
    assert not held & set(steps) and len(set(steps)) > 0.9 * len(steps)
    assert not held & {e.meta["expr"] for e in src.extra(3, 1, 64)}
    sft = problem_stream(d, 0)  # SFT's problems
    assert not held & {next(sft).expr for _ in range(5000)}
    assert make_tail_eval(0.85, 40, seed=1) != ev  # the seed makes it

def test_shipped_task_unchanged():
    assert load_synthetic_eval() == make_synthetic_eval() == synthetic_eval() == synthetic_eval(DataConfig())
    cfg = get_config("cpu-demo")
    assert eval_examples(cfg) == load_synthetic_eval()
    a, b = problem_stream(DataConfig(), 5), synthetic_stream(5)
    assert [next(a) for _ in range(500)] == [next(b) for _ in range(500)]
    src = PromptSource(cfg)
    for step in (0, 7):
        s = synthetic_stream(step_seed(cfg.data.seed, step, "prompts"))
        assert [e.prompt for e in src(step)] == [synthetic_prompt(next(s)) for _ in range(cfg.train.prompts_per_step)]

def test_tail_stream_seeded():
    first = [p.expr for p, _ in zip(tail_stream(3, 0.85, 40), range(100))]
    assert first == [p.expr for p, _ in zip(tail_stream(3, 0.85, 40), range(100))]
    assert first != [p.expr for p, _ in zip(tail_stream(4, 0.85, 40), range(100))]

def test_sft_from_init_raises_positions(tmp_path):
    from transformers import Qwen2ForCausalLM
    from bppo_kit.sft import train_sft
    tok = char_tokenizer()
    torch.manual_seed(0)
    Qwen2ForCausalLM(tiny_config(tok, 32, 1, 2, 64, max_positions=128)).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    c = Config()
    c.data.ops_tail = 0.85
    c.sft.init, c.sft.max_positions, c.sft.verbose_frac = str(tmp_path / "base"), 768, 0.0
    c.sft.steps, c.sft.batch_size, c.sft.warmup_steps = 2, 8, 1
    out = train_sft(c, tmp_path / "tuned", progress=False)
    model, tk = load_policy(str(out))
    assert model.config.max_position_embeddings == 768 and model.config.hidden_size == 32
    assert {"config.json", "model.safetensors", "tokenizer.json", "sft_meta.json"} <= {p.name for p in out.iterdir()}
    meta = json.loads((out / "sft_meta.json").read_text())
    assert (meta["sft"]["init"], meta["data"]["ops_tail"], len(meta["losses"])) == (str(tmp_path / "base"), 0.85, 2)
    base, _ = load_policy(str(tmp_path / "base"))
    assert not torch.equal(base.model.embed_tokens.weight, model.model.embed_tokens.weight)  # it was trained
    # the engines check prompt + new tokens against the context: past the base's 128, within the raised 768
    from bppo_kit.rollout import HFEngine, SamplingParams
    sp = SamplingParams(max_new_tokens=200, seed=0, logprobs=False)
    with pytest.raises(ValueError, match="exceeds the context of 128"):
        HFEngine(base, tk).generate(["Q: 1+2\nA:"], 1, sp)
    assert len(HFEngine(model, tk).generate(["Q: 1+2\nA:"], 1, sp)) == 1

def test_cpu_tail_preset():
    cfg = get_config("cpu-tail")
    assert cfg.model.name_or_path == "tiny-tail" and cfg.data.task == "synthetic" and cfg.data.ops_tail > 0
    assert cfg.sft.init == "tiny" and cfg.sft.out == "data/tail_policy" and cfg.train.out == "runs/cpu-tail"
    ev = eval_examples(cfg)
    # the longest trace a chain of max_ops can have fits the budget: the longest intermediate, operand and value
    longest = max(len(make_trace(make_chain(random.Random(s), cfg.data.max_ops), random.Random(0), "concise", 0))
                  for s in range(200))
    assert cfg.rollout.max_new_tokens > longest
    assert 0 < cfg.rollout.window < cfg.rollout.max_new_tokens
    prompt = max(len(e.prompt) for e in ev)
    assert prompt + cfg.rollout.max_new_tokens <= cfg.sft.max_positions

needs_tail = pytest.mark.skipif(not (ROOT / "data" / "tail_policy" / "config.json").is_file(),
                                reason="data/tail_policy not made (bppo sft --preset cpu-tail, a few minutes)")

@needs_tail
def test_tail_policy_loads_and_generates():
    from bppo_kit.rollout import KitEngine, SamplingParams
    cfg = get_config("cpu-tail")
    model, tok = load_policy(cfg.model.name_or_path)
    meta = json.loads((ROOT / "data" / "tail_policy" / "sft_meta.json").read_text())
    assert meta["sft"] == vars(cfg.sft) and meta["data"]["ops_tail"] == cfg.data.ops_tail  # made by the preset
    assert model.config.max_position_embeddings == cfg.sft.max_positions
    ev = eval_examples(cfg)[:16]
    cs = KitEngine(model, tok).generate([e.prompt for e in ev], 2, SamplingParams(
        temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens, seed=0, logprobs=False))
    assert sum(c.finish_reason == "eos" for c in cs) >= 0.9 * len(cs)  # it stops by itself
    ok = [score(c.text, ev[c.prompt_index].answer, "synthetic").correct for c in cs]
    assert 0 < sum(ok) < len(ok)  # some right, some wrong: room for RL
