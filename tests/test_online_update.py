"""The online loop's parts on a tiny model: the update's sequence normaliser, the rollout
engine's log-probs reaching policy losses, the off-policy corrections in a run."""

import json

import pytest
import torch

from rlx import online
from rlx.config import resolve
from rlx.plugins import build_host
from rlx.rollout import Completion
from rlx.run import run
from rlx.launch.local import LocalGroup
from rlx.workers.policy import PolicyWorker
from rlx.testing import one_thread  # noqa: F401


@pytest.fixture(scope="module")
def host():
    return build_host()


def test_update_does_not_count_a_sequence_without_action_tokens(host, tiny_model_dir):
    spec = host.algorithms.get("grpo")
    config = resolve(spec, {"model": {"path": tiny_model_dir}, "training": {"batch_size": 2, "micro_batch_size": 2,
                                                                            "lr": 0.0},
                            "algorithm": {"rollout_batch_size": 1, "n_samples": 2,
                                          "loss_agg": "seq_mean_token_mean"}})
    policy = PolicyWorker(config, host, total_steps=1, micro_steps=1)
    completions = [Completion(0, [5, 6], [-1.0, -1.0], "", "length"), Completion(0, [], [], "", "stop")]
    batch = online.batch_of_completions([[3, 4], [3, 4]], completions, 0, [1.0, 0.0], [0, 0], torch.device("cpu"))
    batch.old_logp = policy.logprobs(batch)
    batch.advantages = torch.ones_like(batch.action_mask)
    metrics = online.update(batch, LocalGroup("policy", policy), None, config.algorithm, config.training,
                            beta=0.0, seed=0)
    # ratio 1, A = 1 on row 0's two tokens: its token mean is −1, and it is the only sequence
    assert metrics["loss/policy"] == pytest.approx(-1.0)


PLUGIN = """
import json
from dataclasses import replace
from pathlib import Path

from rlx import hookimpl
from rlx.plugins import build_host

SEEN = Path(__file__).with_suffix(".json")


def recording(logp, old_logp, advantages, mask, *, config, rollout_logp):
    gap = ((rollout_logp - old_logp.detach()).abs() * mask).max().item()
    SEEN.write_text(json.dumps({"shape": list(rollout_logp.shape), "old_shape": list(old_logp.shape), "gap": gap}))
    return -(logp - logp.detach()).exp() * advantages, {}


@hookimpl
def register_policy_losses(register):
    register("recording", recording)


@hookimpl
def register_algorithms(register):
    from rlx_grpo import GRPO
    register("grpo_recording", replace(GRPO, name="grpo_recording", policy_loss="recording"))
"""


def _train(host, out, algo="grpo", **algorithm):
    tree = {"output": str(out), "logging": {"progress": False, "tensorboard": False}, "training": {"max_steps": 2, "batch_size": 16, "micro_batch_size": 16},
            "algorithm": {"eval_size": 4, "rollout_batch_size": 4, "n_samples": 4, **algorithm}}
    run(resolve(host.algorithms.get(algo), tree), host)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_policy_loss_gets_the_engines_logprobs(demo_policy, tmp_path):
    plugin = tmp_path / "recording_loss.py"
    plugin.write_text(PLUGIN)
    _train(build_host([str(plugin)]), tmp_path / "run", algo="grpo_recording")
    seen = json.loads(plugin.with_suffix(".json").read_text())
    assert seen["shape"] == seen["old_shape"]
    # the engine sampled with the very weights the old log-probs come from
    assert seen["gap"] < 1e-4


@pytest.mark.parametrize("name,metric", [("tis", "correction/clipped_frac"), ("icepop", "correction/masked_frac"),
                                         ("seq_mask_tis", "correction/masked_seq_frac")])
