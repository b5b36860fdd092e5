"""Rollout engines: sample completions of prompts, with the log-prob of every sampled token.

``RolloutEngine`` is the interface the trainers use; ``NativeEngine`` fills it with a
transformers causal LM and a decode loop of its own (left-padded batches, a KV cache,
temperature / top-k / top-p sampling), so that sampling and log-probs are under rlx's
control. Faster engines (vLLM, ...) implement the same four methods.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedTokenizerFast

from rlx.engines.static_decode import StaticDecoder, sample, supports
from rlx.multimodal import ModelInputs, collate, model_positions, padded_positions, present


@dataclass
class SamplingParams:
    """How to sample: ``n`` completions per prompt, at most ``max_new_tokens`` each.

    ``greedy`` (or ``temperature=0``) takes the arg-max token; ``top_k=0`` and
    ``top_p=1.0`` switch those truncations off. ``stop`` strings end a completion like
    EOS does. ``seed`` makes sampling reproducible.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None
    greedy: bool = False


@dataclass
class Completion:
    """One sampled completion of prompt ``prompt_index``.

    ``token_ids`` are the sampled tokens, EOS included when it ended the completion;
    ``logprobs[k]`` is the log-prob of ``token_ids[k]`` under softmax(logits / T).
    ``text`` is the decoded completion without special tokens. ``finish_reason`` is
    ``"stop"`` (EOS or a stop string) or ``"length"`` (``max_new_tokens`` reached).
    ``versions[k]`` is the policy version whose weights sampled ``token_ids[k]``, when a
    rollout made in segments records it (``rlx.partial``); engines leave it None.
    """

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length"]
    versions: list[int] | None = None


