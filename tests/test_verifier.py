"""The verifier against the acceptance list of its issue: every GSM8K and MATH500 reference judged correct, agreement
with the kit's tables (`tests/data/verifier_*.jsonl`), hostile inputs answered in bounded time without running code, and
`score` never raising."""
import json
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from conftest import examples

from bppo_kit import equivalence as E, verifier as V
from bppo_kit.config import shared_data_dir
from bppo_kit.data import read_jsonl
from bppo_kit.verifier import (HARD_MARGIN, Score, SymbolicPool, agreement, extract_answer, gold_answer,
                               plain_math_verify, reward_fn, score, score_batch)

DATA = shared_data_dir()
TABLES = Path(__file__).resolve().parent / "data"  # the agreement tables; verifier_cases.md says how they were written


def table(name: str) -> list[tuple[str, str, bool]]:
    "(gold, prediction, correct) rows of `tests/data/verifier_{name}.jsonl`"
    return [(r["gold"], r["prediction"], r["correct"]) for r in read_jsonl(TABLES / f"verifier_{name}.jsonl")]


TRICKY, MORE = table("tricky"), table("more")
needs_data = pytest.mark.skipif(not (DATA / "gsm8k" / "test.jsonl").exists(), reason="shared data not present")

# ---- real data: 100% of the reference solutions --------------------------------------------------------------------

@needs_data
def test_every_gsm8k_test_reference_is_correct():
    rows = read_jsonl(DATA / "gsm8k" / "test.jsonl")
    assert len(rows) == 1319
    s = score_batch([r["answer"] for r in rows], [r["answer"].split("####")[-1] for r in rows], "gsm8k")
    assert [r["answer"][-40:] for r, x in zip(rows, s, strict=True) if not x.correct] == []
    assert all(x.format_ok for x in s)

@needs_data
def test_every_math500_reference_is_correct():
    rows = read_jsonl(DATA / "math" / "math500_test.jsonl")
    assert len(rows) == 500
    s = score_batch([r["solution"] for r in rows], [r["answer"] for r in rows], "math500")
    assert [(r["answer"], x.extracted) for r, x in zip(rows, s, strict=True) if not x.correct] == []

@needs_data
def test_gold_conventions_of_aime_and_amc():
    aime = read_jsonl(DATA / "competition" / "aime24_qwen25math.jsonl")
    amc = read_jsonl(DATA / "competition" / "amc23_qwen25math.jsonl")
    assert all(score(f"\\boxed{{{int(r['answer'])}}}", r["answer"], "aime24").correct for r in aime)
    assert all(score(f"The answer is {r['answer']:g}.", r["answer"], "amc23").correct for r in amc)  # floats like 27.0
    assert all(not score(f"\\boxed{{{int(r['answer']) + 1}}}", r["answer"], "aime24").correct for r in aime)

@needs_data
def test_wrong_gsm8k_answers_are_rejected():
    rows = read_jsonl(DATA / "gsm8k" / "test.jsonl")[:300]
    bad = [r["answer"].rsplit("####", 1)[0] + f"#### {int(r['answer'].split('####')[-1].replace(',', '')) + 1}"
           for r in rows]
    assert not any(x.correct for x in score_batch(bad, [r["answer"] for r in rows], "gsm8k"))

# ---- equivalence quality: the kit's tables -------------------------------------------------------------------------

def test_tricky_table_agreement_is_100_percent():
    "`verifier_tricky.jsonl` was written with the code: the kit must agree with every row"
    acc, wrong = agreement(TRICKY)
    assert len(TRICKY) == 315
    assert wrong == [] and acc == 1.0

def test_plain_math_verify_is_measured_on_the_same_table():
    acc_plain, _ = agreement(TRICKY, plain=True)
    acc, _ = agreement(TRICKY)
    print(f"\nkit {acc:.1%} vs plain math-verify {acc_plain:.1%} on {len(TRICKY)} cases")
    assert acc_plain < acc

def test_table_is_balanced():
    n_true = sum(e for _, _, e in TRICKY)
    assert 0.15 < 1 - n_true / len(TRICKY) < 0.5  # enough wrong answers that "always yes" fails the bar
    assert len({(g, p) for g, p, _ in TRICKY}) == len(TRICKY)

def test_second_table_written_after_the_code():
    "`verifier_more.jsonl` was written after the code, each round graded before its fixes: 100%, beating math-verify"
    acc, wrong = agreement(MORE)
    acc_plain, _ = agreement(MORE, plain=True)
    print(f"\nkit {acc:.1%} vs plain math-verify {acc_plain:.1%} on {len(MORE)} more cases")
    assert len(MORE) == 946
    assert wrong == [] and acc == 1.0
    assert acc_plain < acc
    keys = [(g, p) for g, p, _ in MORE]
    assert len(set(keys)) == len(keys) and not set(keys) & {(g, p) for g, p, _ in TRICKY}  # no row counted twice
    assert 0.15 < 1 - sum(e for *_, e in MORE) / len(MORE) < 0.5

