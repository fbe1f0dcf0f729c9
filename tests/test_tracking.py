"""`train.report_to`: every logged scalar of every step reaches the tracker, read back with the tracker's own reader."""
import importlib.util
import pytest
from bppo_kit.config import ConfigError, data_dir, get_config
from bppo_kit.runs import read_jsonl_rows
from bppo_kit.tracking import scalars
from bppo_kit.trainer import train

HAVE_TINY = (data_dir() / "tiny_policy" / "config.json").exists()
SMALL = ["train.prompts_per_step=4", "rollout.group_size=4", "data.eval_size=4", "train.steps=2", "train.eval_every=1"]

@pytest.mark.skipif(not HAVE_TINY, reason="the shipped tiny policy is missing (run `make sft`)")
@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_holds_every_logged_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = tmp_path / "run"
    train(get_config("cpu-demo", overrides=SMALL + [f"train.out={out}", "train.report_to=tensorboard"]), progress=False)
    ea = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    logged = (("train", read_jsonl_rows(out / "metrics.jsonl")), ("eval", read_jsonl_rows(out / "eval.jsonl")))
    for kind, rows in logged:
        assert rows
        for r in rows:
            for k, v in scalars(r).items():
                assert f"{kind}/{k}" in tags, (kind, k)
                got = {e.step: e.value for e in ea.Scalars(f"{kind}/{k}")}
                assert got[r["step"]] == pytest.approx(v, rel=1e-6, abs=1e-6), (kind, k, r["step"])
    assert len(ea.Scalars("train/loss")) == 2 and [e.step for e in ea.Scalars("eval/accuracy")] == [0, 1, 2]

@pytest.mark.parametrize("name", ["trackio", "wandb"])
def test_missing_tracker_is_one_line(name, tmp_path):
    if importlib.util.find_spec(name) is not None: pytest.skip(f"{name} is installed here (its offline test runs)")
    with pytest.raises(ConfigError, match=f"^train.report_to: {name} is not installed here; pip install {name}$"):
        train(get_config("cpu-demo", overrides=[f"train.out={tmp_path}", f"train.report_to={name}"]), progress=False)

@pytest.mark.skipif(not HAVE_TINY, reason="the shipped tiny policy is missing (run `make sft`)")
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    train(get_config("cpu-demo", overrides=SMALL + [f"train.out={out}", "train.report_to=wandb"]), progress=False)
    assert list((out / "wandb").glob("offline-run-*"))  # the run's files, for `wandb sync`

def test_bad_report_to_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="unknown tracker 'mlflow'"):
        train(get_config("cpu-demo", overrides=[f"train.out={tmp_path}", "train.report_to=mlflow"]), progress=False)