@runtime_checkable
class RolloutEngine(Protocol):
    """What trainers need from an inference engine."""

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 inputs: list[ModelInputs] | None = None) -> list[Completion]:
        """``params.n`` completions per prompt, prompt-major: prompt 0's n, then prompt 1's ...
        ``inputs`` gives each prompt's model inputs beyond its ids (images), when it has any."""
        ...

    def update_weights(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Load the trainer's current weights: a module or a state dict of named tensors."""
        ...

    def sleep(self) -> None:
        """Release memory between rollouts (optional)."""

    def wake(self) -> None:
        """Take memory back before the next rollout (optional)."""


class NativeEngine(RolloutEngine):
    """Rollouts with a transformers causal LM and a decode loop of rlx's own.

    The engine holds a reference to ``model``: when that is the actor being trained,
    generation sees every optimizer step at once and ``update_weights(model)`` is a
    no-op. Up to ``max_batch_size`` sequences decode at once, always whole groups of the n
    samples of a prompt: each prompt is prefilled once and its KV cache copied to its n
    samples. Llama-family models then decode with a static cache (and on CUDA, unless
    ``cuda_graphs`` is off, from captured CUDA graphs: ``rlx.engines.static_decode``), the
    next prompts joining as rows finish; others with transformers' growing cache, a batch
    at a time, rows leaving it as they finish.

    Log-probs are taken under softmax(logits / T) before top-k/top-p truncation, the
    distribution the trainer recomputes (docs/algorithms/README.md: training log-probs
    use logits / temperature); greedy decoding reports them at T = 1 when temperature
    is 0.

    A stop string ends the completion at the token that completes it: ``token_ids``
    and ``logprobs`` keep every sampled token, ``text`` keeps the stop string and drops
    whatever that last token decoded to after it.

    Prompts with images (``inputs``) are prefilled with their image tensors and their
    multi-axis positions (M-RoPE); the response's positions continue from the prompt's
    largest, the same on every axis, in whichever loop decodes them.
    """

    def __init__(self, model: Any, tokenizer: Any, *, device: str | torch.device | None = None, max_batch_size: int = 64,
                 cuda_graphs: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = _pad_id(model, tokenizer, self.eos_ids)
        self.banned = _vision_ids(model.config, self.device)
        self.static = StaticDecoder(model, self.device, graphs=cuda_graphs, banned=self.banned) if supports(model) \
            else None

    def sleep(self) -> None:
        """Free the decode loop's KV cache while the policy trains. Its CUDA graphs stay where
        the cache's addresses can be kept (``rlx.engines.remap``); else they go too, and the
        next rollout captures them again."""
        if self.static is not None:
            self.static.sleep()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """Hand the blocks the update cached back to the device: the KV cache and the graphs'
        private pool cannot reuse them, so kept they would stack on the rollout's peak."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def update_weights(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        if weights is self.model:
            return
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        # a part of the weights (the adapted layers under LoRA) updates those layers
        unexpected = self.model.load_state_dict(state, strict=False).unexpected_keys
        if unexpected:
            raise ValueError(f"update_weights: the model has no tensors named {unexpected[:5]}")

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 inputs: list[ModelInputs] | None = None) -> list[Completion]:
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if params.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
        if not prompt_ids:
            return []
        generator = None
        if params.seed is not None:
            generator = torch.Generator(self.device).manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                if self.static is not None:
                    return self._generate_static(prompt_ids, params, generator, inputs)
                completions = []
                prompts_per_batch = max(1, self.max_batch_size // params.n)
                for start in range(0, len(prompt_ids), prompts_per_batch):
                    batch = prompt_ids[start : start + prompts_per_batch]
                    batch_inputs = inputs[start : start + prompts_per_batch] if inputs is not None else None
                    completions += self._generate_batch(batch, start, params, generator, batch_inputs)
                return completions
        finally:
            self.model.train(was_training)

    def _generate_static(self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator | None,
                         inputs: list[ModelInputs] | None) -> list[Completion]:
        """All the prompts through ``StaticDecoder`` in one run, up to ``max_batch_size``
        sequences at a time, prompts joining as rows finish."""
        n, finished = params.n, self._finished(params)

        def prefill(first: int, count: int):
            cache, logits, attention, positions = self._prefill(
                prompts[first : first + count], inputs[first : first + count] if inputs is not None else None)
            return cache, logits, attention, positions[:, -1] + 1

        capacity = max(1, self.max_batch_size // n) * n
        tokens, logprobs = self.static.run(prefill, len(prompts), max(len(p) for p in prompts), n, capacity, params,
                                           _seed(generator, self.device), finished)
        return self._completions(0, tokens, logprobs, finished, params)

    def _generate_batch(
        self, prompts: list[list[int]], first_index: int, params: SamplingParams, generator: torch.Generator | None,
        inputs: list[ModelInputs] | None = None,
    ) -> list[Completion]:
        """One batch of prompts through the plain transformers loop."""
        finished = self._finished(params)
        cache, logits, attention, positions = self._prefill(prompts, inputs)
        tokens, logprobs = self._decode(cache, logits, attention, positions, params.n, params,
                                        torch.Generator(self.device).manual_seed(_seed(generator, self.device)),
                                        finished)
        return self._completions(first_index, tokens, logprobs, finished, params)

    def _prefill(self, prompts: list[list[int]], inputs: list[ModelInputs] | None):
        """One forward over ``prompts``, left-padded so that every prompt's last token sits in
        the last column, where decoding starts. Returns its cache, the last logits (float32),
        the attention mask and the positions (on one axis: a VLM's response goes on from the
        largest of its prompt's)."""
        width = max(len(p) for p in prompts)
        # filled on the host and copied once, not two copies and kernels a prompt
        ids = np.full((len(prompts), width), self.pad_id, dtype=np.int64)
        attention = np.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt
            attention[row, width - len(prompt) :] = 1
        ids, attention = (torch.from_numpy(a).to(self.device) for a in (ids, attention))
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        extra = {}
        if inputs is not None:
            extra, _ = collate(inputs)
            extra = {k: v.to(self.device) for k, v in present(extra).items()}
            if inputs[0].positions is not None:
                axes = padded_positions([i.positions for i in inputs], [len(p) for p in prompts], width, left=True)
                positions = model_positions(axes.to(self.device))

        cache = DynamicCache(config=self.model.config)
        with eager(self.model):
            out = self.model(
                input_ids=ids,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                **extra,
            )
        if positions.dim() == 3:  # the response goes on from the largest position, on every axis
            positions = positions.amax(0).cummax(-1).values
        return cache, out.logits[:, -1].float(), attention, positions

    def _finished(self, params: SamplingParams) -> Ends:
        return Ends(self.eos_ids, params.stop, self.tokenizer.decode)

    def _completions(self, first_index: int, tokens: list[list[int]], logprobs: list[list[float]], finished,
                     params: SamplingParams) -> list[Completion]:
        completions = []
        for row, (row_tokens, row_logprobs, text) in enumerate(zip(tokens, logprobs, texts(self.tokenizer, tokens))):
            done = bool(row_tokens) and finished(row_tokens)
            if done and row_tokens[-1] not in self.eos_ids:
                text = _cut_after_stop(text, params.stop)
            completions.append(Completion(first_index + row // params.n, row_tokens, row_logprobs, text,
                                          "stop" if done else "length"))
        return completions

    def _decode(self, cache, logits, attention, positions, n: int, params: SamplingParams,
                generator: torch.Generator | None, finished) -> tuple[list[list[int]], list[list[float]]]:
        """The plain transformers decode loop (models ``StaticDecoder`` does not drive):
        a growing cache, and rows that finish leave the batch."""
        # One prefill per prompt, shared by its n samples.
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, 0)
        attention = attention.repeat_interleave(n, 0)
        next_position = positions[:, -1:].repeat_interleave(n, 0) + 1
        rows = len(logits)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        active = list(range(rows))  # the rows still in the batch, in batch order
        draw_rows = None
        for step in range(params.max_new_tokens):
            token, logprob = sample(logits, params, generator, banned=self.banned, rows=draw_rows)
            keep = []
            for b, (row, tok, lp) in enumerate(zip(active, token.tolist(), logprob.tolist())):
                tokens[row].append(tok)
                logprobs[row].append(lp)
                if not finished(tokens[row]):
                    keep.append(b)
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                token, attention, next_position = token[index], attention[index], next_position[index]
                active = [active[b] for b in keep]
                draw_rows = (torch.tensor(active), rows)
            attention = torch.cat([attention, attention.new_ones(len(active), 1)], dim=1)
            with eager(self.model):
                out = self.model(input_ids=token[:, None], attention_mask=attention, position_ids=next_position,
                                 past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1].float()
            next_position = next_position + 1
        return tokens, logprobs


class Ends:
    """Whether a completion's tokens end it: its last token is an EOS, or it completes a
    stop string. Called with one completion's tokens; a decoder that checks many rows at
    once reads ``eos`` and asks ``hits_stop`` only where there are stop strings."""

    def __init__(self, eos: set[int], stop: tuple[str, ...], decode):
        self.eos, self.stop, self._decode = eos, stop, decode
        self._longest = max((len(s) for s in stop), default=0)

    def __call__(self, tokens: list[int]) -> bool:
        return tokens[-1] in self.eos or self.hits_stop(tokens)

    def hits_stop(self, tokens: list[int]) -> bool:
        """Whether the newest token completes a stop string.

        Only a tail of the completion is decoded, long enough to hold the longest stop
        string (a token decodes to at least one character), which keeps the check cheap
        for long completions: earlier occurrences were caught at earlier steps.
        """
        if not self.stop:
            return False
        tail = self._decode(tokens[-(self._longest + 2):], skip_special_tokens=True)
        return any(s in tail for s in self.stop)


def _seed(generator: torch.Generator | None, device: torch.device) -> int:
    """A seed for one decode run, drawn from the caller's generator: the static and the plain
    loop then draw the same random numbers for the same rows of a batch."""
    return int(torch.randint(2**62, (1,), generator=generator, device=device))


def eager(model: torch.nn.Module):
    """Run the policy's compiled layers (``training.compile``) eagerly in a rollout: a
    rollout's shapes would make them compile again, and once they have seen two shapes
    Dynamo compiles them for dynamic shapes, which the update then runs too. The stance is
    global, so a model with nothing compiled (an engine's own copy, sampling beside the
    update in another thread) leaves it alone."""
    if any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()):
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


# a VLM's tokens that stand for images: a response holding one would ask the next forward
# for pixels it does not have
VISION_TOKEN_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                    "image_token_index")