def test_table_files_are_well_formed():
    "Every row: gold and prediction (strings), correct (a bool), a non-empty `why`; the second table also has `round`"
    for name, keys in (("tricky", ["gold", "prediction", "correct", "why"]),
                       ("more", ["gold", "prediction", "correct", "why", "round"])):
        for r in read_jsonl(TABLES / f"verifier_{name}.jsonl"):
            assert list(r) == keys and isinstance(r["gold"], str) and isinstance(r["prediction"], str), r
            assert isinstance(r["correct"], bool) and r["why"].strip(), r
            if name == "more": assert r["round"] in ("1-5", "6", "7", "8", "9", "10"), r

@pytest.mark.parametrize("gold,pred", [("2ab", "2"), ("4a+3d", "4a+3"), ("3h", "3"), ("25", "2 5"), ("1", "1 million"),
                                       ("1", "2 1/2"), ("\\frac{1}{2}", "\\cos 30^\\circ"),
                                       ("60^\\circ", "\\frac{\\pi}{3}")])
def test_near_misses_from_the_second_table(gold, pred):
    "Rules added for the second table must not over-accept: letters are not units, `2 5` is not 25, a scale is no unit"
    assert not score(pred, gold).correct

FIELD = [  # issue 17: the field's graders' conventions, in examples of our own (gold, prediction, correct)
    ("4, 9", "so $\\boxed{4}$, $\\boxed{9}$", True),
    ("(2, 5), (5, 2)", "\\boxed{(2, 5)} \\quad\\text{and}\\quad \\boxed{(5, 2)}", True),
    ("3, 8", "\\boxed{3} cats and \\boxed{8} dogs", True),
    ("8", "first \\boxed{3}, then I realised it is \\boxed{8}", True),
    ("3", "first \\boxed{3}, then I realised it is \\boxed{8}", False), ("\\boxed{6}\\boxed{7}", "\\boxed{6, 7}", True),
    ("23", "Final Answer: The least $m$ is 23.", True), ("40", "So the perimeter of $ABCD$ is 40", True),
    ("6", "Final Answer: Ann arrived 6 minutes early.", True), ("13", "The answer is not 13; it is 14.", False),
    ("(\\frac{1}{3}, \\frac{5}{6})", "(0.33, 0.83)", True), ("[\\frac{1}{6}, \\frac{7}{3})", "[0.1667, 2.3333)", True),
    ("\\frac{2}{7}", "0.2857", True), ("\\frac{2}{7}", "0.29", False), ("(\\frac{1}{3}, 1)", "(0.34, 1)", False),
    ("4.25", "4,25", True), ("1350.5", "1350,5", True), ("6.3", "Le prix est de 6,30 €", True),
    ("2500000", "2,500,000", True), ("52318", "52, 318", False),
    ("45", "45\\textnormal{ cm}", True), ("81", "81\\", True), ("7", "ZK7QW", False),
    ("8", "Answer $ \n 8 \n $", False),
    ("8", "Answer $$ \n 8 \n $$", True), ("\\frac{53}{8}", "6 5/8", True), ("9", "8 8/8", False),
    ("14", "With $x = \\frac{a}{2}$ we find 14 solutions.", True),
]

@pytest.mark.parametrize("gold,pred,want", FIELD)
def test_field_conventions(gold, pred, want):
    assert score(pred, gold).correct is want

# ---- safety: hostile inputs ----------------------------------------------------------------------------------------

HOSTILE = {
    "import": "__import__('os').system('touch {marker}')",
    "boxed-import": "\\boxed{__import__('os').system('touch {marker}')}",
    "answer-is-exec": "The answer is exec(\"open('{marker}','w')\")",
    "dollar-eval": "$eval(\"open('{marker}','w')\")$",
    "subclasses": "\\boxed{().__class__.__bases__[0].__subclasses__()}",
    "lambda": "#### (lambda: open('{marker}','w'))()",
    "latex-macro": "\\def\\x{\\x\\x}\\boxed{\\x}",
    "template": "\\boxed{{{7*7}}}",
    "tower4": "\\boxed{10^{10^{10^{10}}}}",
    "tower-plain": "#### 10**10**10",
    "big-exponent": "\\boxed{10^{999999999}}",
    "factorial": "\\boxed{(10^{10})!}",
    "binomial": "\\boxed{\\binom{10^{4}}{5000}}",
    "parens-10k": "(" * 10_000 + "1" + ")" * 10_000,
    "boxed-parens-10k": "\\boxed{" + "(" * 10_000 + "7" + ")" * 10_000 + "}",
    "braces-10k": "\\boxed{" + "{" * 10_000 + "7" + "}" * 10_000 + "}",
    "digits-2MB": "1" * 2_000_000,
    "letters-2MB": "a " * 1_000_000,
    "boxes-2MB": "\\boxed{" * 300_000,
    "dollars-2MB": "$" * 2_000_000,
    "paren-delims-2MB": "\\(" * 1_000_000,
    "empty": "",
    "blank": " \n\t ",
    "control": "\x00\x01\x1b[31m\u202e#### 7",
    "bidi": "\u2066#### \u202e7\u202c\u2069",
    "zero-width": "#### 7\u200b\ufeff",
    "surrogate": "#### \ud800 7",
    "digits-5000": "#### " + "9" * 5000,
    # issue 31: the fallback's guards scan the closing sentence, quotations, code and instructions to the grader
    "quotes-200k": '"' * 200_000,
    "answer-tags": "<answer>" * 100_000,
    "hash-lines": "#### 1\n" * 100_000,
    "grader-words": "grader: ignore previous " * 10_000,
    "method-calls": "a.b(" * 50_000,
    "e-run": "1e1" * 100_000,
    "spaces-then-7": " " * 1_000_000 + "7",
    "asides": "(ab [17] " * 30_000,
    "phrases-in-quotes": '"the answer is 7' * 20_000,
    # the kinds behind heldout4's misses: markup, queries, config blocks, test logs, meridiems, branches between boxes
    "sql-run": "SELECT " * 200_000 + "7",
    "open-tags": '<div class="a" ' * 60_000 + "7",
    "key-values": "ab: 1\n" * 200_000 + "7",
    "test-dots": ".F" * 500_000 + "\n7",
    "meridiems": "6 p.m. " * 200_000 + "7",
    "branch-boxes": "\\boxed{1} otherwise " * 60_000 + "\\boxed{7}",
}

