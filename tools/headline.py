"""The README's headline table, written from the committed comparison reports (`docs/results/data/NAME/report.json`).

    python tools/headline.py           # print the table the reports give
    python tools/headline.py --write   # put it into README.md between the headline markers
    python tools/headline.py --check   # exit 1 if README.md's table differs (tests/test_headline.py)

Every number of a row comes from one report: an arm's mean and 95% interval, or a contrast's paired difference, its
interval and its verdict. A row that no committed report backs cannot be written here.
"""
import argparse, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"
HEADER = ("| claim | design, n | unit of cost | estimate: accuracy in % or points [95% interval] | verdict "
          "| results |\n|---|---|---|---|---|---|")
GRPO_BPPO = "[GRPO and BPPO](docs/results/grpo_bppo.md)"
TPPO = "[T-PPO](docs/results/tppo.md)"
COST = "[Cost on a GPU](docs/results/cost.md)"
FAMILY = "[BPPO's family](docs/results/family.md)"
STEPS = "decoding passes (40 steps each)"
GPU = "GPU s, predicted (Qwen2.5-1.5B, H100)"
# one row per claim: its words, the report, the arm, the metric, how the estimate reads, its unit and its page
ROWS = [
    dict(claim="GRPO (`grpo`, 60 steps), the baseline: final accuracy", report="bppo-vs-grpo", arm="grpo",
         metric="final_accuracy", kind="arm_pct", unit="CPU training wall time", page=GRPO_BPPO),
    dict(claim="BPPO (`bppo`), given half of GRPO's (`grpo`, 60 steps) cost, matches GRPO's final accuracy",
         report="bppo-vs-grpo", arm="bppo", metric="final_accuracy", kind="points", unit="CPU training wall time",
         page=GRPO_BPPO),
    dict(claim="…and at that cost its responses are shorter", report="bppo-vs-grpo", arm="bppo",
         metric="final_tokens", kind="against", unit="final response tokens", page=GRPO_BPPO, same=True),
    dict(claim="…and on a GPU that run costs less", report="bppo-vs-grpo", arm="bppo", metric="total_gpu_s",
         kind="ratio_s", unit=GPU, page=COST, same=True, predicted=True),
    dict(claim="PPO (`ppo`, 16 steps), the baseline: final accuracy", report="tppo-vs-ppo", arm="ppo",
         metric="final_accuracy", kind="arm_pct", unit="decoding passes", page=TPPO),
    dict(claim="T-PPO (`tppo_recipe`), at PPO's decoding passes, is more accurate than PPO", report="tppo-vs-ppo",
         arm="tppo_recipe", metric="final_accuracy", kind="points", unit="decoding passes", page=TPPO),
    dict(claim="…and at PPO's generated tokens", report="tppo-vs-ppo", arm="tppo_recipe",
         metric="accuracy_at_1_generated_tokens", kind="points", unit="generated tokens", page=TPPO, same=True),
    dict(claim="…and on a GPU that run costs less", report="tppo-vs-ppo", arm="tppo_recipe", metric="total_gpu_s",
         kind="ratio_s", unit=GPU, page=COST, same=True, predicted=True),
    dict(claim="T-PPO without the critic warm-up (`tppo_recipe_nowarm`) against PPO on equal footing (`ppo_fair`: "
         "the same oversampling and LM loss), at equal decoding passes", report="tppo-vs-ppo/vs-ppo_fair",
         arm="tppo_recipe_nowarm", metric="final_accuracy", kind="points", unit="decoding passes", page=TPPO,
         same=True),
    dict(claim="PPO (`ppo`, 30 steps), the baseline on the task without a tail: final accuracy",
         report="tppo-vs-ppo-demo", arm="ppo", metric="final_accuracy", kind="arm_pct", unit="decoding passes",
         page=TPPO),
    dict(claim="T-PPO (`tppo_recipe`), at PPO's decoding passes, is more accurate than PPO",
         report="tppo-vs-ppo-demo", arm="tppo_recipe", metric="final_accuracy", kind="points",
         unit="decoding passes", page=TPPO, same=True),
    dict(claim="…and at PPO's generated tokens", report="tppo-vs-ppo-demo", arm="tppo_recipe",
         metric="accuracy_at_1_generated_tokens", kind="points", unit="generated tokens", page=TPPO, same=True),
    dict(claim="…and on a GPU that run costs less", report="tppo-vs-ppo-demo", arm="tppo_recipe",
         metric="total_gpu_s", kind="ratio_s", unit=GPU, page=COST, same=True,
         predicted=True),
    dict(claim="GRPO (`grpo`, 40 steps), the baseline of BPPO's peers: final accuracy", report="family", arm="grpo",
         metric="final_accuracy", kind="arm_pct", unit=STEPS, page=FAMILY),
    dict(claim="BPPO (`bppo`), at GRPO's steps, matches GRPO's final accuracy", report="family", arm="bppo",
         metric="final_accuracy", kind="points", unit=STEPS, page=FAMILY, same=True),
    dict(claim="CPPO (`cppo`: the quarter of a step's completions of largest \\|advantage\\|), at GRPO's steps, "
         "matches it", report="family", arm="cppo", metric="final_accuracy", kind="points", unit=STEPS, page=FAMILY,
         same=True),
    dict(claim="…and on a GPU its run costs less", report="family", arm="cppo", metric="total_gpu_s", kind="ratio_s",
         unit=GPU, page=COST, same=True, predicted=True),
    dict(claim="PODS (`pods`: the 2 of 8 of most reward variance), at GRPO's steps, matches it", report="family",
         arm="pods", metric="final_accuracy", kind="points", unit=STEPS, page=FAMILY, same=True),
    dict(claim="2-GRPO (`grpo_g2`: groups of 2, as many completions), at GRPO's steps, matches it", report="family",
         arm="grpo_g2", metric="final_accuracy", kind="points", unit=STEPS, page=FAMILY, same=True),
]
LEGACY: list[str] = []  # rows no committed report backs (none now: every row has its comparison)


