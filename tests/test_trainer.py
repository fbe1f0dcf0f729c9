"The training loop as a user runs it: kill -9 then --resume gives each step once and the uninterrupted run's weights."
import json, os, signal, subprocess, time
import pytest, torch
from conftest import bppo_cmd, ROOT
from bppo_kit.policy import load_policy

SMALL = ["--set", "train.prompts_per_step=4", "--set", "rollout.group_size=4", "--set", "data.eval_size=4",
         "--set", "rollout.max_new_tokens=120", "--quiet"]

def train_cmd(out, steps=6):
    return bppo_cmd() + ["train", "--preset", "cpu-demo", "--algo", "grpo", "--steps", str(steps), "--seed", "3",
                         "--out", str(out), "--save-every", "1"] + SMALL

def steps_of(run):
    return [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]

@pytest.mark.slow  # three training runs in subprocesses (302 s measured on 2 busy cores)
def test_kill_and_resume_is_exact(tmp_path):
    full = subprocess.run(train_cmd(tmp_path / "full"), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert full.returncode == 0, full.stderr[-3000:]
    run = tmp_path / "killed"
    p = subprocess.Popen(train_cmd(run), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    t0 = time.time()
    while time.time() - t0 < 600:  # kill -9 once three steps are logged (mid-run, between checkpoints or not)
        if (run / "metrics.jsonl").exists() and len(steps_of(run)) >= 3: break
        if p.poll() is not None: break
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before it could be killed"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = subprocess.run(train_cmd(run) + ["--resume"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert steps_of(run) == list(range(6))
    a, _ = load_policy(str(tmp_path / "full" / "checkpoint"))
    b, _ = load_policy(str(run / "checkpoint"))
    for (n, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-6, rtol=0), n
    assert (run / "curves.png").stat().st_size > 1000

def test_bad_value_exits_2(tmp_path):
    r = subprocess.run(bppo_cmd() + ["train", "--set", "rollout.temperature=-1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "rollout.temperature" in r.stderr and r.stderr.strip().count("\n") == 0

def test_plot_missing_run_exits_2(tmp_path):
    r = subprocess.run(bppo_cmd() + ["plot", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 2 and "no metrics.jsonl" in r.stderr

@pytest.mark.slow  # a GRPO and a BPPO run (110 s measured on 2 busy cores)
def test_bppo_trains_two_prefixes_per_group(tmp_path):
    "GRPO and BPPO on the same prompts and samples: BPPO trains at most 2 sequences per group and fewer tokens"
    from bppo_kit.config import get_config
    from bppo_kit.trainer import read_jsonl_rows, train
    rows = {}
    for algo in ("grpo", "bppo"):
        cfg = get_config("cpu-demo", overrides=["train.prompts_per_step=4", "rollout.group_size=4", "train.steps=2",
                                                f"algo.name={algo}", f"train.out={tmp_path / algo}"])
        train(cfg, progress=False, evaluate_every=False)
        rows[algo] = read_jsonl_rows(tmp_path / algo / "metrics.jsonl")
    g, b = rows["grpo"][0], rows["bppo"][0]
    assert g["generated_tokens"] == b["generated_tokens"]  # step 0: same policy, prompts and sampling seed
    assert b["selected_sequences"] <= 2 * 4 and b["selected_sequences"] <= g["selected_sequences"]
    assert b["trained_tokens"] == b["prefix_tokens"] <= g["trained_tokens"]
    assert (all(r["trained_tokens"] > 0 for r in rows["bppo"])
            or any(r["frac_zero_std_groups"] == 1 for r in rows["bppo"]))

@pytest.mark.slow  # T-PPO runs, stopped and resumed (78 s measured on 2 busy cores)
def test_tppo_windows_and_resume(tmp_path):
    "T-PPO on the shipped policy: responses span several windows, metrics are logged, and a resumed run is exact"
    from bppo_kit.config import get_config
    from bppo_kit.trainer import read_jsonl_rows, train
    ov = ["algo.name=tppo", "rollout.window=24", "train.prompts_per_step=4", "rollout.group_size=4", "train.steps=4",
          "train.save_every=1"]
    a = get_config("cpu-demo", overrides=ov + [f"train.out={tmp_path / 'a'}"])
    train(a, progress=False, evaluate_every=False)
    rows = read_jsonl_rows(tmp_path / "a" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert any(r["pool_unfinished"] > 0 for r in rows)  # some responses needed more than one window
    assert any((r["window_rounds_mean"] or 0) > 1 for r in rows)
    assert all(0 < r["slot_utilization"] <= 1 for r in rows)
    # this step's new tokens train now or (held back by exclude_last) carried in the next step: never more than made
    assert all(r["trained_tokens"] - r["carried_tokens"] <= r["generated_tokens"] for r in rows)
    for k in range(1, len(rows) + 1):
        assert sum(r["trained_tokens"] for r in rows[:k]) <= sum(r["generated_tokens"] for r in rows[:k])
    assert any(r["carried_tokens"] > 0 for r in rows)
    b = get_config("cpu-demo", overrides=ov + [f"train.out={tmp_path / 'b'}"])
    train(b, progress=False, evaluate_every=False, stop_after=2)
    train(b, resume=True, progress=False, evaluate_every=False)
    rb = read_jsonl_rows(tmp_path / "b" / "metrics.jsonl")
    assert [r["generated_tokens"] for r in rb] == [r["generated_tokens"] for r in rows]
    x, _ = load_policy(str(tmp_path / "a" / "checkpoint"))
    y, _ = load_policy(str(tmp_path / "b" / "checkpoint"))
    for (n, p), q in zip(x.state_dict().items(), y.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), n

@pytest.mark.slow  # a PPO training run (20 s on 2 busy cores)
def test_ppo_finishes_every_response(tmp_path):
    from bppo_kit.config import get_config
    from bppo_kit.trainer import read_jsonl_rows, train
    cfg = get_config("cpu-demo", overrides=["algo.name=ppo", "train.prompts_per_step=4", "rollout.group_size=4",
                                            "train.steps=2", f"train.out={tmp_path}"])
    train(cfg, progress=False, evaluate_every=False)
    rows = read_jsonl_rows(tmp_path / "metrics.jsonl")
    assert all(r["finished_frac"] == 1.0 and r["pool_unfinished"] == 0 for r in rows)
    assert all(r["value_loss"] is not None for r in rows)

@pytest.mark.slow  # a BPPO run with resampling (85 s measured on 2 busy cores)
def test_resample_and_early_stop(tmp_path):
    "BPPO with resampling of zero-signal groups and adaptive completion scheduling runs and reports both"
    from bppo_kit.config import get_config
    from bppo_kit.trainer import read_jsonl_rows, train
    cfg = get_config("cpu-demo", overrides=["algo.name=bppo", "algo.resample=2", "algo.bppo.schedule=early_stop",
                                            "train.prompts_per_step=8", "rollout.group_size=8", "train.steps=2",
                                            f"train.out={tmp_path}"])
    train(cfg, progress=False, evaluate_every=False)
    rows = read_jsonl_rows(tmp_path / "metrics.jsonl")
    assert all("refilled_groups" in r and 0 <= r["cancelled_frac"] < 1 for r in rows)
    assert any(r["cancelled_frac"] > 0 for r in rows)  # some groups were stopped early
    assert all(r["selected_sequences"] <= 16 for r in rows)
