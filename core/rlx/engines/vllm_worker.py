"""Methods vLLM mixes into its worker class (``worker_extension_cls``), reached through
``LLM.collective_rpc``. vLLM imports this module inside its worker process, so it
imports nothing heavy at the top. ``self`` is vLLM's worker; ``self.model_runner`` its
model runner (vLLM 0.32's V1 runner)."""

from __future__ import annotations


class WeightSync:
    def rlx_load_weights(self, named: dict) -> int:
        """Load Hugging Face-named tensors into the live model (in-process: tensors as they are)."""
        self.model_runner.reload_weights(weights_iterator=iter(named.items()))
        return len(named)

    def rlx_load_weights_bytes(self, payload: bytes) -> int:
        """The same from one safetensors blob (a separate engine process cannot take tensors)."""
        from safetensors.torch import load

        named = load(payload)
        self.model_runner.reload_weights(weights_iterator=iter(named.items()))
        return len(named)

    def rlx_full_vocab_logprobs(self) -> None:
        """Report log softmax(logits / T) over the whole vocabulary, before top-k / top-p.

        That is the distribution rlx's trainer recomputes. In ``processed_logprobs`` mode
        vLLM's sampler reports the log-probs its top-k/top-p sampler returns, which are
        renormalised over the kept tokens. The wrapper takes them from the logits as they
        arrive (already divided by T, not yet truncated, which happens in place) and lets
        the original only sample.
        """
        import torch

        sampler = self.model_runner.sampler
        if sampler.logprobs_mode != "processed_logprobs":
            raise RuntimeError(f"needs logprobs_mode='processed_logprobs', not {sampler.logprobs_mode!r}")
        inner = sampler.topk_topp_sampler
        if getattr(inner, "_rlx_full_vocab", False):
            return
        original = inner.forward
        inner.logprobs_mode = "raw_logprobs"  # so that the original skips its own log_softmax

        def forward(logits, generators, k, p):
            full = logits.log_softmax(dim=-1, dtype=torch.float32)
            banned = getattr(sampler, "_rlx_banned", None)
            if banned is not None:
                logits.index_fill_(-1, banned.to(logits.device), float("-inf"))
            sampled, _ = original(logits, generators, k, p)
            return sampled, full

        inner.forward = forward
        inner._rlx_full_vocab = True

    def rlx_ban_tokens(self, ids: list[int]) -> None:
        """Never sample ``ids`` (a VLM's image tokens), greedy or not, while reporting
        log-probs over the whole vocabulary as before: the ban shapes the draw only."""
        import torch

        sampler = self.model_runner.sampler
        sampler._rlx_banned = torch.tensor(ids, dtype=torch.long)
        if getattr(sampler, "_rlx_greedy_ban", False):
            return
        greedy = sampler.greedy_sample

        def greedy_sample(logits):
            return greedy(logits.index_fill(-1, sampler._rlx_banned.to(logits.device), float("-inf")))

        sampler.greedy_sample = greedy_sample
        sampler._rlx_greedy_ban = True

    def rlx_eager_logprob_ranks(self) -> None:
        """vLLM ranks each sampled token with a ``torch.compile``d function, even in eager
        mode: the first generate on a CPU compiled for 4-19 s. rlx does not use the ranks."""
        import vllm.v1.sample.sampler as sampler_module

        sampler_module.batched_count_greater_than = lambda x, values: (x >= values).sum(-1)
