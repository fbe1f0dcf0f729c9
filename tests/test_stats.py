"""The comparison statistics (bppo_kit.stats) against SciPy and statsmodels on hand-made values, and the verdicts a
design of 3 and of 30 seeds reaches on the same synthetic effect."""
import math, statistics
import numpy as np
import pytest
from scipy import stats as sps
from bppo_kit.stats import (contrast_table, eval_noise, holm, mde, paired, plateau, plateau_over_seeds, power,
                             summarize, t_interval, tost, verdict)

sm_multi = pytest.importorskip("statsmodels.stats.multitest")
sm_weight = pytest.importorskip("statsmodels.stats.weightstats")
sm_power = pytest.importorskip("statsmodels.stats.power")

A = [71.2, 68.4, 73.9, 70.0, 66.5]
B = [72.0, 70.1, 73.5, 72.4, 67.0]


def test_summary_is_the_sample_sd_and_the_t_interval():
    s = summarize(A, seeds=[100, 101, 102, 103, 104])
    assert s["seeds"] == [100, 101, 102, 103, 104] and s["values"] == A and s["n"] == 5
    assert s["mean"] == pytest.approx(statistics.fmean(A), abs=1e-12)
    assert s["sd"] == pytest.approx(statistics.stdev(A), abs=1e-12)
    assert s["sd"] != pytest.approx(statistics.pstdev(A))  # the sample SD, not the population one
    lo, hi = sps.t.interval(0.95, 4, loc=s["mean"], scale=s["sd"] / math.sqrt(5))
    assert s["ci95"] == pytest.approx([lo, hi], abs=1e-9)
    want = sps.t.interval(0.9, 2, scale=1 / 3 ** .5)
    assert t_interval(0.0, 1.0, 3, level=0.9) == pytest.approx(list(want), abs=1e-9)


def test_paired_test_is_scipys():
    c = paired(dict(enumerate(A)), dict(enumerate(B)))
    r = sps.ttest_rel(B, A)
    assert c["p"] == pytest.approx(r.pvalue, abs=1e-9) and c["n"] == 5
    ci = r.confidence_interval(0.95)
    assert c["ci95"] == pytest.approx([ci.low, ci.high], abs=1e-9)
    assert c["diff"] == pytest.approx(statistics.fmean(b - a for a, b in zip(A, B)), abs=1e-12)


@pytest.mark.parametrize("ps", [[0.01, 0.04, 0.03, 0.5], [0.2, 0.2, 0.001], [0.049], [0.3, 0.01, 0.02, 0.04, 0.9]])
def test_holm_is_statsmodels(ps):
    want = sm_multi.multipletests(ps, alpha=0.05, method="holm")[1]
    assert holm(ps) == pytest.approx(list(want), abs=1e-9)


def test_holm_on_tost_p_values_is_statsmodels():
    "Issue 55: the equivalence tests are a family too; Holm over TOST p-values (hand-made diffs) is statsmodels'"
    diffs = [[0.1, -0.2, 0.3, 0.0], [0.5, -1.5, 1.0], [1.2, -0.6, -0.4], [0.2, 0.25, 0.15, 0.3, 0.1]]
    ps = [tost(d, 2.0) for d in diffs] + [0.012, 0.3]
    want = sm_multi.multipletests(ps, alpha=0.05, method="holm")[1]
    assert holm(ps) == pytest.approx(list(want), abs=1e-12)
    base = {s: 70.0 + 2 * s for s in range(4)}
    diffs = dict(a=[0.3, -0.2, 0.1, 0.4], b=[0.5, -0.3, 0.2, 0.6], c=[0.2, 0.9, -0.5, 0.4], d=[1.5, -1.0, 2.0, 0.5])
    arms = {"base": base} | {n: {s: base[s] + x for s, x in enumerate(d)} for n, d in diffs.items()}
    t = contrast_table(arms, "base", margin=1.0)
    raw = [c["p_tost"] for c in t.values()]
    want = sm_multi.multipletests(raw, alpha=0.05, method="holm")[1]
    assert [c["p_tost_holm"] for c in t.values()] == pytest.approx(list(want), abs=1e-12)
    # the verdict reads the adjusted p: an arm equivalent on its own p alone is not, after Holm
    assert {n: c["verdict"] for n, c in t.items()} == dict(a="equivalent", b="inconclusive", c="inconclusive",
                                                            d="inconclusive")
    assert all(t[n]["p_tost"] < 0.05 <= t[n]["p_tost_holm"] for n in "bc")  # equivalent on their own p alone


