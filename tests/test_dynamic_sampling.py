"""Dynamic sampling inside the rollout: which groups a step keeps, and what it logs."""

from rlx.online import PromptStream, generate_scored, rollout
from rlx.plugins import build_host
from rlx.rewards import RewardResult
from rlx.rollout import Completion, SamplingParams

N = 4


class PatternEngine:
    """Prompt k answers right on all samples (k % 3 == 0), on half (1) or on none (2)."""

    def generate(self, prompt_ids, params):
        return [Completion(i, [1], [0.0], str(int(ids[0] % 3 == 0 or (ids[0] % 3 == 1 and j % 2 == 0))), "stop")
                for i, ids in enumerate(prompt_ids) for j in range(params.n)]


def reward(prompts, completions, labels, columns):
    scores = [float(c) for c in completions]
    return RewardResult(rewards=scores, scores=scores, metrics={})


def sample(prompts, params):
    return generate_scored(prompts, PatternEngine().generate, params, reward)


def stream(count):
    return PromptStream([{"prompt_ids": [k], "prompt_text": str(k), "label": ""} for k in range(count)], seed=0)


def test_only_mixed_groups_are_kept_and_more_prompts_are_drawn():
    sampler = build_host().get("register_samplers", "dynamic_filter")({"max_rounds": 5})
    prompts, completions, rewards, metrics = rollout(stream(30), sample, SamplingParams(n=N, seed=1), sampler,
                                                     batch=4)
    assert len(prompts) == 4 and len(completions) == len(rewards) == 4 * N
    assert all(p["prompt_ids"][0] % 3 == 1 for p in prompts)  # only groups with signal
    assert 0 < metrics["sampler/pass_rate"] < 1 and metrics["sampler/rounds"] > 1


def test_out_of_rounds_the_batch_is_filled_without_repeats():
    sampler = build_host().get("register_samplers", "dynamic_filter")({"max_rounds": 0})
    prompts, completions, _, metrics = rollout(stream(30), sample, SamplingParams(n=N, seed=1), sampler, batch=6)
    ids = [p["prompt_ids"][0] for p in prompts]
    assert len(ids) == len(set(ids)) == 6 and len(completions) == 6 * N
    assert metrics["sampler/rounds"] == 1
    kept = sum(i % 3 == 1 for i in ids)
    assert metrics["sampler/pass_rate"] == kept / 6


def test_prompt_stream_is_a_fresh_permutation_each_epoch_and_resumes_from_its_cursor():
    first = stream(10)
    taken = [p["prompt_ids"][0] for p in first.take(25)]
    assert sorted(taken[:10]) == sorted(taken[10:20]) == list(range(10))  # each epoch sees every prompt once
    assert taken[:10] != taken[10:20]
    resumed = stream(10)
    resumed.cursor = 13  # as a checkpoint restores it, mid-epoch
    assert [p["prompt_ids"][0] for p in resumed.take(12)] == taken[13:25]
