"""One algorithm interface: a fourth algorithm, written outside the package in a file of under 40 lines, is registered
by name and trained by the same `train()` and by `bppo train --plugin FILE --algo NAME`, with no edit to the trainer."""
import importlib.util, re, subprocess
from pathlib import Path
import pytest, torch
from conftest import bppo_cmd, ROOT
from bppo_kit.config import get_config
from bppo_kit.core import ALGORITHMS
from bppo_kit.runs import read_jsonl_rows
from bppo_kit.trainer import train

PLUGIN = Path(__file__).parents[1] / "examples" / "plugins" / "reinforce.py"
SMALL = ["train.prompts_per_step=4", "rollout.group_size=4", "data.eval_size=4", "rollout.max_new_tokens=120"]

@pytest.fixture(scope="module")
def reinforce():
    spec = importlib.util.spec_from_file_location("reinforce_plugin", PLUGIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod.Reinforce
    ALGORITHMS.pop("reinforce", None)

def test_plugin_is_small():
    assert len(PLUGIN.read_text().splitlines()) < 40

def test_trainer_never_asks_which_algorithm():
    src = (ROOT / "bppo_kit" / "trainer.py").read_text()
    assert not re.search(r"isinstance\(.*(TPPO|GRPO|BPPO)|hasattr\(algo|is TPPO|\.name in \(", src)

def test_train_runs_a_registered_algorithm(tmp_path, reinforce, shipped):
    "Same prompts and samples as GRPO at step 0 (same seeds), REINFORCE's own advantages: same tokens, other gradient"
    assert ALGORITHMS["reinforce"] is reinforce
    rows = {}
    for algo in ("reinforce", "grpo"):
        cfg = get_config("cpu-demo",
                         overrides=SMALL + [f"algo.name={algo}", "train.steps=3", f"train.out={tmp_path / algo}"])
        train(cfg, progress=False, evaluate_every=False)
        rows[algo] = read_jsonl_rows(tmp_path / algo / "metrics.jsonl")
    r, g = rows["reinforce"], rows["grpo"]
    assert [x["step"] for x in r] == [0, 1, 2] and all("baseline_mean" in x for x in r)
    assert (r[0]["generated_tokens"] == g[0]["generated_tokens"]
            and r[0]["baseline_mean"] == pytest.approx(g[0]["reward_mean"]))
    assert r[0]["trained_tokens"] == g[0]["trained_tokens"]  # the same groups carry signal ...
    if r[0]["trained_tokens"]: assert r[0]["grad_norm"] != pytest.approx(g[0]["grad_norm"])  # ... with other advantages
    from bppo_kit.policy import load_policy
    trained, _ = load_policy(str(tmp_path / "reinforce" / "checkpoint"))
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), shipped[0].parameters()))

def test_cli_trains_a_plugin_algorithm(tmp_path):
    out = tmp_path / "cli"
    cmd = bppo_cmd() + ["train", "--plugin", str(PLUGIN), "--algo", "reinforce", "--steps", "3", "--out", str(out),
                        "--quiet"]
    r = subprocess.run(cmd + [a for o in SMALL for a in ("--set", o)], capture_output=True, text=True, timeout=900,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl_rows(out / "metrics.jsonl")
    assert [x["step"] for x in rows] == [0, 1, 2] and all("baseline_mean" in x for x in rows)
    assert (out / "checkpoint" / "trainer_state.pt").exists() and len(read_jsonl_rows(out / "eval.jsonl")) == 2


def test_plugin_settings_come_from_set(tmp_path):
    "`--set algo.reinforce.baseline=none` reaches the plugin's settings dataclass; a wrong field: one line, exit 2"
    outs = {}
    for baseline in ("group", "none"):
        out = outs[baseline] = tmp_path / baseline
        cmd = bppo_cmd() + ["train", "--plugin", str(PLUGIN), "--algo", "reinforce", "--steps", "1", "--out", str(out),
                            "--quiet", "--set", f"algo.reinforce.baseline={baseline}", "--set", "train.eval_every=0"]
        r = subprocess.run(cmd + [a for o in SMALL for a in ("--set", o)], capture_output=True, text=True,
                           timeout=900, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"baseline: {baseline}" in (out / "config.yaml").read_text()  # the run folder records it
    g, n = (read_jsonl_rows(outs[b] / "metrics.jsonl")[0] for b in ("group", "none"))
    assert g["generated_tokens"] == n["generated_tokens"]  # the same samples ...
    # ... other advantages: with the raw reward only the correct completions train; with the group's mean, every
    # completion of a group whose rewards differ
    assert n["trained_tokens"] != g["trained_tokens"] and n["selected_sequences"] == g["selected_sequences"]
    bad = subprocess.run(bppo_cmd() + ["train", "--plugin", str(PLUGIN), "--algo", "reinforce", "--steps", "1",
                                       "--out", str(tmp_path / "bad"), "--set", "algo.reinforce.baselin=none"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2, bad.stderr
    assert "algo.reinforce.baselin: reinforce has no setting 'baselin'" in bad.stderr, bad.stderr


def test_a_lessons_copy_of_a_builtin_keeps_its_place(monkeypatch):
    "Running the GRPO lesson re-registers its own GRPO (module __main__): the names keep their order (and messages)"
    from bppo_kit.core import algorithm_class, algorithm_names
    from bppo_kit.config import ConfigError
    names = algorithm_names()
    assert names[:2] == ["grpo", "bppo"]
    grpo = ALGORITHMS["grpo"]
    copy = type("GRPO", (grpo,), dict(__module__="__main__", __qualname__=grpo.__qualname__))
    monkeypatch.setitem(ALGORITHMS, "grpo", copy)
    assert algorithm_names() == names
    with pytest.raises(ConfigError, match="must be one of " + ", ".join(names) + "; got 'nope'"):
        algorithm_class("nope")
    other = type("Mine", (grpo,), dict(__module__="__main__"))
    monkeypatch.setitem(ALGORITHMS, "mine", other)  # a user's own comes after every built-in
    assert algorithm_names() == names + ["mine"]
