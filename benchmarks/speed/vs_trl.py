"""The kit's GRPO against TRL's `GRPOTrainer`, and the kit's BPPO inside TRL (`BPPOTrainer`) against TRL's own GRPO:
same tiny policy, task, reward and group size, a few steps each.

Both sides train the shipped tiny policy on the synthetic task with the cpu-demo workload: each optimizer step
generates 8 completions for each of 16 prompts (128 completions, one generation round, at most 160 new tokens,
temperature 1, no top-k / top-p), grades them with `bppo_kit.verifier.reward_fn`, normalizes rewards within each group
and takes one clipped-surrogate step (eps 0.2 / 0.28, no KL, no reference model, token-mean loss, AdamW at a constant
lr 1e-4, betas 0.9 / 0.99, grad clip 1.0, 64 sequences per forward/backward). Step k of both sides sees the same 16
prompts: `PromptSource(cfg)(k)`.

- kit: `bppo_kit.trainer.train` on the `cpu-demo` preset; step time is `wall_s` of `metrics.jsonl` (rollout, reward,
  advantages and update; not the logging).
- TRL: `trl.GRPOTrainer`; step time is measured by a `TrainerCallback` from `on_step_begin` to `on_step_end` (one
  generation round, reward, advantages, both micro-batches' forward/backward, clip and optimizer step; not TRL's
  logging). The time between consecutive `on_step_end`s (which adds data loading and logging) is reported too.
- TRL + BPPO: `bppo_kit.integrations.trl.BPPOTrainer` (the TRL lesson, 29_trl) with the same arguments and the kit's
  BPPO defaults (`algo.*` of the preset): the same generation, then only the shortest correct and incorrect
  completion of each mixed group, cut to its prefix, is trained.

The update phase of both TRL sides is the step (`on_step_begin` -> `on_step_end`) less the time inside
`_generate_and_score_completions` (generation, decoding, rewards, advantages, the reference / old log-probs TRL computes
there, and for BPPO the selection and the cut): what is left is the forward and backward passes of the micro-batches,
the gradient clip and the optimizer step. It is reported per side and as the ratio BPPO / GRPO, both inside TRL in the
same run.

Both report the median over steps, skipping the first as warm-up. Each side runs in its own fresh subprocess of this
script, one after the other (kit, TRL, TRL + BPPO), so none is timed with another's imports, threads or heap in the
process.

    python benchmarks/speed/vs_trl.py --steps 8 --json runs/vs_trl.json

Needs the `bench` extra (`pip install -e ".[bench]"`, plus `accelerate`); the BPPO side needs the `trl` extra.
"""
from __future__ import annotations
import argparse, functools, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path

# TRL's loss types, by how they reduce per-token losses. The kit's default `algo.reduction=token` divides the sum over
# every trained token of the step by the number of completion tokens in the whole step (all micro-batches together);
# TRL's "dapo" divides by `num_items_in_batch`, the completion tokens of the whole generation batch, which here is one
# optimizer step: the same reduction. "bnpo" divides by the tokens of each micro-batch (then averages micro-batches),
# which differs whenever the two micro-batches hold different numbers of tokens.
LOSS_TYPE = {"token": "dapo", "seq": "grpo", "constant": "dr_grpo"}
# The kit's rollout engine on its side: "hf" (default) generates with transformers' `generate`, as TRL does, so the
# comparison is of the training loops; VS_TRL_ENGINE=kit measures the kit with its own continuous-batching engine.
ENGINE = os.environ.get("VS_TRL_ENGINE", "hf")
SIDES = ("kit", "trl", "bppo")  # the kit's GRPO, TRL's GRPOTrainer, the kit's BPPOTrainer in TRL; each a subprocess


def kit_config(steps: int, out: str):
    from bppo_kit.config import get_config
    return get_config("cpu-demo", overrides=[f"train.steps={steps}", f"train.out={out}", "train.device=cpu",
                                             f"rollout.engine={ENGINE}"])


