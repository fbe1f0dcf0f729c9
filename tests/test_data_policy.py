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
