"""Record, or check against a record, every verdict of the verifier, for refactors that must not change behaviour.

    python tools/verifier_same.py --write /tmp/verifier_before.json   # with the code before the change
    python tools/verifier_same.py --check /tmp/verifier_before.json   # after it: exit 1 on any difference

Graded: every row of the three agreement tables (`tests/data/verifier_tricky.jsonl`, `verifier_more.jsonl`,
`verifier_heldout.jsonl`; the first two are read from the module's old `TRICKY_CASES`/`MORE_CASES` when the files do
not exist yet), every GSM8K test and every MATH500 reference solution against its own answer (as the lesson's "Real
data" cell grades them). For each: `score(pred, gold, task)` -> (correct, reward, extracted, format_ok), plus
`gold_answer` and `normalize_answer` of the prediction, and the row itself, so a changed table shows too.
"""
import argparse
import json
import sys
from pathlib import Path

from bppo_kit import verifier as V
from bppo_kit.config import shared_data_dir
from bppo_kit.data import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "tests" / "data"


def _table(name: str, attr: str) -> list[tuple]:
    "(gold, prediction, task) rows of a kit table: from its JSONL file, or from the module where it used to live"
    f = TABLES / f"verifier_{name}.jsonl"
    if f.exists():
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        return [(r["gold"], r["prediction"], "auto") for r in rows]
    return [(g, p, "auto") for g, p, _ in getattr(V, attr)]


def cases() -> dict[str, list[tuple]]:
    "Every (gold, prediction, task) graded, by source"
    alias = {"aime": "aime24"}  # as tests/test_verifier.py grades the held-out table
    held = read_jsonl(TABLES / "verifier_heldout.jsonl")
    data = shared_data_dir()
    gsm = read_jsonl(data / "gsm8k" / "test.jsonl")
    m500 = read_jsonl(data / "math" / "math500_test.jsonl")
    return {"tricky": _table("tricky", "TRICKY_CASES"), "more": _table("more", "MORE_CASES"),
            "heldout": [(r["gold"], r["pred"], alias.get(r["task"], r["task"])) for r in held],
            "gsm8k": [(r["answer"].split("####")[-1], r["answer"], "gsm8k") for r in gsm],
            "math500": [(r["answer"], r["solution"], "math500") for r in m500]}


def verdicts() -> dict:
    out = {}
    for src, rows in cases().items():
        recs = []
        for gold, pred, task in rows:
            s = V.score(pred, gold, task)
            recs.append({"gold": gold, "pred": pred, "task": task, "correct": s.correct, "reward": s.reward,
                         "extracted": s.extracted, "format_ok": s.format_ok, "gold_answer": V.gold_answer(gold, task),
                         "normalized": V.normalize_answer(pred)})
        out[src] = recs
        print(f"{src}: {len(recs)} rows, {sum(r['correct'] for r in recs)} correct", file=sys.stderr)
    out["_pool_kills"] = V.get_pool().kills  # a timeout under load would make a verdict flaky: should stay 0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path, help="record the verdicts here")
    g.add_argument("--check", type=Path, help="compare the verdicts with this record")
    a = ap.parse_args(argv)
    now = verdicts()
    if now["_pool_kills"]: print(f"warning: {now['_pool_kills']} symbolic checks timed out", file=sys.stderr)
    if a.write:
        a.write.write_text(json.dumps(now, ensure_ascii=False, indent=0) + "\n")
        print(f"wrote {sum(len(v) for k, v in now.items() if k[0] != '_')} verdicts to {a.write}")
        return 0
    before = json.loads(a.check.read_text())
    bad = 0
    for src in sorted(set(before) | set(now)):
        if src.startswith("_"): continue
        b, n = before.get(src, []), now.get(src, [])
        diff = [(i, x, y) for i, (x, y) in enumerate(zip(b, n, strict=False)) if x != y]  # may differ in length
        if len(b) != len(n): print(f"{src}: {len(b)} rows before, {len(n)} now")
        for i, x, y in diff[:10]: print(f"{src}[{i}]:\n  before {x}\n  now    {y}")
        ok = len(b) == len(n) and not diff
        bad += not ok
        print(f"{src}: {len(n)} rows compared, {'identical' if ok else f'{len(diff)} differ'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