def _vision_ids(config: Any, device: torch.device) -> torch.Tensor | None:
    """The ids a VLM's responses must never hold (its image and video tokens); None for a
    text-only model."""
    ids = [getattr(config, name) for name in VISION_TOKEN_IDS if isinstance(getattr(config, name, None), int)]
    return torch.tensor(ids, device=device) if ids else None


def texts(tokenizer: Any, rows: list[list[int]]) -> list[str]:
    """``tokenizer.decode(row, skip_special_tokens=True)`` of each row. A fast tokenizer whose
    decode is its Rust backend's, with no clean-up of spaces, decodes them all in one call on
    every core: W1's 512 rows of 512 tokens took 0.1 s a row at a time."""
    cls = type(tokenizer)
    if (isinstance(tokenizer, PreTrainedTokenizerFast) and not tokenizer.clean_up_tokenization_spaces
            and cls.decode is PreTrainedTokenizerFast.decode and cls._decode is PreTrainedTokenizerFast._decode):
        return tokenizer.backend_tokenizer.decode_batch(rows, skip_special_tokens=True)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def _cut_after_stop(text: str, stop: tuple[str, ...]) -> str:
    """``text`` up to and including the earliest stop string in it."""
    ends = [text.find(s) + len(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every EOS id named by the generation config, the model config or the tokenizer."""
    return _eos_of(getattr(model, "generation_config", None), model.config, tokenizer)


def eos_ids(path: str, tokenizer: Any) -> set[int]:
    """The EOS ids of a model folder, as ``NativeEngine`` finds them on the loaded model
    (an engine that stops only on the tokenizer's EOS would miss a chat model's end of turn)."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:
        generation = None
    return _eos_of(generation, AutoConfig.from_pretrained(path), tokenizer)


def _eos_of(*sources: Any) -> set[int]:
    ids: set[int] = set()
    for source in sources:
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    return ids


def _pad_id(model: Any, tokenizer: Any, eos_ids: set[int]) -> int:
    """A token to fill left padding with; it is masked out, so any valid id will do."""
    for source in (tokenizer, getattr(model, "generation_config", None), model.config):
        pad = getattr(source, "pad_token_id", None)
        if pad is not None:
            return pad
    return min(eos_ids, default=0)
