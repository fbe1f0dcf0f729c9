"""`bppo tune` and `bppo compare --tuned`: every arm the same number of trials, scored on the validation set and never
on the test set, resumable after a crash; a tuned confirming design refuses the tuning seeds and runs on fresh ones
with each arm at its chosen settings."""
import json, subprocess
import pytest
from conftest import ROOT, bppo_cmd, needs_tiny
from bppo_kit import trainer as T
from bppo_kit import tune as TU
from bppo_kit.compare import read_designs
from bppo_kit.config import get_config, load_config, shared_data_dir
from bppo_kit.evaluate import eval_examples

TINY = ["train.steps=2", "train.prompts_per_step=2", "rollout.group_size=4", "data.eval_size=4",
        "rollout.max_new_tokens=24", "train.eval_every=1"]


def bppo(*args, timeout=900):
    return subprocess.run(bppo_cmd() + list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def counts(tuned):
    out = {}
    for r in tuned["trials"]: out[r["arm"].split(":")[0]] = out.get(r["arm"].split(":")[0], 0) + 1
    return out


@needs_tiny
@pytest.mark.slow
def test_tune_scores_on_val_only_and_resumes(tmp_path, monkeypatch):
    seen = []  # every prompt any evaluation of the tuning sees
    real = T.evaluate
    monkeypatch.setattr(T, "evaluate", lambda policy, tok, examples, **kw: (
        seen.extend(e.prompt for e in examples), real(policy, tok, examples, **kw))[1])
    calls = {"n": 0}
    real_train = TU._train_one

    def crash_third(*a, **kw):  # a crash in the middle of the second round of trials
        calls["n"] += 1
        if calls["n"] == 3: raise KeyboardInterrupt
        return real_train(*a, **kw)
    monkeypatch.setattr(TU, "_train_one", crash_third)
    base = get_config("cpu-demo", overrides=TINY)
    with pytest.raises(KeyboardInterrupt):
        TU.tune(base, ["grpo", "bppo"], [5], tmp_path, trials=2, progress=False)
    monkeypatch.setattr(TU, "_train_one", real_train)
    t = TU.tune(base, ["grpo", "bppo"], [5], tmp_path, trials=2, progress=False)
    assert counts(t) == {"grpo": 2, "bppo": 2}  # equal trials, the crashed one drawn again
    test = {e.prompt for e in eval_examples(base)}
    val = {e.prompt for e in eval_examples(get_config("cpu-demo", overrides=[*TINY, "data.eval_split=val"]))}
    assert seen and set(seen) <= val and not set(seen) & test  # never the test set
    for r in t["trials"]:
        for run in r["runs"]:
            assert load_config(f"{run}/config.yaml").data.eval_split == "val"
    for name, a in t["arms"].items():  # each arm's chosen trial is its best
        assert a["score"] == max(r["score"] for r in t["trials"] if r["arm"].startswith(name + ":"))
    d = read_designs(tmp_path)[-1]
    assert (d["kind"], d["seeds"]) == ("choosing", [5])
    assert {"trials.md", "trials.jsonl", "tuned.json", "tune.png"} <= {p.name for p in tmp_path.iterdir()}


@needs_tiny
@pytest.mark.slow
def test_cli_tune_then_tuned_confirm(tmp_path):
    sets = [x for o in TINY for x in ("--set", o)]
    tune_dir, cmp = tmp_path / "tune", tmp_path / "cmp"
    r = bppo("tune", "--preset", "cpu-demo", "--algos", "grpo,bppo", "--trials", "2", "--seeds", "2", "--out",
             tune_dir, "--quiet", *sets)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| grpo |" in r.stdout and "| bppo |" in r.stdout
    tuned = json.loads((tune_dir / "tuned.json").read_text())
    assert counts(tuned) == {"grpo": 2, "bppo": 2} and tuned["seeds"] == [0, 1]
    # the tuning seeds are refused in one line, before anything trains
    r = bppo("compare", "--preset", "cpu-demo", "--tuned", tune_dir, "--seeds", "1-2", "--out", cmp, "--quiet",
             *sets)
    assert r.returncode == 2 and "seed(s) 1 were used by a choosing design" in r.stderr, r.stderr[-2000:]
    assert f"design in {tune_dir.resolve()}; confirm" in r.stderr and not cmp.exists()  # nothing written
    r = bppo("compare", "--preset", "cpu-demo", "--tuned", tune_dir, "--seeds", "7-8", "--out", cmp, "--quiet",
             *sets)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "note: bppo claim a cheaper step; at equal steps" in r.stderr  # no --budget: said, not refused
    rep = json.loads((cmp / "report.json").read_text())
    assert rep["design"]["kind"] == "confirming"
    assert list(rep["arms"]) == [a["arm"] for a in tuned["arms"].values()]  # each arm at its chosen settings
    for a in tuned["arms"].values():
        c = load_config(next(cmp.glob(f"{a['arm'].replace(':', '~')}-s7")) / "config.yaml")
        assert c.train.lr == pytest.approx(float(a["arm"].split("train.lr=")[1].split(":")[0]))
        assert c.data.eval_split == "test"  # a confirming design reports on the test set


@pytest.mark.skipif(not (shared_data_dir() / "gsm8k" / "train.jsonl").exists(), reason="../shared/data/gsm8k is absent")
def test_gsm8k_and_math_tune_on_a_val_split_carved_from_train():
    "A task without a val split of its own: 1 train problem in 20, never a test one, never trained on when tuning"
    from bppo_kit.data import load_task
    from bppo_kit.sampler import PromptSource
    for task, preset in (("gsm8k", "gsm8k-qwen2.5-0.5b"), ("math", "math-qwen2.5-1.5b")):
        cfg = get_config(preset, overrides=[f"data.task={task}", "data.eval_split=val", "data.eval_size=0"])
        val = {e.prompt for e in eval_examples(cfg)}
        train, test = load_task(task, "train"), {e.prompt for e in load_task(task, "test")}
        assert 0.03 < len(val) / len(train) < 0.07 and not val & test, (task, len(val))
        tuning = {e.prompt for e in PromptSource(cfg).examples}
        assert not tuning & val and tuning | val == {e.prompt for e in train}
        assert {e.prompt for e in PromptSource(get_config(preset, overrides=[f"data.task={task}"])).examples} >= val
