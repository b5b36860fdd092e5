"""Partial rollouts (``rlx.partial``): responses made in segments give what one call gives,
and a weight update between two segments changes only the later tokens, which continue
the earlier ones as token ids. The runs with overlap are in test_overlap.py."""

import pytest
import torch

from rlx.partial import generate_in_segments
from rlx.rollout import NativeEngine, SamplingParams
from test_rollout import PROMPTS, make_model, tokenizer  # noqa: F401 (tokenizer: a fixture)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]


def segmented(engine, prompts, params, segment, version=lambda: 0):
    return generate_in_segments(engine.generate, prompts, params, segment, version, engine.tokenizer)


@pytest.mark.parametrize("segment", [1, 5, 12])
def test_segments_without_a_weight_change_give_the_one_call_tokens(tokenizer, prompts, segment):
    engine = NativeEngine(make_model(), tokenizer, max_batch_size=4)
    greedy = SamplingParams(n=2, greedy=True, max_new_tokens=12)
    plain = engine.generate(prompts, greedy)
    # a stop string across the boundary after the 5th token of prompt 1's response ends it
    # there, though no segment sees all of it; prompt 2's runs to its length
    stop = plain[2].text[4:6]
    assert len(stop) == 2 and plain[2].finish_reason == "length"
    for params in (greedy, SamplingParams(n=2, greedy=True, max_new_tokens=12, stop=(stop,))):
        whole, parts = engine.generate(prompts, params), segmented(engine, prompts, params, segment)
        assert [c.token_ids for c in parts] == [c.token_ids for c in whole]
        assert [(c.prompt_index, c.text, c.finish_reason) for c in parts] == \
            [(c.prompt_index, c.text, c.finish_reason) for c in whole]
        for a, b in zip(parts, whole):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
            assert a.versions == [0] * len(a.token_ids)
    assert any(c.finish_reason == "stop" for c in parts) and any(c.finish_reason == "length" for c in parts)


def test_a_weight_update_between_segments_changes_only_the_later_tokens(tokenizer, prompts):
    old, new = make_model(0), make_model(1)
    engine = NativeEngine(make_model(0), tokenizer)
    calls = []

    def version():  # the update lands before the third segment
        calls.append(len(calls))
        if len(calls) == 3:
            engine.update_weights(new.state_dict())
        return 7 if len(calls) >= 3 else 6

    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=3)
    out = segmented(engine, prompts, params, 4, version)
    assert len(calls) == 3
    before = NativeEngine(old, tokenizer)
    after = NativeEngine(new, tokenizer)
    greedy = SamplingParams(greedy=True, max_new_tokens=12)
    for c in out:
        assert c.versions == [6] * min(len(c.token_ids), 8) + [7] * (len(c.token_ids) - 8)
        prompt = prompts[c.prompt_index]
        # each token's log-prob is that of the weights that sampled it, given the same token
        # ids before it (nothing decoded and encoded again between segments)
        for model, span in ((old, slice(0, 8)), (new, slice(8, None))):
            with torch.no_grad():
                logits = model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1:-1]
            expected = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            assert c.logprobs[span] == pytest.approx(expected[span].tolist(), abs=1e-4)
    # greedy: the old weights' first 8 tokens, then what the new weights make of that prefix
    calls.clear()
    engine.update_weights(old.state_dict())
    out = segmented(engine, prompts, greedy, 4, version)
    for c in out:
        prompt = prompts[c.prompt_index]
        expected = before.generate([prompt], greedy)[0].token_ids
        if len(expected) > 8:
            expected = expected[:8] + after.generate([prompt + expected[:8]], SamplingParams(
                greedy=True, max_new_tokens=4))[0].token_ids
        assert c.token_ids == expected
    assert len(calls) == 3 and max(len(c.token_ids) for c in out) > 8
