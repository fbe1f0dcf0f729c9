"""Fast-path throughput of the verifier against an earlier revision's, in one process, timed runs alternated.

    OMP_NUM_THREADS=1 python benchmarks/speed/verifier_ab.py [--rev 96b3946] [--runs 15]

Loads the package `bppo_kit` of `--rev` (via `git archive`, as `bppo_kit_<rev>`) beside the working tree's (the verifier
is four modules since issue 44, so a revision is loaded whole), and scores the GSM8K test
reference solutions plus the same with a wrong final digit, one by one with `score` (the fast path), alternating the
two modules; prints the median scores/s of each and their ratio. Needs the public GSM8K file (`shared_data_dir()`).
"""
import argparse, importlib.util, re, statistics, subprocess, sys, tempfile, time
from pathlib import Path
from bppo_kit.config import shared_data_dir
from bppo_kit.data import read_jsonl

ROOT = Path(__file__).resolve().parents[2]

def load_rev(rev: str, into: Path):
    "The verifier module of the package `bppo_kit` as it was at `rev`, imported as `bppo_kit_<rev>.verifier`"
    name = "bppo_kit_" + re.sub(r"\W", "_", rev)
    tar = subprocess.run(["git", "archive", "--format=tar", rev, "bppo_kit"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    (into / "bppo_kit").rename(into / name)
    spec = importlib.util.spec_from_file_location(name, into / name / "__init__.py",
                                                  submodule_search_locations=[str(into / name)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    return importlib.import_module(f"{name}.verifier")

def bump(a: str) -> str:
    "`a` with its last digit changed: a wrong answer"
    k = [m.start() for m in re.finditer(r"\d", a)][-1]
    return a[:k] + str((int(a[k]) + 1) % 10) + a[k + 1:]

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", default="96b3946", help="the revision to compare with (default: before issue 17)")
    ap.add_argument("--runs", type=int, default=15, help="timed runs of each module")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        old = load_rev(a.rev, Path(d))
        from bppo_kit import verifier as new
        rows = read_jsonl(shared_data_dir() / "gsm8k" / "test.jsonl")
        gold = [r["answer"].split("####")[-1].strip() for r in rows]
        comps = [r["answer"] for r in rows] + [r["answer"].rsplit("####", 1)[0] + "#### " + bump(g)
                                               for r, g in zip(rows, gold)]
        golds = gold + gold
        times = {"old": [], "new": []}
        for _ in range(a.runs):
            for key, mod in (("old", old), ("new", new)):
                t = time.perf_counter()
                [mod.score(c, g, "gsm8k") for c, g in zip(comps, golds)]
                times[key].append(time.perf_counter() - t)
    to, tn = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"{a.rev} {len(comps) / to:,.0f}/s  working tree {len(comps) / tn:,.0f}/s  ratio new/old {to / tn:.3f}")

if __name__ == "__main__":
    main()