def settings_of(cfg) -> dict:
    "The workload both sides run, read from the kit's config"
    r, a, t = cfg.rollout, cfg.algo, cfg.train
    return dict(preset="cpu-demo", model=cfg.model.name_or_path, task=cfg.data.task,
                prompts_per_step=t.prompts_per_step, group_size=r.group_size,
                completions_per_step=t.prompts_per_step * r.group_size,
                max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, lr=t.lr,
                lr_schedule="constant", adam_betas=[0.9, 0.99], weight_decay=0.0, grad_clip=t.grad_clip,
                eps_low=a.eps_low, eps_high=a.eps_high, beta=a.beta, mu=t.mu, micro_batch=t.micro_batch,
                kit_reduction=a.reduction, trl_loss_type=LOSS_TYPE[a.reduction], seed=t.seed, device="cpu",
                kit_loss_kernel=getattr(t, "loss_kernel", "naive"))


def median_after_warmup(xs: list[float]) -> float | None:
    xs = xs[1:] if len(xs) > 1 else xs
    return round(statistics.median(xs), 4) if xs else None


def mean(xs):
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 4) if xs else None


def run_kit(steps: int, work: Path) -> dict:
    "Train with the kit; per-step times and metrics from its metrics.jsonl"
    from bppo_kit.trainer import read_jsonl_rows, train
    cfg = kit_config(steps, str(work / "kit"))
    t0, c0 = time.perf_counter(), time.process_time()
    train(cfg, evaluate_every=False, progress=False)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = read_jsonl_rows(work / "kit" / "metrics.jsonl")
    n = cfg.train.prompts_per_step * cfg.rollout.group_size
    return dict(
        settings=settings_of(cfg), total_s=round(total, 2), cpu_s=round(cpu, 2),
        step_s=[r["wall_s"] for r in rows], rollout_s=[r["rollout_s"] for r in rows],
        update_s=[r["update_s"] for r in rows], reward_mean=[round(r["reward_mean"], 4) for r in rows],
        # completion tokens with the EOS (as TRL counts them) and the share of completions that ended at EOS
        completion_tokens_mean=[round(r["generated_tokens"] / n, 2) for r in rows],
        eos_frac=[round((r["generated_tokens"] - n * r["response_tokens_mean"]) / n, 4) for r in rows],
        # the kit's update skips sequences whose advantage is 0 (every member of a group with one reward);
        # TRL trains all
        trained_sequences=[round(n * (1 - r["frac_zero_std_groups"])) for r in rows],
        trained_token_frac=[round(r["trained_tokens"] / max(r["generated_tokens"], 1), 4) for r in rows],
        frac_zero_std_groups=[r["frac_zero_std_groups"] for r in rows])


