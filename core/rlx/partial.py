"""Partial rollouts (``rollout.partial_tokens``): responses made in segments, so that a
weight update can land in the middle of a rollout.

Each segment is one call of the engine's ordinary ``generate``: at most ``partial_tokens``
new tokens of every response that has not finished. Before each segment the engine may
take newer weights; a response that goes on is continued from its prompt and its tokens
so far, as token ids (nothing is decoded and encoded again), under the weights the engine
holds then. Every token records the policy version that sampled it, and its log-prob is
that version's, so the off-policy correction weighs each token against the policy that
made it.

Without a weight change, the segments give what one call would: the same greedy tokens
(up to rounding: the engine prefills a continued response where one call decodes it) and
the same stops (a stop string that spans two segments is caught here; the engine sees one
segment only).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

from rlx.rollout import Completion, SamplingParams, _cut_after_stop

# the seed of a later segment: far from the next steps' seeds and the sampler's extra rounds
SEGMENT_SEED_STRIDE = 104_729


def generate_in_segments(generate: Callable, prompt_ids: list[list[int]], params: SamplingParams, segment: int,
                         version: Callable[[], int], tokenizer) -> list[Completion]:
    """``params.n`` completions per prompt, prompt-major, as ``generate(prompt_ids, params)``
    gives them, made ``segment`` new tokens at a time. ``version()`` runs before each
    segment: it may load newer weights into the engine, and returns the version the engine
    holds, which the segment's tokens record."""
    held = version()
    first = dataclasses.replace(params, max_new_tokens=min(segment, params.max_new_tokens))
    completions = [dataclasses.replace(c, versions=[held] * len(c.token_ids)) for c in generate(prompt_ids, first)]
    for round_ in itertools.count(1):
        going = [i for i, c in enumerate(completions)
                 if c.finish_reason == "length" and len(c.token_ids) < params.max_new_tokens]
        if not going:
            return completions
        held = version()
        made = len(completions[going[0]].token_ids)  # the same for all: each segment ran to its length
        more = dataclasses.replace(params, n=1, max_new_tokens=min(segment, params.max_new_tokens - made),
                                   seed=None if params.seed is None else params.seed + round_ * SEGMENT_SEED_STRIDE)
        prefixes = [prompt_ids[completions[i].prompt_index] + completions[i].token_ids for i in going]
        for i, tail in zip(going, generate(prefixes, more)):
            completions[i] = _joined(completions[i], tail, held, params.stop, tokenizer)


def _joined(head: Completion, tail: Completion, version: int, stop: tuple[str, ...], tokenizer) -> Completion:
    """``head`` continued by ``tail`` (sampled by ``version``'s weights), with the text and
    finish reason that one call would have given."""
    tokens, logprobs = head.token_ids + tail.token_ids, head.logprobs + tail.logprobs
    versions = head.versions + [version] * len(tail.token_ids)
    reason = tail.finish_reason
    end = _stop_across(tokens, len(head.token_ids), stop, tokenizer) if stop else None
    if end is not None:
        tokens, logprobs, versions, reason = tokens[:end], logprobs[:end], versions[:end], "stop"
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if reason == "stop":
        text = _cut_after_stop(text, stop)
    return dataclasses.replace(head, token_ids=tokens, logprobs=logprobs, versions=versions, text=text,
                               finish_reason=reason)


def _stop_across(tokens: list[int], boundary: int, stop: tuple[str, ...], tokenizer) -> int | None:
    """Where one call would have stopped ``tokens`` on a stop string completed by one of
    the first tokens after ``boundary`` whose text reaches back before it (the engine saw
    only its own segment); None if there is none. The window is the native engine's: the
    last ``longest stop + 2`` tokens."""
    longest = max(len(s) for s in stop)
    for end in range(boundary + 1, min(len(tokens), boundary + longest + 2) + 1):
        tail = tokenizer.decode(tokens[max(0, end - longest - 2):end], skip_special_tokens=True)
        if any(s in tail for s in stop):
            return end
    return None