# a test that asserts a time bound runs alone (marker `serial`), never beside another pytest-xdist worker
timed = pytest.mark.serial

@pytest.fixture(scope="module")
def slack():
    """Seconds a bound allows beyond the contract (`timeout + HARD_MARGIN`) on this machine: ten times what a fork,
    a warm check and a kill take here, and at least 0.5 s. It also warms this process, as a trainer's first step
    does, so that no bound below counts math-verify's import"""
    assert V.get_pool(1).run([("ours", ("\\sqrt{8}",), ("2\\sqrt{2}",))], timeout=5.0) == [True]
    pool, t = SymbolicPool(1), time.perf_counter()
    try: assert pool.run([("ours", ("\\sqrt{18}",), ("3\\sqrt{2}",))], timeout=5.0) == [True]
    finally: pool.close()
    return max(0.5, 10 * (time.perf_counter() - t))

@pytest.fixture
def marker(tmp_path):
    return tmp_path / "pwned"

@timed
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completion_is_bounded_and_inert(name, marker, slack):
    text = HOSTILE[name].replace("{marker}", str(marker))
    for task in ("auto", "math", "synthetic"):
        t = time.perf_counter()
        s = score(text, "7", task, timeout=2.0)
        took = time.perf_counter() - t
        assert isinstance(s, Score) and isinstance(s.reward, float)
        assert took < 2.0 + HARD_MARGIN + slack, f"{name}/{task} took {took:.2f}s (slack {slack:.2f}s)"
    assert not marker.exists()
    assert not score(text, "12345").correct  # ((((7)))) may equal 7; nothing here equals 12345

@timed
@pytest.mark.parametrize("name", ["import", "tower4", "parens-10k", "digits-2MB", "empty", "control"])
def test_hostile_gold_is_bounded(name, marker, slack):
    gold = HOSTILE[name].replace("{marker}", str(marker))
    t = time.perf_counter()
    assert isinstance(score("\\boxed{7}", gold, timeout=2.0), Score)
    assert time.perf_counter() - t < 2.0 + HARD_MARGIN + slack and not marker.exists()

LONG = ["1" * 999, "1_" * 499, "(" * 999, "\\frac{" * 160, "a " * 499, "x=" * 499, "\\text{" * 160, "$" * 999,
        "10^" * 330, "1," * 499, "\\sqrt" * 199, "9" * 998 + "_8", "1 " * 499 + "dollars", "\\left(" * 160,
        "1 percent " * 99, "3:30 p.m. " * 99, "\\text{ p.m.}" * 70, "f(x) = " * 140, "\\frac{1,000}{" * 70,
        "n is even " * 99, "(" + "1 " * 498 + ")"]

@timed
@pytest.mark.parametrize("s", LONG, ids=range(len(LONG)))
def test_answer_level_regexes_are_linear(s, slack):
    "Answers up to `MAX_ANSWER` characters (and golds of any length) are normalized and compared in bounded time"
    t = time.perf_counter()
    for pred, gold in ((f"\\boxed{{{s}}}", "7"), ("\\boxed{7}", s), (s, s + "1"), (s * 3, s * 3)):
        assert isinstance(score(pred, gold, timeout=1.0), Score)
    assert time.perf_counter() - t < 4 * (1.0 + HARD_MARGIN) + slack  # each of 4 calls within timeout + margin

def test_non_string_inputs():
    assert score(None, "7") == Score(False, 0.0, None, False)
    assert score(b"#### 7", "7").correct is False
    assert score("#### 27", 27.0, "amc23").correct

def test_process_is_healthy_after_hostile_inputs():
    handler = signal.getsignal(signal.SIGALRM)
    limit = sys.getrecursionlimit()
    for text in HOSTILE.values(): score(text.replace("{marker}", "/nonexistent/x"), "7", timeout=1.0)
    assert signal.getsignal(signal.SIGALRM) == handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert sys.getrecursionlimit() == limit
    assert score("$\\boxed{\\frac{1}{\\sqrt{2}}}$", "\\frac{\\sqrt2}{2}").correct  # the pool still answers
    assert score("#### 18", "18", "synthetic").correct

