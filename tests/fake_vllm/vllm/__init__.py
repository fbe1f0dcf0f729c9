"""A recorder standing in for vLLM (tests/test_vllm_build.py): `LLM` logs how the kit builds and drives it and answers
with short fixed completions. Nothing is computed; on PYTHONPATH it is what `import vllm` finds."""
import json, os
from types import SimpleNamespace as NS

EVENTS: list[dict] = []  # this process's log; also appended to `$FAKE_VLLM_LOG.RANK` when that is set
WEIGHTS: list[dict] = []  # the weights of every push, in order (this process)
__version__ = "0.11.0"  # a release the kit accepts (VLLMCompat.OLDEST and later)


def record(kind: str, **kw):
    EVENTS.append(dict(kind=kind, **kw))
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(f"{path}.{os.environ.get('RANK', '0')}", "a") as f:
            f.write(json.dumps(EVENTS[-1], default=str) + "\n")


class SamplingParams:
    def __init__(self, n=1, top_k=0, max_tokens=16, stop_token_ids=(), seed=None, **kw):
        self.n, self.top_k, self.max_tokens, self.seed = n, top_k, max_tokens, seed
        self.stop_token_ids = list(stop_token_ids)


class _Runner:  # current vLLM's model runner: a layer-wise reload that takes the weights it is given
    def reload_weights(self, weights_iterator=None, is_checkpoint_format=True): pass


class LLM:
    def __init__(self, model, **kw):
        env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        record("LLM", model=str(model), env=env, **kw)
        self.llm_engine = NS(model_config=NS(max_model_len=kw.get("max_model_len") or 2048),
                             engine_core=NS(shutdown=lambda: record("shutdown")))
        self.worker = NS(model_runner=_Runner(), reload_weights=True)

    def sleep(self, level=1): record("sleep", level=level)
    def wake_up(self, tags=None): record("wake_up", tags=tags)
    def reset_prefix_cache(self): record("reset_prefix_cache")

    def collective_rpc(self, method, kwargs=None):
        if callable(method): return [method(self.worker)]
        w = {k: v.detach().to("cpu").clone() for k, v in kwargs["weights_iterator"]}
        WEIGHTS.append(w)
        record(method, tensors=len(w), dtypes=sorted({str(v.dtype) for v in w.values()}))
        return [None]

    def generate(self, prompts, params, use_tqdm=False):
        record("generate", prompts=len(prompts))
        outs = []
        for p, sp in zip(prompts, params):
            ids, stop = p["prompt_token_ids"], sp.stop_token_ids[0]
            samples = []
            for j in range(sp.n):
                k = 1 + ((sp.seed or 0) + j) % 3
                toks = ([ids[-1]] * k)[:sp.max_tokens - 1] + [stop]
                samples.append(NS(index=j, token_ids=toks, logprobs=[{t: NS(logprob=-0.5)} for t in toks],
                                  finish_reason="stop", stop_reason=stop))
            outs.append(NS(outputs=samples))
        return outs
