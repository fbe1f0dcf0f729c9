"""Chat templates end to end: the prompt ids every engine gets for a sampler step, an evaluation and a training run
equal the tokenizer's own `apply_chat_template(..., add_generation_prompt=True)`; plain prompts are unchanged;
conversational (TRL-style) JSONL rows load; bad settings and rows fail with a clear message."""
import subprocess
import pytest, torch
from transformers import Qwen2ForCausalLM
from conftest import bppo_cmd, ROOT
from bppo_kit.config import ConfigError, DataConfig, get_config
from bppo_kit.data import DataError, Example, load_task, write_jsonl
from bppo_kit.evaluate import eval_examples, evaluate
from bppo_kit.policy import chat_tokenizer, prompt_ids, tiny_config
from bppo_kit.rollout import SamplingParams
from bppo_kit.sampler import PromptSource, Sampler, make_engine
import bppo_kit.trainer as trainer

SYSTEM = "Be brief."
SMALL = ["train.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "data.eval_size=3"]


def template_ids(tok, messages):
    "What transformers itself gives (a BatchEncoding in transformers 5, a list of ids before)"
    r = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(r["input_ids"] if hasattr(r, "keys") else r)


def chat_of(ex: Example, system=SYSTEM):
    return [{"role": "system", "content": system}, {"role": "user", "content": ex.prompt}]


class Recorder:
    "An engine wrapper that keeps the prompts of every `generate` call"
    def __init__(self, eng): self.eng, self.seen = eng, []
    def __getattr__(self, k): return getattr(self.eng, k)
    def generate(self, prompts, n=1, sampling=None, **kw):
        self.seen.append([list(p) for p in prompts])
        return self.eng.generate(prompts, n, sampling, **kw)


def chat_model(bos=False):
    tok = chat_tokenizer(bos=bos)
    torch.manual_seed(0)
    cfg = tiny_config(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return Qwen2ForCausalLM(cfg).eval(), tok


def chat_cfg(engine, *more):
    return get_config("cpu-demo", overrides=SMALL + [f"rollout.engine={engine}", "data.prompt_format=chat",
                                                     f"data.system_prompt={SYSTEM}", *more])


@pytest.mark.parametrize("engine", ["hf", "kit"])
@pytest.mark.parametrize("bos", [False, True])
def test_sampler_step_and_evaluation_get_template_ids(engine, bos):
    model, tok = chat_model(bos)
    cfg = chat_cfg(engine)
    rec = Recorder(make_engine(cfg, model, tok))
    ro, _ = Sampler(cfg, rec, tok).groups(0)
    want = [template_ids(tok, chat_of(e)) for e in PromptSource(cfg)(0)]
    assert rec.seen == [want]
    assert [c.prompt_ids for c in ro.completions] == [x for x in want for _ in range(2)]  # what the trainer packs
    if bos: assert all(x.count(tok.bos_token_id) == 1 and x[0] == tok.bos_token_id for x in want)
    rec.seen.clear()
    ev = eval_examples(cfg)
    evaluate(model, tok, ev, samples=2, sampling=SamplingParams(max_new_tokens=4, seed=0), engine=rec, data=cfg.data)
    want = [template_ids(tok, chat_of(e)) for e in ev]
    assert rec.seen == [want, want]  # sampled, then greedy


@pytest.mark.parametrize("engine", ["hf", "kit"])
def test_training_run_uses_template_ids(engine, tmp_path, monkeypatch):
    "A whole `train` call on a chat checkpoint: its evaluations and its step get the template's ids"
    model, tok = chat_model()
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    recs = []
    def spy(cfg, model, tok, progress=False, **kw):
        recs.append(Recorder(make_engine(cfg, model, tok, progress, **kw)))
        return recs[-1]
    monkeypatch.setattr(trainer, "make_engine", spy)
    cfg = chat_cfg(engine, f"model.name_or_path={tmp_path / 'ckpt'}", "train.steps=1", f"train.out={tmp_path / 'run'}")
    trainer.train(cfg, progress=False)
    ev = [template_ids(tok, chat_of(e)) for e in eval_examples(cfg)]
    step = [template_ids(tok, chat_of(e)) for e in PromptSource(cfg)(0)]
    assert recs[0].seen == [ev, ev, step, ev, ev]  # eval before (sampled, greedy), step 0, eval after


def test_tppo_pool_gets_template_ids():
    from bppo_kit.tppo import TPPO
    model, tok = chat_model()
    cfg = chat_cfg("kit", "algo.name=tppo", "rollout.window=4")
    items, _ = TPPO(cfg, model).collect(0, Sampler(cfg, make_engine(cfg, model, tok), tok))
    assert [it.prompt_ids for it in items] == [template_ids(tok, chat_of(e)) for e in PromptSource(cfg)(0)
                                               for _ in range(2)]


def test_vllm_engine_passes_the_ids(monkeypatch):
    "On the fake vLLM of test_rollout: the token-id prompts reach `LLM.generate` as they are"
    import os, sys
    from unittest import mock
    from test_rollout import fake_vllm
    from bppo_kit.rollout import VLLMEngine
    model, tok = chat_model()
    chat = DataConfig(prompt_format="chat")
    ids = [prompt_ids(tok, e, chat) for e in (Example("Q: 1+2\nA:", "3"), Example("x", "1"))]
    got = []
    with mock.patch.dict(sys.modules, fake_vllm(True, [])), mock.patch.dict(os.environ):
        eng = VLLMEngine(model, tok, "unused", max_model_len=512)
        gen = eng.llm.generate
        eng.llm.generate = lambda prompts, params, use_tqdm: got.append(prompts) or gen(prompts, params, use_tqdm)
        cs = eng.generate(ids, 2, SamplingParams(max_new_tokens=4, seed=1))
    assert got == [ids] and [c.prompt_ids for c in cs] == [x for x in ids for _ in range(2)]


@pytest.mark.parametrize("engine", ["hf", "kit"])
def test_plain_prompts_unchanged(shipped, engine):
    "Plain format: the engine gets `tok(prompt)` ids, and a step's samples are those of the prompts as text"
    model, tok = shipped
    cfg = get_config("cpu-demo", overrides=SMALL + [f"rollout.engine={engine}", "rollout.max_new_tokens=40"])
    rec = Recorder(make_engine(cfg, model, tok))
    smp = Sampler(cfg, rec, tok)
    ro, _ = smp.groups(3)
    ex = smp.prompts(3)
    assert rec.seen == [[tok(e.prompt)["input_ids"] for e in ex]]
    before = make_engine(cfg, model, tok).generate([e.prompt for e in ex], 2, smp.params(3))  # the old call
    assert [(c.prompt_ids, c.completion_ids, c.logprobs) for c in ro.completions] == \
           [(c.prompt_ids, c.completion_ids, c.logprobs) for c in before]


def test_conversational_jsonl_rows(tmp_path):
    "TRL-style rows: messages kept (the row's system message wins), a readable prompt, plain text for plain format"
    rows = [{"prompt": [{"role": "system", "content": "Answer after ####."}, {"role": "user", "content": "6*7?"}],
             "answer": "#### 42"},
            {"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"},
            {"prompt": "2+2?", "answer": "4"}]
    write_jsonl(rows, tmp_path / "train.jsonl")
    cfg = get_config("cpu-demo", overrides=SMALL + ["data.task=gsm8k", f"data.path={tmp_path / 'train.jsonl'}",
                                                    "data.prompt_format=chat", f"data.system_prompt={SYSTEM}",
                                                    "train.prompts_per_step=3"])
    ex = PromptSource(cfg).examples
    assert [e.answer for e in ex] == ["42", "2", "4"]
    assert [e.prompt for e in ex] == ["Answer after ####.\n\n6*7?", "1+1?", "2+2?"]
    assert ex[0].messages == rows[0]["prompt"] and ex[2].messages is None
    model, tok = chat_model()
    smp = Sampler(cfg, make_engine(cfg, model, tok), tok)
    assert smp.encode(ex) == [template_ids(tok, rows[0]["prompt"]),  # its own system message, not data.system_prompt
                              template_ids(tok, [{"role": "system", "content": SYSTEM}, rows[1]["prompt"][0]]),
                              template_ids(tok, [{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": "2+2?"}])]
    cfg.data.prompt_format = "plain"
    assert smp.encode(ex) == [tok(t)["input_ids"] for t in ("Answer after ####.\n\n6*7?", f"{SYSTEM}\n\n1+1?",
                                                            f"{SYSTEM}\n\n2+2?")]


@pytest.mark.parametrize("row,msg", [
    ({"prompt": [], "answer": "1"}, "row 2: prompt: expected a string or a non-empty list of messages"),
    ({"prompt": [{"role": "user"}], "answer": "1"}, "row 2: prompt: message 0 must be a dict with string 'role'"),
    ({"prompt": [{"role": "robot", "content": "hi"}], "answer": "1"}, "message 0 has role 'robot'"),
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "answer": "1"},
     "the last message must be the user's"),
    ({"prompt": [{"role": "user", "content": "q"}]}, "row has no 'question' (or 'prompt') / 'answer' field"),
])
def test_malformed_rows_name_file_and_row(tmp_path, row, msg):
    write_jsonl([{"prompt": "fine", "answer": "1"}, row], tmp_path / "bad.jsonl")
    with pytest.raises(DataError) as e: load_task("gsm8k", path=tmp_path / "bad.jsonl")
    assert msg in str(e.value) and "bad.jsonl row 2" in str(e.value), str(e.value)


def test_chat_without_template_is_a_config_error(shipped):
    model, tok = shipped  # the shipped character tokenizer has no chat template
    cfg = get_config("cpu-demo", overrides=SMALL + ["data.prompt_format=chat"])
    with pytest.raises(ConfigError, match="data.prompt_format: chat needs a tokenizer with a chat template"):
        Sampler(cfg, make_engine(cfg, model, tok), tok).groups(0)
    with pytest.raises(ConfigError, match="data.prompt_format"):
        evaluate(model, tok, eval_examples(cfg), samples=1, data=cfg.data)


def test_cli_errors_one_line_exit_2(tmp_path):
    write_jsonl([{"prompt": [{"role": "assistant", "content": "4"}], "answer": "4"}], tmp_path / "ev.jsonl")
    for args, msg in [(["--set", "data.prompt_format=chat"], "data.prompt_format: chat needs a tokenizer"),
                      (["--set", "data.task=gsm8k", "--set", f"data.eval_path={tmp_path / 'ev.jsonl'}"],
                       "ev.jsonl row 1: prompt: the last message must be the user's")]:
        r = subprocess.run(bppo_cmd() + ["eval", "--quiet", "--samples", "1", "--set", "data.eval_size=2", *args],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr[-2000:]