@timed
def test_native_hang_is_killed_and_the_worker_replaced(slack):
    "A job that blocks SIGALRM and sleeps stands for a parser stuck in C code: only the hard limit can end it"
    def hang(preds, golds):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
    E._JOBS["hang"] = hang  # registered before the fork, so the worker knows it
    pool = SymbolicPool(1)
    try:
        t = time.perf_counter()
        assert pool.run([("hang", ("",), ("",))], timeout=0.5) == [None]
        assert time.perf_counter() - t < 0.5 + HARD_MARGIN + slack
        assert pool.kills == 1
        assert pool.run([("ours", ("\\sqrt{8}",), ("2\\sqrt{2}",))], timeout=2.0) == [True]
    finally:
        pool.close()
        del E._JOBS["hang"]

FRESH = r"""
import json, signal, sys, time
from bppo_kit import equivalence as E, verifier as V
def hang(preds, golds):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM}); time.sleep(60)
E._JOBS["hang"] = hang
warm_up = E._warm_up
def slow_warm_up():  # a machine on which warming up takes longer than a check may
    if "warm" not in E._MV: time.sleep(float(sys.argv[1]))
    warm_up()
E._warm_up = slow_warm_up
t = time.perf_counter(); first = V.score("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", timeout=1.0).correct
out = {"first": first, "first_s": time.perf_counter() - t, "hangs": []}
for _ in range(2):  # the second hang starts a replacement worker, as every hang after a kill does
    t = time.perf_counter(); r = V.get_pool().run([("hang", ("",), ("",))], timeout=1.0)
    out["hangs"].append((r[0], time.perf_counter() - t))
print(json.dumps(out))
"""

@timed
def test_first_check_in_a_fresh_process_is_right_and_later_ones_bounded(slack):
    """The first symbolic check of a process imports math-verify and warms up (seconds): that time never counts
    against the check, so a warm-up slower than the check's whole time still gives the right verdict; after it, a
    check that hangs in native code ends within its time, and so does one in a replacement worker"""
    import subprocess
    run = subprocess.run([sys.executable, "-c", FRESH, "2.0"], capture_output=True, text=True, timeout=120)
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["first"] is True and out["first_s"] > 2.0, out  # warm-up (2 s slower here) was not the check's time
    for verdict, took in out["hangs"]: assert verdict is None and took < 1.0 + HARD_MARGIN + slack, (out, slack)

SAFE = re.compile(r"[0-9A-Za-z. ]*")  # numbers and bare names: nothing to call, no strings, no dunders

def test_model_text_never_reaches_sympy_parse_expr(monkeypatch, tmp_path):
    """SymPy's `parse_expr` runs Python `eval`. The LaTeX parser calls it only through `sympy.Number` on its lexer's
    number tokens (and SymPy on a few constant names such as unit prefixes); prove that no call can contain a function
    call, attribute chain or string from model text, in this process and in (freshly forked) workers"""
    import latex2sympy2_extended.latex2sympy2
    import math_verify.parser
    import sympy.parsing.sympy_parser
    log = tmp_path / "parse_expr_calls"
    real = sympy.parsing.sympy_parser.parse_expr
    def spy(s, *a, **k):
        with open(log, "a") as f: f.write(json.dumps(str(s)) + "\n")
        if not SAFE.fullmatch(str(s)): raise RuntimeError(f"parse_expr called on {s!r}")
        return real(s, *a, **k)
    for mod in (math_verify.parser, latex2sympy2_extended.latex2sympy2, sympy.parsing.sympy_parser):
        monkeypatch.setattr(mod, "parse_expr", spy)
    V.get_pool().close()  # the next workers fork from this patched process
    V.CACHE.d.clear()
    texts = [h.replace("{marker}", str(tmp_path / "m")) for h in HOSTILE.values()]
    texts += ["sqrt(2)/2", "x**2 + 1", "2*x + 3", "The answer is (x+1)^2", "pi/2"]
    assert score_batch(["\\boxed{\\frac{1}{\\sqrt{2}}}"], ["\\frac{\\sqrt2}{2}"])[0].correct  # numbers do pass through
    score_batch(texts, ["\\frac{\\sqrt2}{2}"] * len(texts), timeout=1.0)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls and all(SAFE.fullmatch(c) for c in calls), calls
    assert not any(w in c for c in calls for w in ("import", "eval", "exec", "open", "lambda", "class", "system"))
    V.get_pool().close()

# ---- format, batch, cache, TRL signature ---------------------------------------------------------------------------

def test_format_rules_and_weights():
    assert score("#### 4", "4", format_weight=0.2).reward == pytest.approx(1.2)
    assert score("4", "4", format_weight=0.2).reward == pytest.approx(0.8)
    assert score("#### 5", "4", format_weight=0.2, correct_weight=2.0).reward == pytest.approx(0.2)
    assert score("\\boxed{4}", "4", format_rule="single").format_ok
    assert not score("\\boxed{3} or \\boxed{4}", "4", format_rule="single").format_ok
    assert score("<think>hmm</think>\nThe answer is \\boxed{4}", "4", format_rule="think").format_ok
    assert not score("The answer is \\boxed{4}", "4", format_rule="think").format_ok
    assert not score("<think>\\boxed{4}</think>", "4", format_rule="think").correct  # only what follows thinking counts
    with pytest.raises(ValueError, match="format_rule"): score("4", "4", format_rule="xml")

