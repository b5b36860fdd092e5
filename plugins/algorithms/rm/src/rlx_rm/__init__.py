"""Reward-model training on preference pairs.

A scalar head reads the reward r at the last non-pad token of prompt + response.
Bradley-Terry: L = −log σ(r_c − r_r − m), with m an optional per-pair margin column.
Log-exp: L = log(1 + exp(r_r − r_c)) (the same function without a margin; kept as its
own name because users ask for it). Accuracy is the fraction of pairs with r_c > r_r.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import opt


@dataclass
class RMConfig:
    preference_loss: str = opt("bradley_terry", "pairwise loss: bradley_terry or log_exp")
    margin_key: str = opt("", "column holding a per-pair margin m (empty: no margin)")


def bradley_terry(scores, *, config):
    loss = ops.bt_loss(scores.chosen, scores.rejected, scores.margin)
    return loss, _metrics(scores)


def log_exp(scores, *, config):
    loss = ops.log_exp_loss(scores.chosen, scores.rejected)
    return loss, _metrics(scores)


def _metrics(scores):
    return {
        "accuracy": (scores.chosen > scores.rejected).float(),
        "reward/chosen": scores.chosen.detach(),
        "reward/rejected": scores.rejected.detach(),
        "reward/margin": (scores.chosen - scores.rejected).detach(),
    }


RM = AlgorithmSpec(
    name="rm",
    description="Reward model on preference pairs (Bradley-Terry or log-exp loss)",
    loop="offline",
    config=RMConfig,
    data="pairs",
    head="value",
    preference_loss="bradley_terry",
    defaults={"training.lr": 5e-4, "training.batch_size": 32, "training.micro_batch_size": 16},
)


@hookimpl
def register_algorithms(register):
    register("rm", RM)


@hookimpl
def register_preference_losses(register):
    register("bradley_terry", bradley_terry)
    register("log_exp", log_exp)
