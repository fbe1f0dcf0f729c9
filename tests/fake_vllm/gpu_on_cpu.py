"""A `--plugin` for tests/test_vllm_build.py: the vLLM engine on this CPU, with the recorder for vLLM and sleep mode
on (vLLM's is CUDA-only), and PyTorch's `empty_cache` logged where the engine calls it."""
import dataclasses
import torch
import vllm
from bppo_kit.rollout import VLLMCompat, VLLMEngine

VLLMEngine.caps = dataclasses.replace(VLLMEngine.caps, device=None)
VLLMCompat.sleeps = staticmethod(lambda device: True)
torch.cuda.empty_cache = lambda: vllm.record("empty_cache")