def test_corrections_run_and_log(host, demo_policy, tmp_path, name, metric):
    rows = _train(host, tmp_path / "run", off_policy_correction=name, correction_low=0.9, correction_high=1.1)
    last = rows[-1]
    # on one device the engine samples with the trained weights: nothing is clipped or masked
    assert last[metric] == pytest.approx(0.0)
    assert abs(last["correction/rollout_kl"]) < 1e-3


@pytest.mark.parametrize("name", ["tis", "icepop", "seq_mask_tis"])
def test_a_correction_without_the_old_pass_matches_one_with_it(host, tiny_model_dir, name):
    """One update per rollout: the training forward's detached log-probs stand in for a
    separate old pass, and the correction weighs tokens by them to the same loss and weights."""
    spec = host.algorithms.get("grpo")
    config = resolve(spec, {"model": {"path": tiny_model_dir},
                            "training": {"batch_size": 4, "micro_batch_size": 2, "lr": 1e-3},
                            "algorithm": {"rollout_batch_size": 2, "n_samples": 2, "off_policy_correction": name,
                                          "correction_low": 0.8, "correction_high": 1.2}})
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(5, 60, (n,), generator=g).tolist() for n in (3, 4, 2, 4)]
    completions = [Completion(i // 2, r, [0.0] * len(r), "", "length") for i, r in enumerate(responses)]
    results = []
    for separate in (True, False):
        torch.manual_seed(0)
        policy = PolicyWorker(config, host, total_steps=1, micro_steps=2)
        batch = online.batch_of_completions([[3, 4], [3, 4], [7, 8, 9], [7, 8, 9]], completions, 0,
                                            [1.0, 0.0, 0.5, 0.2], [0, 0, 1, 1], torch.device("cpu"))
        # the engine's log-probs: the policy's own, shifted so that some weights leave the band
        noise = torch.randn(batch.action_mask.shape, generator=torch.Generator().manual_seed(1)) * 0.3
        batch.rollout_logp = (policy.logprobs(batch) + noise) * batch.action_mask
        batch.old_logp = policy.logprobs(batch) if separate else None
        batch.advantages = torch.randn(batch.action_mask.shape, generator=torch.Generator().manual_seed(2))
        metrics = online.update(batch, LocalGroup("policy", policy), None, config.algorithm, config.training,
                                beta=0.0, seed=0)
        results.append((metrics, [p.detach().clone() for p in policy.module().parameters()]))
    (with_pass, weights_with), (without, weights_without) = results
    assert without["loss/policy"] == pytest.approx(with_pass["loss/policy"], rel=1e-5)
    kind = next(k for k in with_pass if k.startswith("correction/") and k != "correction/rollout_kl")
    assert with_pass[kind] > 0 and without[kind] == pytest.approx(with_pass[kind], rel=1e-5)
    # Adam's first step moves every weight by about lr (1e-3) whatever the gradient's size, so
    # float rounding in the two passes shows where a gradient is near zero (up to ~2e-5 seen);
    # a wrong weighing would move them by ~lr
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(weights_with, weights_without))


def test_engines_sleep_by_default_only_beside_the_update_on_its_gpu(host):
    grpo = host.algorithms.get("grpo")
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    auto = resolve(grpo, {}).rollout
    assert online.engine_sleeps(auto, "local", "native", gpu)
    assert not online.engine_sleeps(auto, "local", "native", cpu)
    assert not online.engine_sleeps(auto, "ray", "native", gpu)  # an engine of its own, elsewhere
    assert not online.engine_sleeps(auto, "local", "vllm", gpu)  # vLLM sleeps only when asked
    overlapped = resolve(grpo, {"rollout": {"overlap": True}, "algorithm": {"off_policy_correction": "tis"}}).rollout
    assert not online.engine_sleeps(overlapped, "local", "native", gpu)
    assert online.engine_sleeps(resolve(grpo, {"rollout": {"sleep": True}}).rollout, "ray", "vllm", cpu)
    assert not online.engine_sleeps(resolve(grpo, {"rollout": {"sleep": False}}).rollout, "local", "native", gpu)
