"""The reward worker: reward functions and an optional reward model, scoring completions."""

from __future__ import annotations

from rlx import models
from rlx.rewards import build_reward


class RewardWorker:
    def __init__(self, config, host=None):
        from rlx.workers.policy import own_host

        host, _ = own_host(config, host)
        self.reward = build_reward(config.reward, host, device=models.resolve_device(config.training.device))

    def score(self, prompts: list[str], completions: list[str], labels: list, columns: dict[str, list]):
        """One reward (and score) per completion, with the pipeline's metrics."""
        return self.reward(prompts, completions, labels, columns)