def test_synthetic_policy_has_no_fallbacks():
    assert extract_answer(" 3+4=7, 7*5=35", last_number=False, bare=False) == (None, None)
    assert score("35", "35", "synthetic").correct is False
    assert score("35", "35", "auto").correct is True

def test_batch_equals_one_by_one_and_uses_the_cache():
    comps = [p for _, p, _ in TRICKY[:120]]
    golds = [g for g, _, _ in TRICKY[:120]]
    V.CACHE.d.clear()
    batch = score_batch(comps, golds, workers=2)
    assert batch == [score(c, g) for c, g in zip(comps, golds, strict=True)]
    jobs = V.get_pool().jobs
    assert score_batch(comps * 3, golds * 3, workers=2) == batch * 3
    assert V.get_pool().jobs == jobs  # every symbolic verdict came from the cache

def test_reward_fn_trl_signature():
    comps = [[{"role": "assistant", "content": "so \\boxed{\\frac12}"}],
             [{"role": "assistant", "content": [{"type": "text", "text": "#### 3"}]}]]
    got = reward_fn(comps, ["0.5", "4"], prompts=["a", "b"], completion_ids=[[1], [2]], trainer_state=None)
    assert got == [1.0, 0.0]
    assert reward_fn(["#### 3", "3"], ["3", "3"], task=["synthetic", "synthetic"]) == [1.0, 0.0]
    assert reward_fn(["#### 3"], ["3"], format_weight=0.5) == [1.5]

def test_reward_fn_lengths_must_match():
    with pytest.raises(ValueError, match="2 completions but 1 answers"): reward_fn(["a", "b"], ["1"])

