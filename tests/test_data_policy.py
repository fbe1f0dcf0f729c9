"The shipped files and the loaders: eval set = its seed, data/ small, the shipped policy loads and scores consistently."
import json, random
import pytest, torch
from conftest import ROOT, examples, fuzz_seed
from bppo_kit.config import SFTConfig, Config, shared_data_dir
from bppo_kit.data import (DataError, load_synthetic_eval, load_task, make_problem, make_synthetic_eval, make_trace,
                           read_jsonl, style_of, synthetic_stream)
from bppo_kit.policy import completion_logprobs, load_policy, pack
from bppo_kit.rollout import HFEngine, SamplingParams
from bppo_kit.verifier import score

def test_shipped_eval_set_is_the_seeds():
    assert load_synthetic_eval() == make_synthetic_eval()

def test_data_dir_small():
    size = sum(p.stat().st_size for p in (ROOT / "data").rglob("*") if p.is_file())
    assert size <= 16 * 2**20, size  # two policies of ~7 MB (tiny_policy, tail_policy) and the eval set

def test_stream_never_yields_eval_problems():
    held = {e.meta["expr"] for e in load_synthetic_eval()}
    s = synthetic_stream(0)
    assert not any(next(s).expr in held for _ in range(20000))

@pytest.mark.fuzz
def test_traces_grade_as_intended():
    rng = random.Random(fuzz_seed(0))
    for _ in range(examples(500)):
        p = make_problem(rng)
        assert score(make_trace(p, rng, "concise", wrong_p=0), str(p.answer), "synthetic").correct
        assert score(make_trace(p, rng, "verbose", wrong_p=1, catch_p=1), str(p.answer), "synthetic").correct
        assert not score(make_trace(p, rng, "concise", wrong_p=1), str(p.answer), "synthetic").correct
        assert style_of(make_trace(p, rng, "verbose")) == "verbose"
        assert style_of(make_trace(p, rng, "concise")) == "concise"

needs_shared = pytest.mark.skipif(not (shared_data_dir() / "gsm8k").exists(), reason="../shared/data not present")

@needs_shared
@pytest.mark.parametrize("task,split,n", [("gsm8k", "train", 7473), ("gsm8k", "test", 1319), ("math", "train", 7498),
    ("math500", "test", 500), ("aime24", "test", 30), ("amc23", "test", 40), ("geo3k", "train", 2101),
    ("geo3k", "test", 601)])
def test_local_loaders(task, split, n):
    ex = load_task(task, split)
    assert len(ex) == n and all(e.prompt and e.answer and e.task == task for e in ex)

@needs_shared
def test_gsm8k_references_all_correct():
    ex = load_task("gsm8k", "test")
    rows = read_jsonl(shared_data_dir() / "gsm8k" / "test.jsonl")
    assert sum(score(r["answer"], e.answer, "gsm8k").correct for r, e in zip(rows, ex)) == len(ex)

def test_missing_file_is_data_error(tmp_path):
    with pytest.raises(DataError, match="data file not found"): load_task("math500", path=tmp_path / "x.jsonl")

def test_shipped_policy(shipped):
    model, tok = shipped
    assert 1.7e6 < sum(p.numel() for p in model.parameters()) < 1.9e6
    meta = json.loads((ROOT / "data" / "tiny_policy" / "sft_meta.json").read_text())
    want = vars(SFTConfig())  # shipped = the `tiny` preset, as documented
    assert {k: want[k] for k in meta["sft"]} == meta["sft"]
    # the fields SFTConfig gained after the checkpoint was made default to what made it: from scratch, 512 positions
    assert {k: want[k] for k in set(want) - set(meta["sft"])} == {"init": "", "max_positions": 512}
    assert model.config.max_position_embeddings == want["max_positions"]

def test_engine_logprobs_match_teacher_forcing(shipped):
    model, tok = shipped
    ex = load_synthetic_eval()[:8]
    cs = HFEngine(model, tok).generate([e.prompt for e in ex], 4, SamplingParams(seed=0))
    b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], tok.pad_token_id)
    with torch.no_grad(): lp = completion_logprobs(model, b)
    diff = max((lp[i, :c.n_tokens] - torch.tensor(c.logprobs)).abs().max().item() for i, c in enumerate(cs))
    assert diff < 1e-4, diff
    assert sum(c.finish_reason == "eos" for c in cs) >= 0.9 * len(cs)  # the shipped policy stops by itself

def test_sft_is_reproducible(tmp_path):
    from bppo_kit.sft import train_sft
    c = Config()
    c.sft.steps, c.sft.batch_size, c.sft.hidden_size, c.sft.num_layers, c.sft.intermediate_size = 4, 4, 32, 1, 64
    a, b = train_sft(c, tmp_path / "a", progress=False), train_sft(c, tmp_path / "b", progress=False)
    ma, _ = load_policy(str(a))
    mb, _ = load_policy(str(b))
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))

