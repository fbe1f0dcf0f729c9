"""Step time of one training run on 1 process and on N (accelerate launch, DDP), same global batch, in one run.

    python benchmarks/speed/scale_out.py --procs 2 --steps 8 --algo grpo --json runs/bench_scale_out.json

Each run is `bppo train --preset cpu-demo` (on N processes: `accelerate launch --config_file
configs/accelerate/ddp.yaml`, CPU processes with gloo where there is no GPU). Reported: the median step time
(`wall_s` of metrics.jsonl, the first step left out as warm-up) and its parts (rollout, update), each as N-process
over 1-process ratios, and whether the final parameters agree. By default both get the same cores: the one process
runs N × `--threads` torch threads, each of the N processes `--threads`; so on a CPU the ratio measures what
splitting a step over processes costs or saves against threads, not what N GPUs give. Run nothing else meanwhile.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile
from pathlib import Path

from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]


def run(out: Path, procs: int, args, threads: int) -> list[dict]:
    sets = [x for kv in args.set for x in ("--set", kv)]
    cmd = ["train", "--preset", "cpu-demo", "--algo", args.algo, "--steps", str(args.steps), "--out", str(out),
           "--quiet", "--set", "train.eval_every=0", "--set", "data.eval_size=4", *sets]
    launch = ([] if procs == 1 else ["-m", "accelerate.commands.launch", "--config_file",
                                     str(ROOT / "configs/accelerate/ddp.yaml"), "--num_processes", str(procs)])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, *launch, "-m", "bppo_kit.cli", *cmd], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]


def med(rows: list[dict], k: str) -> float: return statistics.median(r[k] for r in rows[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each of the N processes")
    ap.add_argument("--one-threads", type=int,
                    help="threads of the 1-process run (default: N × --threads, the same cores)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        one_threads = args.one_threads or args.procs * args.threads
        one, many = run(Path(d) / "one", 1, args, one_threads), run(Path(d) / "many", args.procs, args, args.threads)
        a, b = (load_file(str(Path(d) / r / "checkpoint" / "model.safetensors")) for r in ("one", "many"))
        diff = max((a[k] - b[k]).abs().max().item() for k in a)
    res = dict(procs=args.procs, steps=args.steps, algo=args.algo, cpu_count=os.cpu_count(),
               threads_1=one_threads, threads_each=args.threads, max_param_diff=diff)
    for k in ("wall_s", "rollout_s", "update_s"):
        res[f"{k}_1"], res[f"{k}_{args.procs}"] = round(med(one, k), 4), round(med(many, k), 4)
        res[f"{k}_ratio"] = round(med(many, k) / med(one, k), 3)
    for k, v in res.items(): print(f"{k:>18}  {v}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
