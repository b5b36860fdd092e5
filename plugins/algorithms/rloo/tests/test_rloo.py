"""The RLOO estimator against numbers worked out by hand."""

import torch

from rlx.config import resolve
from rlx.plugins import build_host


def test_leave_one_out_baseline():
    host = build_host()
    config = resolve(host.algorithms.get("rloo"), {}).algorithm
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    # r_0 − (0+0+0)/3 = 1; r_j − (1+0+0)/3 = −1/3 for the others; γ = 1 sums to every token
    advantages, _, _ = host.get("register_advantage_estimators", "rloo")(
        torch.tensor([1.0, 0.0, 0.0, 0.0]), mask, kl=None, beta=0.0, values=None,
        group_ids=torch.zeros(4, dtype=torch.long), n_samples=4, config=config)
    third = -1 / 3
    assert torch.allclose(advantages, torch.tensor([[1.0, 1.0], [third, 0.0], [third, third], [third, 0.0]]))