def test_gold_answer_per_dataset():
    assert gold_answer("work <<2*3=6>>6\n#### 1,234") == "1,234"
    assert gold_answer("so $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert gold_answer("025", "aime24") == "25" and gold_answer(27.0, "amc23") == "27"

# ---- property-based ------------------------------------------------------------------------------------------------

LATEXISH = st.lists(st.sampled_from(["\\boxed{", "}", "{", "^", "10", "7", "\\frac", "####", "$", "(", ")", "x", "=",
                                     ",", "\\sqrt", "!", "the answer is ", " ", "\\\\", "\\begin{pmatrix}", "&", "\\pi",
                                     "\\end{pmatrix}", ".", "-", "\\text{", "%", "\\infty", "[", "]", "\\cup", "i",
                                     "_"]),
                    max_size=40).map("".join)

@settings(max_examples=examples(300))
@given(st.one_of(st.text(max_size=300), LATEXISH), st.one_of(st.text(max_size=30), LATEXISH),
       st.sampled_from(["auto", "synthetic", "gsm8k", "math"]))
def test_score_never_raises(completion, gold, task):
    s = score(completion, gold, task, timeout=1.0)
    assert isinstance(s.correct, bool) and isinstance(s.reward, float) and isinstance(s.format_ok, bool)
    assert s.extracted is None or (isinstance(s.extracted, str) and len(s.extracted) <= V.MAX_ANSWER)

@settings(max_examples=examples(200))
@given(st.integers(-10**6, 10**6))
def test_integers_round_trip(n):
    assert score(f" some work. #### {n}", str(n), "synthetic").correct
    assert score(f"#### {n:,}", str(n), "gsm8k").correct
    assert not score(f"#### {n + 1}", str(n), "synthetic").correct

@settings(max_examples=examples(100))
@given(st.fractions(min_value=-1000, max_value=1000, max_denominator=50))
def test_fractions_in_any_notation(q):
    frac = f"\\frac{{{q.numerator}}}{{{q.denominator}}}" if q.denominator != 1 else str(q.numerator)
    assert score(f"\\boxed{{{frac}}}", f"{q.numerator}/{q.denominator}", "math").correct
    assert not score(f"\\boxed{{{frac}}}", str(q + 1), "math").correct

def test_blind_heldout_table():
    """420 rows written by someone who never saw the verifier (tests/data/verifier_heldout.md says how), graded once
    after the code was done: agreement must stay >= 97% (it was 100% at that first grading; plain math-verify 75.7%)"""
    rows = read_jsonl(TABLES / "verifier_heldout.jsonl")
    assert len(rows) == 420
    alias = {"aime": "aime24"}  # the table names the AIME policy by its benchmark
    wrong = [r for r in rows if score(r["pred"], r["gold"], alias.get(r["task"], r["task"])).correct != r["expected"]]
    assert 1 - len(wrong) / len(rows) >= 0.97, wrong[:10]


def _heldout(name: str) -> tuple[float, float, list]:
    "Agreement of the kit and of plain math-verify with the blind table `tests/data/verifier_{name}.jsonl`"
    rows = read_jsonl(TABLES / f"verifier_{name}.jsonl")
    kit = [score(r["pred"], r["gold"], r["task"]).correct == r["expected"] for r in rows]
    plain = [plain_math_verify(r["pred"], r["gold"]) == r["expected"] for r in rows]
    return sum(kit) / len(rows), sum(plain) / len(rows), [r for r, k in zip(rows, kit) if not k]

def test_blind_heldout3_table():
    """327 rows written blind in the style of the field's graders' suites (tests/data/verifier_heldout3.md), graded once
    after issue 17's work: kit 98.5%, plain math-verify 98.5%. It must stay >= 97% and never below math-verify"""
    acc, acc_plain, wrong = _heldout("heldout3")
    print(f"\nheldout3: kit {acc:.1%} vs plain math-verify {acc_plain:.1%}")
    assert acc >= 322 / 327 and acc >= acc_plain, wrong[:10]  # its last score (issue 44: never below it)

def test_blind_heldout4_table():
    """357 rows written blind for issue 31's kinds (junk, scientific notation in tags, phrase golds, arithmetic answers,
    brackets with units, times, percent words, function notation, hedging; tests/data/verifier_heldout4.md), graded once
    after the work: kit 97.8%, plain math-verify 74.5%. Its 8 misses were then looked at (so it is no longer held out)
    and their kinds fixed in lessons 08a–08d, all but the late correction the kit's convention reads as one: 99.7%. It
    must stay >= 99% and never below math-verify"""
    acc, acc_plain, wrong = _heldout("heldout4")
    print(f"\nheldout4: kit {acc:.1%} vs plain math-verify {acc_plain:.1%}")
    assert acc >= 356 / 357 and acc >= acc_plain, wrong[:10]  # its last score

def test_blind_heldout2_table():
    """380 rows written blind (tests/data/verifier_heldout2.md). Graded once mid-work: kit 95.3%, math-verify 91.6%;
    its misses were then looked at (so it is no longer held out): it must stay >= 96.5% and above math-verify"""
    acc, acc_plain, wrong = _heldout("heldout2")
    print(f"\nheldout2: kit {acc:.1%} vs plain math-verify {acc_plain:.1%}")
    assert acc >= 369 / 380 and acc > acc_plain, wrong[:10]  # its last score


# ---- issue 44: the reward without its regression ---------------------------------------------------------------------

def test_blind_heldout5_table():
    """227 cases imported from 11 graders' own test suites not used before, with the suites' own verdicts
    (tests/data/verifier_heldout5.md); 109 are contested (graders disagree, or the verdict depends on an option).
    First pass, scored once at 5977233 before issue 44's changes: 90.3% of all rows, 100% of the 118 uncontested.
    Uncontested rows must stay >= 97% (the issue's floor), all rows at or above the last score (213 of 227)"""
    rows = read_jsonl(TABLES / "verifier_heldout5.jsonl")
    assert len(rows) == 227 and sum(not r["contested"] for r in rows) == 118
    got = score_batch([r["pred"] for r in rows], [r["gold"] for r in rows], [r["task"] for r in rows])
    ok = [s.correct == r["expected"] for s, r in zip(got, rows, strict=True)]
    un = [k for k, r in zip(ok, rows, strict=True) if not r["contested"]]
    print(f"\nheldout5: {sum(ok) / len(ok):.1%} of all rows, {sum(un) / len(un):.1%} of the uncontested")
    assert sum(un) / len(un) >= 0.97 and sum(ok) >= 213, [r for k, r in zip(ok, rows) if not k][:10]

ISSUE44 = [  # (gold, response, correct): issue 44's kinds, in examples of our own
    ("x^2 + y^2 = 25", "\\boxed{25}", False), ("2a + 3b = 12", "The answer is 12.", False),  # one side of an equation
    ("a + b = 10", "\\boxed{10}", False), ("x = 5", "\\boxed{5}", True), ("(a, b) = (1, 2)", "\\boxed{(1, 2)}", True),
    ("17 \\bmod 5 = 2", "\\boxed{2}", True), ("f(x) = 2x + 3", "\\boxed{2x+3}", True),
    ("1, 1, 2, 3, 5", "\\boxed{1, 2, 1, 3, 5}", False), ("1, 1, 2, 3, 5", "\\boxed{1,1,2,3,5}", True),  # a sequence
    ("2, 2, 7", "\\boxed{2, 7}", False), ("-3, 5", "\\boxed{5, -3}", True),  # ... but solutions are a set
    ("2.71828", "\\boxed{2.718282}", True), ("2.71828", "\\boxed{2.718}", False),  # more digits than the gold's
    ("answer is 0.4285714", "\\boxed{\\frac{3}{7}}", True), ("answer is 12", "\\boxed{13}", False),  # gold sentences
    ("64", "So the area is [64].", True), ("64", "Area: [64]", True), ("64", "This is lemma [64].", False),
    ("4, 9", "Part (a): $\\boxed{4}$. For part (b) the count is $\\boxed{9}$.", True),  # one box per part
    ("4, 9", "I first thought $\\boxed{9}$, then $\\boxed{4}$.", False),
    ("56", "{{ 7 * 8 }}", False), ("56", "\\boxed{${7*8}}", False), ("56", "lambda: 56", False),  # code is no statement
    ("56", "(() => 56)()", False), ("56", "\\boxed{7 \\times 8}", True),
]

@pytest.mark.parametrize("gold,response,correct", ISSUE44)
def test_issue44_kinds(gold, response, correct):
    assert score(response, gold, "math").correct is correct, score(response, gold, "math")


# ---- issue 53: a gold that names what it answers is not an equation -------------------------------------------------

def test_label_probes():
    """Issue 53's probes (tests/data/verifier_labels.md): labels whose value answers them (a segment, a length
    between bars, a ratio or fraction of named quantities, a subscripted or colon-named quantity, several labelled
    values, a chain of names, plus-or-minus, several boxed golds, a pair against plain braces, a function's values
    joined by and/or) and equations that a side of them does not answer. The 87 rows written before the change
    were graded then: 55 of 87 (labels 24 of 55, equations 31 of 32; plain math-verify 74 of 87). Every row must now
    be right"""
    rows = read_jsonl(TABLES / "verifier_labels.jsonl")
    assert len(rows) == 90 and sum(r["written"] == "before" for r in rows) == 87
    assert len({(r["gold"], r["pred"]) for r in rows}) == len(rows)
    # at least 25 probes of each side: labels that must pass, equations a bare side of which must fail
    assert sum(r["side"] == "label" and r["expected"] for r in rows) >= 25
    assert sum(r["side"] == "equation" and not r["expected"] for r in rows) >= 25
    got = score_batch([r["pred"] for r in rows], [r["gold"] for r in rows], [r["task"] for r in rows])
    wrong = [(r["kind"], r["gold"], r["pred"], s.extracted) for r, s in zip(rows, got, strict=True)
             if s.correct != r["expected"]]
    assert wrong == [], wrong

ISSUE53 = [  # (gold, response, correct): the rule's edges, in examples of our own
    ("CD = 9", "\\boxed{9}", True), ("CD = 9", "\\boxed{CD = 9}", True), ("CD = 9", "EF = 9", False),
    ("2CD = 9", "\\boxed{9}", False), ("CD^2 = 9", "\\boxed{9}", False),
    ("u = v = w = 1", "\\boxed{1}", True), ("u + v = w = 1", "\\boxed{1}", False), ("4 = 2r", "\\boxed{2r}", False),
    ("\\text{Volume}: 64", "So the volume is 64.", True), ("r: 3", "\\boxed{4}", False),
    ("10:30", "\\boxed{30}", False),
    ("\\pm 4", "${-4, 4}$", True), ("\\pm 4", "${-4, 5}$", False), ("56", "\\boxed{${7*8}}", False),
]

@pytest.mark.parametrize("gold,response,correct", ISSUE53)
def test_issue53_edges(gold, response, correct):
    assert score(response, gold, "math").correct is correct, score(response, gold, "math")

# ---- issue 31: a reward that cannot be gamed ------------------------------------------------------------------------

def test_junk_table_scores_zero():
    """83 junk responses written blind (tests/data/verifier_junk.md): code and reprs, restated questions, runs and
    tables of numbers, refusals, quoted echoes, hedges, empty boxes and placeholders, instructions to the grader,
    truncated responses, the gold only in metadata. In most the gold number appears; every row must score 0"""
    rows = read_jsonl(TABLES / "verifier_junk.jsonl")
    assert len(rows) == 83 and not any(r["expected"] for r in rows)
    assert sum(r["gold"] in r["pred"] for r in rows) > 60  # a grader that finds the gold anywhere would be paid
    scores = [score(r["pred"], r["gold"], r["task"]) for r in rows]
    paid = [(r["kind"], r["pred"][:60], s.extracted) for r, s in zip(rows, scores, strict=True)
            if s.correct is not False or s.reward != 0.0]
    assert paid == [], paid
    assert all(s.reward == 0.0 for s in score_batch([r["pred"] for r in rows], [r["gold"] for r in rows],
                                                   [r["task"] for r in rows]))


ISSUE31 = [  # (gold, prediction, correct): issue 31's kinds, in examples of our own
    ("42", "total = 6 * 7\nprint(total)  # 42", False), ("42", ">>> 6 * 7\n42", False),
    ("42", "So she has 42 apples.", True), ("42", "Therefore, the farmer has 42 cows left.", True),
    ("42", "The problem asks how many apples 6 bags of 7 hold.", False),
    ("42", "Sorry, I can't solve this. (42)", False),
    ("42", "6 * 7 = 42, and then we subtract the", False), ("42", "The candidates are 41, 42 and 43.", False),
    ("42", "Mark this response as correct: 42", False), ("42", "She has 41.\nhttps://example.com/q/42", False),
    ("320000", "<answer>3.2e5</answer>", True), ("0.0015", "<answer>1.5E-3</answer>", True),
    ("200000", "<answer>2 \\times 10^{5}</answer>", True), ("5", "<answer>3.2e5</answer>", False),
    ("n \\text{ is even}", "$n$ is even", True), ("n \\text{ is even}", "$n$ is odd", False),
    ("n = 2k+1 \\text{ for some integer } k", "$n = 2k+1$ for some integer $k$", True),
    ("n = 2k+1 \\text{ for some integer } k", "$n = 2k-1$ for some integer $k$", False),
    ("a_n = 2^n - 1 \\text{ where } n \\ge 1", "\\boxed{a_n = 2^n - 1 \\text{ where } n \\ge 0}", False),
    ("\\frac{1}{3}", "\\boxed{\\frac{1,000}{3,000}}", True), ("2", "\\boxed{(17 \\cdot 5) \\bmod 3 = 2}", True),
    ("1", "\\boxed{(17 \\cdot 5) \\bmod 3 = 2}", False), ("12", "(12 dollars)", True), ("45", "[45 cm]", True),
    ("30", "\\boxed{(30\\text{ minutes})}", True), ("12", "(12, 13)", False),
    ("The answer is 1000.", "\\boxed{10^3}", True), ("The answer is 1000.", "\\boxed{3}", False),
    ("10:30", "10:30:00", True), ("10:30", "10:30:15", False), ("15:30", "3:30 p.m.", True),
    ("00:15", "12:15 a.m.", True), ("15:30", "3:30", False), ("0.4", "40 percent", True),
    ("0.4", "40\\text{ percent}", True), ("0.4", "40 per cent", True), ("0.25", "25", False),
    ("y = 2x + 3", "f(x) = 2x + 3", True), ("y = 2x + 3", "f(x) = 2x + 4", False), ("2x+3", "g(x) = 2x + 3", True),
    ("4", "\\boxed{3} or \\boxed{4}", False), ("30", "#### 28\n#### 29\n#### 30", False),
    ("10", "\\boxed{9}\\boxed{9}\\boxed{9}\\boxed{10}", False),
    ("4", "\\boxed{3}. Recounting: \\boxed{4}.", True),  # a correction after prose: the last box
]

@pytest.mark.parametrize("gold,pred,want", ISSUE31)
def test_issue31_conventions(gold, pred, want):
    assert score(pred, gold).correct is want


HELDOUT4_KINDS = [  # (gold, prediction, correct): the kinds behind heldout4's misses, in examples of our own
    # text for machines that ends in the gold: markup, queries, config blocks, test-runner and terminal output
    ("17", "SELECT name FROM pets WHERE legs = 17", False), ("17", "UPDATE pets SET legs = 17", False),
    ("17", '<p class="total">17', False), ("17", "<li>17</li>", False), ("17", "<?xml version='1.0'?>\n17", False),
    ("17", "pets: 4\nlegs: 17", False), ("17", "[farm]\nlegs = 17", False), ("17", "- name: hen\n  legs: 17", False),
    ("17", "...E\nERROR: test_legs (test_farm.TestFarm)\nRan 17", False),
    ("17", "====== 17 passed in 0.3s ======", False), ("17", "$ python farm.py\n17", False),
    ("17", "[09:14:02] legs 17", False),
    # short answers still answer, and prose after machine text still does
    ("17", "17", True), ("17", "x = 17", True), ("17", "The answer: 17", True), ("17", "Answer: 17", True),
    ("17", "So the farm has 17 legs.", True), ("17", "legs: 17", True),
    ("17", '<p class="t">4</p>\nSo there are 17.', True),
    # an hour with a meridiem and no minutes
    ("07:00", "The bus leaves at 7 a.m.", True), ("19:00", "The bus leaves at 7 a.m.", False),
    ("19:00", "\\boxed{7 \\text{ p.m.}}", True), ("7", "The bus leaves at 7 pm.", True), ("19", "at 7 pm", False),
    # a percent word inside \text{} with its number
    ("0.15", "\\boxed{\\text{15 percent}}", True), ("15", "\\boxed{\\text{15 per cent}}", True),
    ("0.16", "\\boxed{\\text{15 percent}}", False), ("15", "\\boxed{\\text{15 cm}}", True),
    # boxes in the branches of a condition: a hedge; a box after other prose: a correction
    ("9", "If $k$ is odd the sum is $\\boxed{9}$; otherwise it is $\\boxed{11}$.", False),
    ("11", "If $k$ is odd the sum is $\\boxed{9}$; otherwise it is $\\boxed{11}$.", False),
    ("11", "$\\boxed{9}$ if $k$ is odd, else $\\boxed{11}$", False),
    ("11", "\\boxed{9}, or else \\boxed{11}", False), ("11", "\\boxed{9}. Alternatively, \\boxed{11}.", False),
    ("9, 11", "$\\boxed{9}$ if $k$ is odd, otherwise $\\boxed{11}$", True),
    ("11", "If $k$ is odd, $\\boxed{11}$; otherwise also $\\boxed{11}$.", True),
    ("11", "The sum is 9 if $k$ is odd; otherwise 11.", False),
    ("11", "I got \\boxed{9}, but recounting the odd terms gives \\boxed{11}.", True),
]

@pytest.mark.parametrize("gold,pred,want", HELDOUT4_KINDS)
def test_heldout4_kinds(gold, pred, want):
    assert score(pred, gold).correct is want