@pytest.mark.parametrize("margin", [0.5, 2.0, 5.0])
def test_tost_is_statsmodels(margin):
    p, _, _ = sm_weight.ttost_paired(np.array(B), np.array(A), -margin, margin)
    d = [b - a for a, b in zip(A, B)]
    assert tost(d, margin) == pytest.approx(p, abs=1e-9)


@pytest.mark.parametrize("n,sd", [(3, 2.3), (5, 1.0), (15, 4.0), (30, 0.7)])
def test_mde_has_statsmodels_power_of_80_percent(n, sd):
    x = mde(sd, n)
    got = sm_power.TTestPower().power(effect_size=x / sd, nobs=n, alpha=0.05, alternative="two-sided")
    assert got == pytest.approx(0.8, abs=1e-9)
    assert power(x, sd, n) == pytest.approx(0.8, abs=1e-9)
    effect = sm_power.TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    assert x / sd == pytest.approx(effect, rel=1e-6)  # statsmodels' own root, to its solver's tolerance


def test_eval_noise_is_the_binomial_sd():
    assert eval_noise(0.65, 60) == pytest.approx(math.sqrt(0.65 * 0.35 / 60), abs=1e-12)


def _arms(n: int, effect: float, sd: float) -> dict:
    "Two arms over `n` seeds whose paired differences have exactly mean `effect` and sample SD `sd`"
    z = [i - (n - 1) / 2 for i in range(n)]
    z = [x / statistics.stdev(z) for x in z]
    base = {s: 70.0 + 3 * math.sin(s) for s in range(n)}  # each seed's own level, shared by both arms
    return {"base": base, "arm": {s: base[s] + effect + sd * z[s] for s in range(n)}}


@pytest.mark.parametrize("effect,decided", [(0.0, "equivalent"), (0.5, "equivalent"), (3.0, "better"),
                                            (-3.0, "worse")])
def test_same_effect_inconclusive_at_3_seeds_decided_at_30(effect, decided):
    "The same observed effect and spread (paired SD 2 points): 3 seeds cannot decide, 30 can"
    few = contrast_table(_arms(3, effect, 2.0), "base", margin=2.0)["arm"]
    many = contrast_table(_arms(30, effect, 2.0), "base", margin=2.0)["arm"]
    assert few["diff"] == pytest.approx(effect) and few["sd"] == pytest.approx(2.0)
    assert many["diff"] == pytest.approx(effect) and many["sd"] == pytest.approx(2.0)
    assert few["verdict"] == "inconclusive", few
    assert many["verdict"] == decided, many
    assert many["mde80"] < few["mde80"]


def test_holm_makes_a_verdict_harder_with_more_arms():
    "Five arms, one of which differs: its p alone would pass, Holm's over five does not"
    c = {"base": {s: 0.0 for s in range(4)}, "x": {0: 1.0, 1: 1.4, 2: 0.4, 3: 1.2}}
    c |= {f"n{i}": {s: (s % 2 - 0.5) * (i + 1) for s in range(4)} for i in range(4)}
    t = contrast_table(c, "base")
    assert t["x"]["p"] < 0.05 <= t["x"]["p_holm"] and t["x"]["verdict"] == "inconclusive"
    assert verdict(1.0, t["x"]["p"], None) == "better"