def run_trl(steps: int, work: Path, bppo: bool = False) -> dict:
    "Train with TRL's GRPOTrainer (`bppo`: the kit's BPPOTrainer) on the same workload; per-step times from a callback"
    import warnings
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    if bppo: from bppo_kit.integrations.trl import BPPO_KNOBS, BPPOConfig, BPPOTrainer
    Config, Trainer = (BPPOConfig, BPPOTrainer) if bppo else (GRPOConfig, GRPOTrainer)
    from bppo_kit.policy import load_policy
    from bppo_kit.sampler import PromptSource
    from bppo_kit.verifier import reward_fn

    warnings.filterwarnings("ignore", message=r".*checkpointing.* is deprecated", category=FutureWarning)
    cfg = kit_config(steps, str(work / "kit-unused"))
    s = settings_of(cfg)
    if s["mu"] != 1 or s["beta"] != 0: raise SystemExit("this comparison assumes train.mu=1 and algo.beta=0")
    B, G, micro = s["prompts_per_step"], s["group_size"], s["micro_batch"]
    if (B * G) % micro: raise SystemExit(f"{B}x{G} completions do not split into micro-batches of {micro}")

    # step k's rows are the kit's prompts of step k; shuffle_dataset=False keeps that order
    src = PromptSource(cfg)
    exs = [e for k in range(steps) for e in src(k)]
    ds = Dataset.from_dict({"prompt": [e.prompt for e in exs], "answer": [e.answer for e in exs]})

    model, tok = load_policy(cfg.model.name_or_path, cfg.model.dtype, "cpu")
    reward = functools.partial(reward_fn, task=cfg.data.task)
    reward.__name__ = "reward_fn"  # older TRL read `__name__` of every reward function; TRL 1.x unwraps partials itself

    # BPPO's knobs, as the kit's preset has them
    knobs = {k: getattr(cfg.algo, k) for k in BPPO_KNOBS} if bppo else {}
    args = Config(
        output_dir=str(work / "trl"), report_to="none", save_strategy="no", logging_strategy="steps", logging_steps=1,
        disable_tqdm=True, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=s["seed"],
        max_steps=steps, learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=s["grad_clip"],
        # one optimizer step = B prompts x G completions, generated in one round, trained in micro-batches of `micro`
        num_generations=G, per_device_train_batch_size=micro, gradient_accumulation_steps=B * G // micro,
        generation_batch_size=B * G, num_iterations=1, shuffle_dataset=False,
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"],
        # TRL already stops on the model's and tokenizer's EOS; say it outright so a changed default can't drop it
        generation_kwargs=dict(eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id),
        use_vllm=False, beta=s["beta"], epsilon=s["eps_low"], epsilon_high=s["eps_high"], loss_type=s["trl_loss_type"],
        scale_rewards="group", mask_truncated_completions=False, log_completions=False, dataloader_num_workers=0,
        **knobs)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin, self.last_end, self.step_s, self.end_to_end_s, self.logs = None, None, [], [], []
            self.score_now, self.score_s, self.update_s = 0.0, [], []  # generate-and-score inside the step; the rest
        def on_train_begin(self, args, state, control, **kw): self.last_end = time.perf_counter()
        def on_step_begin(self, args, state, control, **kw): self.begin, self.score_now = time.perf_counter(), 0.0
        def on_step_end(self, args, state, control, **kw):
            t = time.perf_counter()
            self.step_s.append(round(t - self.begin, 4))
            self.end_to_end_s.append(round(t - self.last_end, 4))
            self.score_s.append(round(self.score_now, 4))
            self.update_s.append(round(t - self.begin - self.score_now, 4))
            self.last_end = t
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs: self.logs.append(dict(logs, step=state.global_step))

    timer = StepTimer()
    trainer = Trainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                      callbacks=[timer])
    gen_s = []  # rollout time: tokenize, generate, decode (wraps this instance's method only)
    orig_generate = trainer._generate
    def timed_generate(prompts):
        t = time.perf_counter()
        out = orig_generate(prompts)
        gen_s.append(round(time.perf_counter() - t, 4))
        return out
    trainer._generate = timed_generate
    orig_score = trainer._generate_and_score_completions  # the whole generation phase, for the update time
    def timed_score(inputs):
        t = time.perf_counter()
        out = orig_score(inputs)
        timer.score_now += time.perf_counter() - t
        return out
    trainer._generate_and_score_completions = timed_score
    # TRL's config turns activation checkpointing on by default; the kit's cpu-demo runs without it
    ckpt = bool(getattr(trainer.model, "is_activation_checkpointing", False))
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    if len(gen_s) != steps: print(f"[vs_trl] warning: TRL generated {len(gen_s)} times in {steps} steps", flush=True)
    L = timer.logs
    get = lambda k: [round(l[k], 4) if l.get(k) is not None else None for l in L]
    return dict(
        settings=s | knobs, total_s=round(total, 2), cpu_s=round(cpu, 2), activation_checkpointing=ckpt,
        step_s=timer.step_s, step_s_end_to_end=timer.end_to_end_s, rollout_s=gen_s, score_s=timer.score_s,
        update_s=timer.update_s, reward_mean=get("reward"), completion_tokens_mean=get("completions/mean_length"),
        eos_frac=[None if c is None else round(1 - c, 4) for c in get("completions/clipped_ratio")],
        frac_zero_std_groups=get("frac_reward_zero_std"), trl_logged_step_time=get("step_time"),
        trained_sequences=get("bppo/selected_sequences") if bppo else None,
        trained_tokens=get("bppo/prefix_tokens") if bppo else None,
        loss_type_note=("dapo: divides the summed token losses by the completion tokens of the whole generation batch "
                        "(= one optimizer step here), as the kit's token-mean does; bnpo would divide per micro-batch"))


