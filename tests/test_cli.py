"The `bppo` command as a user runs it: one-line errors with exit code 2, and a real eval writing its JSON."
import json, subprocess
import pytest
from conftest import bppo_cmd, ROOT

def run(*args, timeout=300):
    return subprocess.run(bppo_cmd() + list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)

@pytest.mark.parametrize("args,msg", [
    (["eval", "--set", "rollout.temperature=-1"], "rollout.temperature: must be > 0, got -1"),
    (["eval", "--set", "train.steps=ten"], "train.steps: expected int"),
    (["train", "--set", "algo.name=ppo2"], "algo.name: must be one of"),
    (["eval", "--set", "nonsense"], "not of the form key=value"),
    (["eval", "--set", "data.eval_path=/no/such/eval.jsonl"], "data file not found: /no/such/eval.jsonl"),
    (["eval", "--checkpoint", "/no/such/ckpt"], "no model checkpoint at /no/such/ckpt"),
    (["eval", "--config", "/no/such.yaml"], "config file not found"),
    (["eval", "--samples", "0"], "--samples must be >= 1"),
    (["eval", "--set", "rollout.engine=nope"], "rollout.engine: must be one of"),  # eval uses the config's engine
    (["sft", "--set", "sft.steps=0"], "sft.steps: must be >= 1"),
])
def test_bad_input_one_line_exit_2(args, msg):
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert msg in r.stderr and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr

@pytest.mark.slow  # the bppo command end to end, evaluation included (22 s on 2 busy cores)
def test_eval_writes_json(tmp_path):
    out = tmp_path / "r.json"
    r = run("eval", "--samples", "2", "--set", "data.eval_size=6", "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    for k in ["accuracy", "greedy_accuracy", "mixed_group_fraction", "mean_response_tokens", "mean_correct_tokens",
              "mean_incorrect_tokens", "accuracy_by_style", "tokens_by_style"]:
        assert k in d, k
    assert d["n_prompts"] == 6 and d["samples"] == 2 and 0 <= d["accuracy"] <= 1
    assert set(d["accuracy_by_style"]) == {"concise", "verbose"}

@pytest.mark.slow  # per-completion gradients through the bppo command (39 s on 2 busy cores)
def test_probe_writes_json_and_png(tmp_path):
    out = tmp_path / "probe.json"
    r = run("probe", "--prompts", "4", "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert {"same_label_cos", "cross_label_cos", "n_groups"} <= set(d) and d["n_groups"] >= 1
    assert -1 <= d["same_label_cos"] <= 1 and out.with_suffix(".png").stat().st_size > 1000
