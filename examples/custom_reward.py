"""Your own reward and data set in the kit's one loop: python examples/custom_reward.py [STEPS] [OUT] [--resume]"""
import sys
from datasets import Dataset
from bppo_kit.api import RLTrainer
from bppo_kit.data import synthetic_example, synthetic_stream
from bppo_kit.verifier import score

def concise_and_right(completions, answer, budget, **kwargs):
    "1 for a right answer within its row's `budget` characters, 0.5 for a longer right one, 0 when wrong"
    return [(1.0 if len(c) <= b else 0.5) * score(c, a, "synthetic").correct
            for c, a, b in zip(completions, answer, budget)]

problems = synthetic_stream(seed=1)  # any rows with a `prompt` column will do; these are the built-in task's
rows = [{"prompt": e.prompt, "answer": e.answer, "budget": 40}
        for e in (synthetic_example(next(problems)) for _ in range(320))]
args = [a for a in sys.argv[1:] if a != "--resume"]
steps, out = int(args[0]) if args else 40, args[1] if len(args) > 1 else "runs/custom_reward"
trainer = RLTrainer("tiny", "bppo", {"train.steps": steps, "train.out": out}, reward_funcs=concise_and_right,
                    train_dataset=Dataset.from_list(rows[64:]), eval_dataset=Dataset.from_list(rows[:64]))
s = trainer.train(resume="--resume" in sys.argv, overwrite="--resume" not in sys.argv)
print(f"accuracy {s['first_eval']['accuracy']:.3f} -> {s['last_eval']['accuracy']:.3f}, reward "
      f"{s['first_eval']['reward_mean']:.3f} -> {s['last_eval']['reward_mean']:.3f}; run folder {s['run_dir']}")