def versions() -> dict:
    from importlib.metadata import version, PackageNotFoundError
    out = dict(python=platform.python_version())
    for p in ("torch", "transformers", "trl", "datasets", "accelerate", "bppo-kit"):
        try: out[p] = version(p)
        except PackageNotFoundError: out[p] = None
    return out


def side_main(a):
    import torch
    torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix=f"vs_trl_{a.side}_"))
    load = os.getloadavg()
    try:
        res = run_kit(a.steps, work) if a.side == "kit" else run_trl(a.steps, work, bppo=a.side == "bppo")
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)  # save nothing
    res["torch_threads"] = torch.get_num_threads()
    res["loadavg"] = dict(start=[round(x, 2) for x in load], end=[round(x, 2) for x in os.getloadavg()])
    Path(a.part).write_text(json.dumps(res))


def fmt(x, spec=".3f"): return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps on each side (the first is warm-up)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads on each side")
    ap.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # internal: run one side
    ap.add_argument("--part", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.steps < 1: ap.error("--steps must be >= 1")
    if a.side: return side_main(a)

    load = os.getloadavg()
    parts = {}
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as d:
        for side in SIDES:
            part = Path(d) / f"{side}.json"
            print(f"[vs_trl] {side}: {a.steps} steps ...", flush=True)
            subprocess.run([sys.executable, __file__, "--side", side, "--steps", str(a.steps), "--threads",
                            str(a.threads), "--part", str(part)], check=True)
            parts[side] = json.loads(part.read_text())
    kit, trl, bp = parts["kit"], parts["trl"], parts["bppo"]
    km, tm, bm = (median_after_warmup(x["step_s"]) for x in (kit, trl, bp))
    tu, bu = median_after_warmup(trl["update_s"]), median_after_warmup(bp["update_s"])
    ratio = lambda x, y: round(x / y, 3) if x and y else None
    res = dict(
        kit_median_step_s=km, trl_median_step_s=tm, ratio_trl_over_kit=round(tm / km, 3) if km and tm else None,
        kit_step_s=kit["step_s"], trl_step_s=trl["step_s"], trl_step_s_end_to_end=trl["step_s_end_to_end"],
        kit_rollout_s=kit["rollout_s"], trl_rollout_s=trl["rollout_s"], kit_update_s=kit["update_s"],
        trl_generation_rounds=len(trl["rollout_s"]),
        kit_median_rollout_s=median_after_warmup(kit["rollout_s"]),
        trl_median_rollout_s=median_after_warmup(trl["rollout_s"]),
        kit_median_update_s=median_after_warmup(kit["update_s"]),
        # BPPO inside TRL against TRL's own GRPO, the same run: the update phase (step less generate-and-score)
        trl_update_s=trl["update_s"], trl_score_s=trl["score_s"], trl_median_update_s=tu,
        bppo_trl_step_s=bp["step_s"], bppo_trl_update_s=bp["update_s"], bppo_trl_score_s=bp["score_s"],
        bppo_trl_median_step_s=bm, bppo_trl_median_update_s=bu,
        ratio_bppo_over_trl_update=ratio(bu, tu), ratio_bppo_over_trl_step=ratio(bm, tm),
        bppo_trl_reward_mean=bp["reward_mean"], bppo_trl_trained_sequences=bp["trained_sequences"],
        bppo_trl_trained_tokens=bp["trained_tokens"], bppo_trl_completion_tokens_mean=bp["completion_tokens_mean"],
        bppo_trl_settings={k: bp["settings"].get(k) for k in ("prefix_mode", "class_weight", "loss_scale")},
        trl_median_step_s_end_to_end=median_after_warmup(trl["step_s_end_to_end"]),
        kit_reward_mean=kit["reward_mean"], trl_reward_mean=trl["reward_mean"],
        kit_completion_tokens_mean=kit["completion_tokens_mean"],
        trl_completion_tokens_mean=trl["completion_tokens_mean"],
        kit_eos_frac=kit["eos_frac"], trl_eos_frac=trl["eos_frac"],
        kit_frac_zero_std_groups=kit["frac_zero_std_groups"], trl_frac_zero_std_groups=trl["frac_zero_std_groups"],
        kit_trained_sequences=kit["trained_sequences"], kit_trained_token_frac=kit["trained_token_frac"],
        kit_total_s=kit["total_s"], trl_total_s=trl["total_s"], trl_logged_step_time=trl["trl_logged_step_time"],
        # process CPU seconds per wall second of training: near --threads when a side had the cores to itself
        kit_cpu_per_wall=round(kit["cpu_s"] / kit["total_s"], 2),
        trl_cpu_per_wall=round(trl["cpu_s"] / trl["total_s"], 2),
        bppo_trl_cpu_per_wall=round(bp["cpu_s"] / bp["total_s"], 2),
        trl_activation_checkpointing=trl["activation_checkpointing"],
        loadavg=dict(kit=kit["loadavg"], trl=trl["loadavg"], bppo=bp["loadavg"]),
        steps=a.steps, threads=a.threads, torch_threads={s: parts[s]["torch_threads"] for s in SIDES},
        timing=("median over steps 2..N; kit: metrics.jsonl wall_s; TRL: TrainerCallback on_step_begin -> on_step_end; "
                "TRL update: that step less _generate_and_score_completions; each side in its own subprocess, "
                "kit, TRL, TRL + BPPO"),
        settings=kit["settings"], loss_type_note=trl["loss_type_note"], versions=versions(),
        machine=dict(cpus=os.cpu_count(), loadavg_at_start=[round(x, 2) for x in load], platform=platform.platform()))

    first_last = lambda x: f"{fmt(x['reward_mean'][0])} -> {fmt(x['reward_mean'][-1])}"
    three = lambda key, spec=".3f": [fmt(mean(x[key]), spec) for x in (kit, trl, bp)]
    rows = [("median step (s)", fmt(km), fmt(tm), fmt(bm)),
            ("median rollout (s)", *[fmt(median_after_warmup(x["rollout_s"])) for x in (kit, trl, bp)]),
            ("median update (s)", fmt(res["kit_median_update_s"]), fmt(tu), fmt(bu)),
            ("median step, end to end (s)", "-", fmt(res["trl_median_step_s_end_to_end"]),
             fmt(median_after_warmup(bp["step_s_end_to_end"]))),
            ("mean reward", *three("reward_mean")),
            ("reward, first -> last step", first_last(kit), first_last(trl), first_last(bp)),
            ("completion tokens (with EOS)", *three("completion_tokens_mean", ".1f")),
            ("share ended at EOS", *three("eos_frac")),
            ("trained sequences per step", fmt(mean(kit["trained_sequences"]), ".1f"), "all",
             fmt(mean(bp["trained_sequences"]), ".1f")),
            ("total wall (s)", *[fmt(x["total_s"], ".1f") for x in (kit, trl, bp)]),
            ("CPU s per wall s", *[fmt(round(x["cpu_s"] / x["total_s"], 2), ".2f") for x in (kit, trl, bp)]),
            ("load avg (1 min) start -> end",
             *[f"{x['loadavg']['start'][0]} -> {x['loadavg']['end'][0]}" for x in (kit, trl, bp)])]
    w = max(len(r[0]) for r in rows)
    print(f"\n{a.steps} steps of {res['settings']['prompts_per_step']} prompts x {res['settings']['group_size']} "
          f"completions, {a.threads} threads, load avg at start {res['machine']['loadavg_at_start'][0]}")
    print(f"{'':{w}}  {'kit GRPO':>18}  {'TRL GRPOTrainer':>18}  {'TRL BPPOTrainer':>18}")
    for name, k, t, b in rows: print(f"{name:{w}}  {k:>18}  {t:>18}  {b:>18}")
    print(f"ratio TRL / kit (median step): {fmt(res['ratio_trl_over_kit'])}")
    print(f"ratio BPPOTrainer / GRPOTrainer, inside TRL: update {fmt(res['ratio_bppo_over_trl_update'])}, "
          f"step {fmt(res['ratio_bppo_over_trl_step'])}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__": main()
