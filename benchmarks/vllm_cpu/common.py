"""What the scripts here share: rlx's tiny model, prompts, the HF reference log-probs, and
rlx's vLLM engine with some of its parts switched off (to measure what each part is for)."""

from __future__ import annotations

import contextlib
import os

TOL = 1e-5
# the engine's worker set-up calls (rlx.engines.vllm_worker.WeightSync)
FULL_VOCAB = "rlx_full_vocab_logprobs"
EAGER_RANKS = "rlx_eager_logprob_ranks"


def model_path(tied: bool = True) -> str:
    """``builtin:tiny`` (head size 32, as vLLM's CPU backend needs), or the same model
    with an output head of its own, built once beside it."""
    import shutil
    import tempfile

    from rlx.tiny import builtin_model, cache_dir, make_model

    if tied:
        return builtin_model("builtin:tiny")
    path = cache_dir() / "models" / "tiny-untied"
    if not path.is_dir():  # built beside it and renamed into place, so a half-built folder is never used
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tiny-untied-", dir=path.parent)
        try:
            make_model(tmp, tie=False)
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(path)


def prompts(tokenizer, n: int = 8) -> list[list[int]]:
    """Token ids of ``n`` arithmetic prompts ("80+55=")."""
    from rlx.tasks import TASKS, prompt_rows

    return [tokenizer(row["prompt"])["input_ids"] for row in prompt_rows(TASKS["arithmetic"], n, seed=1)]


def hf_token_logprobs(model, prompt, completion, temperature=1.0):
    """log softmax(logits / T)[token] for each completion token, from one HF forward."""
    import torch

    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    lp = (logits / temperature).log_softmax(-1)
    tok = torch.tensor(completion)
    return lp.gather(-1, tok[:, None]).squeeze(-1), logits.argmax(-1)


def compare(model, prompts, completions, temperature=1.0, check_argmax=False):
    """Largest |engine log-prob - HF log-prob| over all tokens of all completions."""
    import torch

    worst = 0.0
    for c in completions:
        ref, argmax = hf_token_logprobs(model, prompts[c.prompt_index], c.token_ids, temperature)
        got = torch.tensor(c.logprobs)
        diff = (ref - got).abs().nan_to_num(nan=float("inf"))  # a NaN log-prob counts as a failure
        worst = max(worst, diff.max().item() if len(diff) else 0.0)
        if check_argmax:
            assert argmax.tolist() == c.token_ids, (argmax.tolist(), c.token_ids)
    return worst


def vllm_engine(path: str, *, multiprocess: bool = False, logprobs_mode: str | None = None, without=(), **kwargs):
    """``rlx.engines.vllm.VLLMEngine(path, **kwargs)`` as rlx's rollout worker builds it (the
    trainer's float32, the model's EOS ids and context length), changed for a measurement:

    - ``multiprocess``: vLLM's engine core in a process of its own, weights sent to it as
      safetensors bytes (the engine's path for ``tensor_parallel_size > 1``);
    - ``logprobs_mode``: vLLM's mode instead of the engine's ``processed_logprobs``;
    - ``without``: worker set-up calls left out (``FULL_VOCAB``, ``EAGER_RANKS``; in-process
      only: the worker is this process's).
    """
    from unittest import mock

    from transformers import AutoTokenizer

    from rlx.engines import vllm_worker
    from rlx.engines.vllm import VLLMEngine, import_vllm
    from rlx.rollout import eos_ids

    vllm = import_vllm()
    real_llm = vllm.LLM

    def llm(**llm_kwargs):
        if multiprocess:  # the engine has just set it to "0"; vLLM reads it when the engine starts
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        return real_llm(**{**llm_kwargs, **({"logprobs_mode": logprobs_mode} if logprobs_mode else {})})

    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(vllm, "LLM", llm))
        for name in without:
            patches.enter_context(mock.patch.object(vllm_worker.WeightSync, name, lambda self: None))
        defaults = {"dtype": "float32", "max_model_len": 512, "eos_ids": eos_ids(path, AutoTokenizer.from_pretrained(path))}
        built = VLLMEngine(path, **{**defaults, **kwargs})
    built.bytes_sync = built.bytes_sync or multiprocess
    return built