# MATH as the hub's copies hold it: no `answer`, the gold in the solution's last \boxed{}
HUB_MATH = [{"problem": "What is $1+1$?", "level": "Level 1", "type": "Algebra",
             "solution": "We add: $1+1=\\boxed{2}$."},
            {"problem": "Simplify $\\frac{2}{4}$.", "level": "Level 2", "type": "Prealgebra",
             "solution": "First $\\boxed{4}$ is wrong; it is $\\boxed{\\frac{1}{2}}$."},
            {"problem": "Prove it.", "level": "Level ?", "type": "Geometry", "solution": "No boxed answer here."}]

def fake_hub(monkeypatch, tmp_path, rows=None, fail=None) -> list:
    "No shared data (`$BPPO_SHARED_DATA` an empty folder), and `datasets.load_dataset` answering from memory: its calls"
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("BPPO_SHARED_DATA", str(tmp_path / "none"))
    calls = []
    def load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        if fail: raise fail
        return datasets.Dataset.from_list(rows if rows is not None else HUB_MATH)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls

def test_math_falls_back_to_the_hub_with_one_line(tmp_path, monkeypatch):
    "No local MATH file: one warning line, then the hub's copy, its gold cut from `solution` (no `answer` column)"
    from bppo_kit.data import MATH_TEMPLATE
    calls = fake_hub(monkeypatch, tmp_path)
    with pytest.warns(UserWarning) as caught: ex = load_task("math", "train")
    said = [str(w.message) for w in caught]
    hub = [s for s in said if "Hugging Face hub" in s]
    assert len(hub) == 1 and "\n" not in hub[0] and "math_train_7500.jsonl not found" in hub[0], said
    assert calls == [("DigitalLearningGmbH/MATH-lighteval", "default", "train")]
    assert [e.answer for e in ex] == ["2", "\\frac{1}{2}"]  # the last box; a row with none is dropped, and said
    assert any("dropped 1 rows with an empty answer" in s for s in said), said
    assert ex[0].prompt == MATH_TEMPLATE.format(question="What is $1+1$?") and ex[0].meta["type"] == "Algebra"

def test_hub_sources_per_split(tmp_path, monkeypatch):
    "Each task's split asks the hub for its own data set and the hub's name of that split"
    rows = [{"problem": "p", "question": "q", "answer": "3"}]
    calls = fake_hub(monkeypatch, tmp_path, rows)
    with pytest.warns(UserWarning, match="from the Hugging Face hub"):
        for task, split in (("math", "test"), ("math500", "test"), ("aime24", "test"), ("geo3k", "val"),
                            ("gsm8k", "train")):
            assert [e.answer for e in load_task(task, split)] == ["3"], task
    assert calls == [("HuggingFaceH4/MATH-500", None, "test"), ("HuggingFaceH4/MATH-500", None, "test"),
                     ("HuggingFaceH4/aime_2024", None, "train"), ("hiyouga/geometry3k", None, "validation"),
                     ("openai/gsm8k", "main", "train")]

def test_hub_name_as_data_path(tmp_path, monkeypatch):
    "`data.path` naming a hub data set: the task's own source with its config, any other as it is, no warning"
    calls = fake_hub(monkeypatch, tmp_path)
    assert len(load_task("math", "train", path="DigitalLearningGmbH/MATH-lighteval")) == 2
    assert len(load_task("math", "test", path="someone/math-copy")) == 2
    assert calls == [("DigitalLearningGmbH/MATH-lighteval", "default", "train"), ("someone/math-copy", None, "test")]

def test_no_file_and_no_hub_says_both(tmp_path, monkeypatch):
    "The local file missing and the hub out of reach: one DataError naming the file and the hub's error"
    fake_hub(monkeypatch, tmp_path, fail=ConnectionError("no network"))
    with pytest.warns(UserWarning, match="loading DigitalLearningGmbH/MATH-lighteval"):
        with pytest.raises(DataError) as e: load_task("math", "train")
    msg = str(e.value)
    assert "data file not found" in msg and "math_train_7500.jsonl" in msg and "no network" in msg, msg

def test_a_missing_data_path_is_never_downloaded(tmp_path, monkeypatch):
    "An explicit file that is not there stays an error: a typo is never replaced by the hub's copy"
    calls = fake_hub(monkeypatch, tmp_path)
    with pytest.raises(DataError, match="data file not found"): load_task("math", path=tmp_path / "typo.jsonl")
    assert calls == []

@needs_shared
def test_math_gold_from_the_solution_is_the_shared_answer():
    "On all 12,500 MATH rows of the shared files, the gold cut from `solution` equals the file's `answer`"
    from bppo_kit.data import row_to_example
    n = 0
    for name in ("math_train_7500", "math500_test", "math_test_4500_excl_math500"):
        for r in read_jsonl(shared_data_dir() / "math" / f"{name}.jsonl"):
            bare = {k: v for k, v in r.items() if k != "answer"}
            assert row_to_example(bare, "math").answer == row_to_example(r, "math").answer, r["unique_id"]
            n += 1
    assert n == 12500
