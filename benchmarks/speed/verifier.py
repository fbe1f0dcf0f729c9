"""Throughput and quality of the kit's verifier (`bppo_kit.verifier`).

    OMP_NUM_THREADS=1 python benchmarks/speed/verifier.py --json runs/bench_verifier.json [--runs 5] [--workers 2]
    # against another checkout (a folder holding its `bppo_kit`, e.g. `git worktree add /tmp/verif-base HEAD`): the two
    # measured alternately, each round in fresh processes, and the ratios of the medians reported
    OMP_NUM_THREADS=1 python benchmarks/speed/verifier.py --baseline /tmp/verif-base --rounds 3 --runs 3 --json r.json

Measures, each as the median of `--runs` timed runs:
- gsm8k_fast: GSM8K-style responses (the 1,319 test reference solutions, and the same with a wrong final answer) scored
  one by one with `score` — the fast path, no worker process involved;
- math_symbolic: MATH-style answers that the fast path cannot decide (equivalent rewrites and wrong variants of the
  non-integer MATH500 answers, plus the symbolic rows of the kit's tricky table), scored with `score_batch` on
  `--workers` processes;
  before each run the workers are replaced (the fork is inside the timing) and all caches are emptied, so every pair is
  a real math-verify check with nothing remembered from earlier runs;
- math500_mixed: the 500 MATH500 reference solutions plus 500 wrong ones, as a trainer would see them;
and the agreement of the kit and of plain math-verify with the kit's two tables (`tests/data/verifier_tricky.jsonl`,
`tests/data/verifier_more.jsonl`).
Writes a JSON result and prints a table.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bppo_kit import equivalence as E, verifier as V
from bppo_kit.config import shared_data_dir
from bppo_kit.data import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TABLES = REPO / "tests" / "data"
PATHS = ("gsm8k_fast", "math_symbolic", "math500_mixed")


def table(name: str) -> list[tuple[str, str, bool]]:
    "(gold, prediction, correct) rows of the kit's table `tests/data/verifier_{name}.jsonl`"
    return [(r["gold"], r["prediction"], r["correct"]) for r in read_jsonl(TABLES / f"verifier_{name}.jsonl")]


def _bump(ans: str) -> str:
    "A wrong variant of an answer: its last digit changed (or `+1` appended when it has none)"
    m = list(re.finditer(r"\d", ans))
    if not m: return ans + "+1"
    k = m[-1].start()
    return ans[:k] + str((int(ans[k]) + 1) % 10) + ans[k + 1:]


def _rewrite(ans: str) -> str | None:
    "An equivalent rewrite that defeats string comparison (fractions as a/b, roots as powers, a sum reordered), or None"
    s = re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"(\1)/(\2)", ans)
    s = re.sub(r"\\sqrt\{([^{}]+)\}", r"(\1)^{1/2}", s)
    if s != ans: return s
    if any(t in ans for t in ("=", ",", "\\begin", "\\pm", "\\text", "\\cup", "<", ">")): return None
    if ans.count("+") == 1 and "(" not in ans:
        a, b = ans.split("+")
        return f"{b.strip()} + {a.strip()}"
    return f"1\\cdot({ans})"


def symbolic_pairs(m500: list[dict]) -> list[tuple[str, str]]:
    "(response, gold) pairs that need the symbolic path, from MATH500 answers and the kit's table"
    pairs = []
    for r in m500:
        g = r["answer"]
        n = V.to_number(g)
        if n is not None and n.denominator == 1: continue  # integer answers: a rewrite of them would be a toy check
        rw = _rewrite(g)
        if rw is None: continue
        for p in (rw, _bump(rw)):
            pairs.append((f"Working... so the answer is $\\boxed{{{p}}}$.", g))
    pairs += [(p, g) for g, p, _ in table("tricky")]
    pairs = list(dict.fromkeys(pairs))
    return [(c, g) for c, g in pairs if V._prepare(c, g, "math", "answer")[3] is not None]


def timed(fn, runs: int) -> tuple[float, list[float]]:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), ts


def measure(a) -> dict:
    "The three throughput paths, each the median of `a.runs` timed runs, for the `bppo_kit` this process imports"
    data = shared_data_dir()
    gsm = read_jsonl(data / "gsm8k" / "test.jsonl")
    m500 = read_jsonl(data / "math" / "math500_test.jsonl")
    res = {"python": platform.python_version(), "cpus": os.cpu_count(), "workers": a.workers, "runs": a.runs,
           "timeout": a.timeout, "load_avg_before": os.getloadavg()[0], "package": str(Path(V.__file__).parent)}

    # GSM8K-style: the fast path, one call at a time (as the trainer calls `score`)
    gold = [r["answer"].split("####")[-1].strip() for r in gsm]
    comps = [r["answer"] for r in gsm] + [r["answer"].rsplit("####", 1)[0] + "#### " + _bump(g)
                                          for r, g in zip(gsm, gold, strict=True)]
    golds = gold + gold
    expect = [True] * len(gsm) + [False] * len(gsm)
    assert [V.score(c, g, "gsm8k").correct for c, g in zip(comps, golds, strict=True)] == expect
    med, ts = timed(lambda: [V.score(c, g, "gsm8k") for c, g in zip(comps, golds, strict=True)], a.runs)
    res["gsm8k_fast"] = {"n": len(comps), "median_s": med, "runs_s": ts, "scores_per_s": len(comps) / med}

    # MATH-style symbolic: every pair reaches math-verify in a worker; the cache is cleared before each run
    pairs = symbolic_pairs(m500)
    pc, pg = [c for c, _ in pairs], [g for _, g in pairs]
    pool = V.get_pool(a.workers)
    V.score_batch(pc[:8], pg[:8], "math", workers=a.workers)  # start the workers (fork) outside the timing

    def fresh():
        "No cached verdicts or parses anywhere: new workers (forked inside the timing), empty caches"
        pool.close()
        V.CACHE.d.clear()
        E._parse_latex.cache_clear()

    def sym():
        fresh()
        return V.score_batch(pc, pg, "math", timeout=a.timeout, workers=a.workers)
    jobs0, kills0 = pool.jobs, pool.kills
    med, ts = timed(sym, a.runs)
    n_correct = sum(s.correct for s in sym())
    res["math_symbolic"] = {"n": len(pairs), "median_s": med, "runs_s": ts, "scores_per_s": len(pairs) / med,
                            "judged_correct": n_correct, "jobs_sent": pool.jobs - jobs0,
                            "timeouts": pool.kills - kills0}

    # MATH500 as a trainer sees it: reference solutions and wrong ones, mostly decided by the fast path
    mc = [r["solution"] for r in m500] + [f"so $\\boxed{{{_bump(r['answer'])}}}$" for r in m500]
    mg = [r["answer"] for r in m500] * 2

    def mixed():
        fresh()
        return V.score_batch(mc, mg, "math500", timeout=a.timeout, workers=a.workers)
    med, ts = timed(mixed, a.runs)
    ok = [s.correct for s in mixed()]
    res["math500_mixed"] = {"n": len(mc), "median_s": med, "runs_s": ts, "scores_per_s": len(mc) / med,
                            "reference_correct": sum(ok[:500]), "wrong_rejected": 500 - sum(ok[500:])}
    return res


def tables(res: dict, a) -> dict:
    "`res` with the agreement of the kit and of plain math-verify on the kit's two tables"
    tricky, more = table("tricky"), table("more")
    acc, wrong = V.agreement(tricky, workers=a.workers)
    acc_plain, _ = V.agreement(tricky, plain=True, workers=a.workers)
    res["tricky_cases"] = {"n": len(tricky), "kit_agreement": acc, "plain_math_verify_agreement": acc_plain,
                           "kit_disagreements": wrong}
    acc2, wrong2 = V.agreement(more, workers=a.workers)
    acc2_plain, _ = V.agreement(more, plain=True, workers=a.workers)
    res["more_cases"] = {"n": len(more), "kit_agreement": acc2, "plain_math_verify_agreement": acc2_plain,
                         "kit_disagreements": wrong2}
    print(f"tricky cases ({len(tricky)}): kit {acc:.1%}, plain math-verify {acc_plain:.1%}")
    print(f"more cases ({len(more)}, written after the code): kit {acc2:.1%}, "
          f"plain math-verify {acc2_plain:.1%}")
    return res


def _one(root: Path, a) -> dict:
    "One measurement of the `bppo_kit` under `root`, in a fresh process (nothing imported, cached or forked before)"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--json", str(out), "--no-tables", "--runs", str(a.runs),
               "--workers", str(a.workers), "--timeout", str(a.timeout)]
        # the public data sets this checkout reads, wherever the other one lies
        env = {**os.environ, "PYTHONPATH": str(root), "BPPO_SHARED_DATA": str(shared_data_dir())}
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        res = json.loads(out.read_text())
    assert Path(res["package"]).resolve() == (root / "bppo_kit").resolve(), res["package"]  # the checkout asked for
    return res


def against(a) -> dict:
    "This checkout against `a.baseline`, measured alternately for `a.rounds` rounds: medians and their ratios"
    rounds = []
    for r in range(a.rounds):
        # alternate which one runs first, so that a drift in the machine's load falls on both alike
        order = ("new", "base") if r % 2 == 0 else ("base", "new")
        got = {k: _one(REPO if k == "new" else a.baseline, a) for k in order}
        rounds.append({k: {p: got[k][p]["scores_per_s"] for p in PATHS} for k in ("new", "base")})
        print(f"round {r + 1}: " + ", ".join(f"{p} {rounds[-1]['new'][p] / rounds[-1]['base'][p]:.2f}x" for p in PATHS))
    res = {"baseline": str(a.baseline), "rounds": rounds, "runs": a.runs, "workers": a.workers, "paths": {}}
    print(f"{'path':<16}{'baseline/s':>12}{'this/s':>12}{'ratio':>8}")
    for p in PATHS:
        base, new = (statistics.median(x[k][p] for x in rounds) for k in ("base", "new"))
        res["paths"][p] = {"baseline_per_s": base, "this_per_s": new, "ratio": new / base,
                           "round_ratios": [x["new"][p] / x["base"][p] for x in rounds]}
        print(f"{p:<16}{base:>12,.0f}{new:>12,.0f}{new / base:>7.2f}x")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per measurement (median reported)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes for the symbolic checks")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds per symbolic check")
    ap.add_argument("--no-tables", action="store_true", help="throughput only, not the agreement on the tables")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a folder holding another checkout's bppo_kit: measure both alternately and report ratios")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: rounds of one measurement each")
    a = ap.parse_args(argv)
    if a.baseline is not None: res = against(a)
    else:
        res = measure(a)
        if not a.no_tables: res = tables(res, a)
        res["load_avg_after"] = os.getloadavg()[0]
        print(f"{'measurement':<16}{'n':>7}{'median s':>11}{'scores/s':>12}")
        for k in PATHS:
            r = res[k]
            print(f"{k:<16}{r['n']:>7}{r['median_s']:>11.3f}{r['scores_per_s']:>12,.0f}")
        print(f"load average before/after: {res['load_avg_before']:.2f} / {res['load_avg_after']:.2f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