def test_no_spread_no_verdict():
    "Identical differences on every seed (a coarse evaluation makes them): no p-value, no equivalence, inconclusive"
    c = contrast_table({"base": {0: .5, 1: .25}, "arm": {0: .53125, 1: .28125}}, "base", margin=0.02)["arm"]
    assert c["sd"] == pytest.approx(0, abs=1e-15) and c["p"] is None and c["p_tost"] is None
    assert c["verdict"] == "inconclusive"


def test_a_missing_seed_makes_it_inconclusive():
    "An arm that has no value on a seed the baseline has (never reached the target there) is not judged"
    arms = {"base": {0: .90, 1: .95, 2: .92}, "arm": {0: .50, 1: .60}}
    c = contrast_table(arms, "base")["arm"]
    assert c["p"] < 0.05 and c["missing"] == [2] and c["verdict"] == "inconclusive"


STEPS = (0.0, 100.0, 200.0, 300.0, 400.0)


def test_plateau_of_one_run():
    "The gain over the last quarter of a run's cost: final accuracy less the accuracy at 3/4 of it, interpolated"
    rising = [(x, 0.5 + x / 1000) for x in STEPS]
    r = plateau(rising, margin=0.01)
    assert r["at"] == 300.0 and r["gain"] == pytest.approx(0.1) and not r["plateaued"]
    flat = plateau(list(zip(STEPS, (0.5, 0.7, 0.71, 0.71, 0.71))), margin=0.01)
    assert flat["gain"] == pytest.approx(0.0) and flat["plateaued"]
    # between evaluations: 3/4 of 130 is 97.5, 7.5 of the 40 from 90 (0.6) to 130 (0.75)
    assert plateau([(0.0, 0.5), (90.0, 0.6), (130.0, 0.75)], 0.01)["before"] == pytest.approx(0.6 + 0.15 * 7.5 / 40)
    assert plateau(rising, margin=0.2)["plateaued"]  # a gain of 10 points is below a margin of 20
    with pytest.raises(ValueError, match="share"): plateau(rising, 0.01, share=1.0)


def test_plateau_over_seeds_on_synthetic_curves():
    "Flat curves plateau, rising ones rise, and 2 seeds that disagree (-1 and +3 points) cannot tell"
    rng = np.random.default_rng(0)
    flat = [[(x, min(0.7, 0.5 + x / 500) + rng.normal(0, 0.002)) for x in STEPS] for _ in range(5)]
    ramps = [[(x, 0.5 + k * x / 1000 + rng.normal(0, 0.005)) for x in STEPS] for k in (0.8, 1.0, 1.2)]
    noisy = [[(x, min(0.7, 0.5 + x / 500)) for x in STEPS[:-1]] + [(400.0, 0.7 + e)] for e in (-0.01, 0.03)]
    got = {k: plateau_over_seeds(c, margin=0.01) for k, c in dict(flat=flat, rising=ramps, noisy=noisy).items()}
    assert {k: g["verdict"] for k, g in got.items()} == dict(flat="plateaued", rising="rising", noisy="unclear")
    assert got["noisy"]["n"] == 2 and got["noisy"]["mean"] == pytest.approx(0.01)
    lo, hi = got["noisy"]["ci95"]
    assert lo < 0.01 < hi and got["flat"]["ci95"][1] < 0.01 < got["rising"]["ci95"][0]
    assert plateau_over_seeds(ramps[:1], 0.01)["verdict"] == "unclear"  # one seed: no interval
    # the rule is the interval, not the mean: the same mean gain with a tighter spread decides
    tight = [[(x, min(0.7, 0.5 + x / 500)) for x in STEPS[:-1]] + [(400.0, 0.7 + e)] for e in (0.009, 0.011) * 3]
    assert plateau_over_seeds(tight, 0.02)["verdict"] == "plateaued" and plateau_over_seeds(tight, 0.0)["verdict"] == \
        "rising"