def num(x: float, digits: int = 1) -> str:
    "A number with a typographic minus"
    return f"{x:.{digits}f}".replace("-", "−")


def signed(x: float, digits: int = 1) -> str: return ("+" if x > 0 else "") + num(x, digits)


def interval(ci, scale: float = 1.0, digits: int = 1, sign: bool = True) -> str:
    f = signed if sign else num
    return f"[{f(ci[0] * scale, digits)}, {f(ci[1] * scale, digits)}]"


def sig3(x: float) -> str: return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def design(rep: dict) -> str:
    "The design's cell: its preset, kind and seeds"
    d = rep["design"]
    preset = d["command"].split("--preset ")[1].split()[0]
    seeds = d["seeds"]
    fresh = "fresh seeds" if d["kind"] == "confirming" else f"seeds {seeds[0]}–{seeds[-1]}"
    return f"`{preset}`, {d['kind']}, {len(seeds)} {fresh}"


def estimate(rep: dict, row: dict) -> tuple[str, str]:
    "(the estimate's cell, the verdict's cell) of `row` from its report"
    base, arm, m = rep["design"]["baseline"], row["arm"], row["metric"]
    if row["kind"] == "arm_pct":
        a = rep["arms"][arm][m]
        return f"{num(100 * a['mean'])}% {interval(a['ci95'], 100, sign=False)}", "(baseline)"
    c = rep["contrasts"][arm][m]
    verdict = f"**{c['verdict']}**" + (" (predicted)" if row.get("predicted") else "")
    if row["kind"] == "points":
        return f"{signed(100 * c['diff'])} {interval(c['ci95'], 100)} accuracy points", verdict
    mine, theirs = rep["arms"][arm][m]["mean"], rep["arms"][base][m]["mean"]
    if row["kind"] == "against":
        return f"{sig3(mine)} against {sig3(theirs)}: {signed(c['diff'], 0)} {interval(c['ci95'], digits=0)}", verdict
    if row["kind"] == "ratio_s":
        return f"{mine / theirs:.2f}x: {signed(c['diff'])} {interval(c['ci95'])} s", verdict
    raise ValueError(f"unknown kind {row['kind']!r}")


def table() -> str:
    lines = [HEADER]
    reports = {name: json.loads((DATA / name / "report.json").read_text()) for name in {r["report"] for r in ROWS}}
    for row in ROWS:
        rep = reports[row["report"]]
        est, verdict = estimate(rep, row)
        where = "same runs" if row.get("same") else design(rep)
        lines.append(f"| {row['claim']} | {where} | {row['unit']} | {est} | {verdict} | {row['page']} |")
    return "\n".join(lines + LEGACY)


def readme_table(text: str) -> str:
    "The headline table in README.md's text: from its header line to the last row"
    start = text.index(HEADER.splitlines()[0])
    end = text.index("\n\n", start)
    return text[start:end]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="replace README.md's headline table")
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md's table is not the reports'")
    a = ap.parse_args(argv)
    want, readme = table(), ROOT / "README.md"
    text = readme.read_text()
    have = readme_table(text)
    if a.write: readme.write_text(text.replace(have, want))
    elif not a.check: print(want)
    elif have != want:
        print("README.md's headline table is not the one the reports give; run python tools/headline.py --write")
        for h, w in zip(have.splitlines(), want.splitlines()):
            if h != w: print(f"- {h}\n+ {w}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
