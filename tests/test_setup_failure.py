"""Nothing a failed setup built stays alive: the engine is closed, and no engine object stays referenced even while the
traceback is kept, as a notebook keeps it (issue 52, item 4). A stand-in engine counts its live instances."""
import gc, weakref
import pytest, torch
from transformers import Qwen2ForCausalLM
from bppo_kit.config import ConfigError, get_config
from bppo_kit.core import Engine, register_engine
from bppo_kit.data import DataError, write_jsonl
from bppo_kit.policy import char_tokenizer, tiny_config
from bppo_kit.runs import open_run
from bppo_kit.trainer import setup, train


@register_engine("counted")
class Counted(Engine):
    "A stand-in for vLLM's engine: counts the instances alive and the closes"
    live = weakref.WeakSet()
    closes = 0
    def __init__(self, model, tok, progress=False):
        self.model, self.tok = model, tok
        Counted.live.add(self)
    def generate(self, prompts, n=1, sampling=None, **kw): raise AssertionError("a failed setup never generates")
    def close(self): Counted.closes += 1


@pytest.fixture
def counted():
    gc.collect()
    Counted.closes = 0
    assert not list(Counted.live)
    yield Counted


def policy():
    "A small random policy, so that no shipped checkpoint is needed"
    tok = char_tokenizer()
    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_config(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)), tok


def gsm8k_rows(path, n=8):
    write_jsonl([{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(n)], path)
    return path


def config(tmp_path, *sets):
    cfg = get_config("cpu-demo", overrides=["train.prompts_per_step=4", "rollout.group_size=2", "train.steps=1",
                                            "rollout.max_new_tokens=8", f"train.out={tmp_path}/run", *sets])
    cfg.rollout.engine = "counted"
    return cfg


def assert_none_alive(counted):
    gc.collect()
    assert counted.closes == 1 and not list(counted.live), (counted.closes, len(counted.live))


def test_setup_with_a_missing_data_file_leaves_no_engine(tmp_path, counted):
    cfg = config(tmp_path, "data.task=gsm8k", f"data.path={tmp_path}/missing.jsonl")
    with pytest.raises(DataError, match="missing.jsonl") as failed:  # `failed` keeps the traceback
        setup(cfg, open_run(cfg), policy=policy())
    assert_none_alive(counted)
    # it failed after the engine was built: in the sampler, loading the data
    assert any(str(e.path).endswith("sampler.py") for e in failed.traceback)


def test_the_kept_traceback_would_hold_the_engine_without_frees_on_error(tmp_path, counted):
    "The control: the engine is closed, but the traceback's frames still reference it until they are cleared"
    cfg = config(tmp_path, "data.task=gsm8k", f"data.path={tmp_path}/missing.jsonl")
    with pytest.raises(DataError) as failed:
        setup.__wrapped__(cfg, open_run(cfg), policy=policy())
    gc.collect()
    assert counted.closes == 1 and len(counted.live) == 1
    del failed
    gc.collect()
    assert not list(counted.live)


def test_a_sampler_that_fails_leaves_no_engine(tmp_path, counted):
    "Fewer prompts fit than a step needs: the sampler refuses, after the engine is built"
    data = gsm8k_rows(tmp_path / "data.jsonl", n=3)
    cfg = config(tmp_path, "data.task=gsm8k", f"data.path={data}")
    with pytest.raises(ConfigError, match="prompts_per_step"):
        setup(cfg, open_run(cfg), policy=policy())
    assert_none_alive(counted)


def test_train_with_a_missing_eval_file_leaves_no_engine(tmp_path, counted):
    "The eval set loads in `train`, after `setup` returned: its failure closes the engine too"
    data = gsm8k_rows(tmp_path / "data.jsonl")
    cfg = config(tmp_path, "data.task=gsm8k", f"data.path={data}", f"data.eval_path={tmp_path}/missing.jsonl")
    with pytest.raises(DataError, match="missing.jsonl"):
        train(cfg, progress=False, policy=policy())
    assert_none_alive(counted)
