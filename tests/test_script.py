"The script API as a user writes it: a short script with its own reward and data set, through the CLI's loop."
import asyncio, subprocess, sys
import pytest
from conftest import ROOT, bppo_cmd
from bppo_kit.api import RLTrainer
from bppo_kit.runs import read_jsonl_rows

pytest.importorskip("datasets")
SCRIPT = ROOT / "examples" / "custom_reward.py"
SMALL = {"train.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 40, "train.eval_every": 0}

def script(*args):
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r

def test_the_script_is_short():
    assert len(SCRIPT.read_text().splitlines()) < 25

@pytest.mark.slow  # two steps of the script, a one-step CLI run beside it, and a resume of one more step
def test_script_trains_like_the_cli_and_resumes(tmp_path):
    run = tmp_path / "script"
    assert "run folder" in script(2, run).stdout
    rows = read_jsonl_rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0 <= r["rewards/concise_and_right"] <= 1 for r in rows)
    assert (run / "checkpoint" / "trainer_state.pt").exists() and "name: bppo" in (run / "config.yaml").read_text()
    cli = tmp_path / "cli"  # the same loop: the CLI's rows have the same metrics, the reward functions' means aside
    r = subprocess.run(bppo_cmd() + ["train", "--preset", "cpu-demo", "--algo", "bppo", "--steps", "1", "--quiet",
                                     "--set", f"train.out={cli}", "--set", "train.eval_every=0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    cli_keys = set(read_jsonl_rows(cli / "metrics.jsonl")[0])
    style = {"verbose_frac", "accuracy_verbose", "accuracy_concise"}  # the built-in synthetic task's own split
    assert set(rows[0]) - {"rewards/concise_and_right"} == cli_keys - style
    evals = read_jsonl_rows(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and all(e["problems"] == 64 and "reward_mean" in e for e in evals)
    script(3, run, "--resume")  # one more step from the step-2 checkpoint
    assert [r["step"] for r in read_jsonl_rows(run / "metrics.jsonl")] == [0, 1, 2]
    assert [e["step"] for e in read_jsonl_rows(run / "eval.jsonl")] == [0, 2, 3]  # each call ends with one

def rows_with_columns(n=12):
    return [{"prompt": f"Q: {i}+{i % 3}\nA:", "answer": str(i + i % 3), "target": 5 + i % 4, "tag": f"t{i}",
             "spans": [i, i + 1]} for i in range(n)]

def test_dataset_columns_reach_the_reward_functions(tmp_path):
    from datasets import Dataset
    seen = []
    def by_target(prompts, completions, completion_ids, target, tag, spans, trainer_state, **kw):
        seen.append(dict(prompts=prompts, completions=completions, ids=completion_ids, target=target, tag=tag,
                         spans=spans, step=trainer_state.global_step, answer=kw["answer"]))
        return [-abs(len(c) - t) for c, t in zip(completions, target)]
    async def tagged(completions, tag, **kw):
        await asyncio.sleep(0)
        return [1.0 if t.endswith("1") else None for t in tag]  # None: does not apply
    rows = rows_with_columns()
    t = RLTrainer("tiny", "grpo", SMALL | {"train.steps": 2, "train.out": str(tmp_path / "r")},
                  reward_funcs=[by_target, tagged], reward_weights=[0.1, 2.0],
                  train_dataset=Dataset.from_list(rows))
    t.train(progress=False)
    by_prompt = {r["prompt"]: r for r in rows}
    assert [s["step"] for s in seen] == [0, 1]
    for s in seen:
        assert len(s["completions"]) == 16 and all(isinstance(c, str) for c in s["completions"])
        for i, p in enumerate(s["prompts"]):  # each completion's columns are its own prompt's row
            row = by_prompt[p]
            assert (s["target"][i], s["tag"][i], s["spans"][i], s["answer"][i]) == \
                (row["target"], row["tag"], row["spans"], row["answer"])
        assert all(len(s["prompts"][i * 4:(i + 1) * 4]) == 4 and len(set(s["prompts"][i * 4:(i + 1) * 4])) == 1
                   for i in range(4))  # a group's completions share their prompt
    m = read_jsonl_rows(tmp_path / "r" / "metrics.jsonl")
    for row, s in zip(m, seen):  # the logged reward is the weighted sum, None left out
        want = [0.1 * -abs(len(c) - tg) + (2.0 if tag.endswith("1") else 0.0)
                for c, tg, tag in zip(s["completions"], s["target"], s["tag"])]
        assert row["reward_mean"] == pytest.approx(sum(want) / len(want), abs=1e-5)
        assert row["rewards/by_target"] == pytest.approx(sum(-abs(len(c) - tg) for c, tg in
                                                             zip(s["completions"], s["target"])) / 16, abs=1e-5)

def test_conversational_prompts_reach_the_reward_as_messages(tmp_path):
    seen = []
    def first(prompts, completions, **kw):
        seen.append((prompts, completions))
        return [float(len(c[0]["content"]) < 10) for c in completions]
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Q: {i}+1\nA:"}],
             "answer": str(i + 1)} for i in range(8)]
    RLTrainer("tiny", "grpo", SMALL | {"train.steps": 1, "train.out": str(tmp_path / "r")}, reward_funcs=first,
              train_dataset=rows).train(progress=False, evaluate=False)
    prompts, completions = seen[0]
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts)
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in completions)

def test_bad_reward_output_is_one_clear_error(tmp_path):
    from bppo_kit.data import DataError
    def short(completions, **kw): return [1.0]
    t = RLTrainer("tiny", "grpo", SMALL | {"train.steps": 1, "train.out": str(tmp_path / "r")}, reward_funcs=short,
                  train_dataset=rows_with_columns())
    with pytest.raises(DataError, match="reward function short: expected a list of 16 rewards"):
        t.train(progress=False, evaluate=False)
