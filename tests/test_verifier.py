"The minimal verifier: every GSM8K reference judged correct, hostile inputs handled fast, `score` never raises."
import time
import pytest
from hypothesis import given, settings, strategies as st
from bppo_kit.verifier import Score, reward_fn, score

HOSTILE = ["__import__('os').system('echo pwned')", "\\boxed{10^{10^{10^{10}}}}", "(" * 10_000 + ")" * 10_000,
           "1" * 2_000_000, "", "\x00\x01\x1b[31m\u202e#### 7", "#### " + "9" * 5000, "\\boxed{" * 5000]

@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_inputs_are_fast_and_safe(text):
    t = time.perf_counter()
    s = score(text, "7", "auto")
    assert isinstance(s, Score) and time.perf_counter() - t < 3.0

def test_reward_fn_lengths_must_match():
    with pytest.raises(ValueError, match="2 completions but 1 answers"): reward_fn(["a", "b"], ["1"])

@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=30), st.sampled_from(["auto", "synthetic", "gsm8k", "math"]))
def test_score_never_raises(completion, gold, task):
    s = score(completion, gold, task)
    assert isinstance(s.correct, bool) and isinstance(s.reward, float)

@settings(max_examples=200, deadline=None)
@given(st.integers(-10**6, 10**6))
def test_integers_round_trip(n):
    assert score(f" some work. #### {n}", str(n), "synthetic").correct
    assert score(f"#### {n:,}", str(n), "gsm8k").correct
    assert not score(f"#### {n + 1}", str(n), "synthetic").correct
