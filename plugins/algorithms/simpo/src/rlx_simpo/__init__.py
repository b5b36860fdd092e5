"""SimPO: reference-free preference optimisation with length-normalised log-probs.

L = −log σ(β/|y_c|·log π_c − β/|y_r|·log π_r − γ), log π summed over response tokens and
|y| the response length in tokens (EOS included). β = 2.0 and γ = 0.5 are the defaults
of the SimPO paper (Meng et al. 2024). Logged per pair: ``accuracy`` (chosen reward >
rejected), ``reward/chosen``, ``reward/rejected``, ``reward/margin`` with reward
β·mean token log-prob.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import PREFERENCE_DEFAULTS, opt


@dataclass
class SimPOConfig:
    beta: float = opt(2.0, "β: scale of the length-normalised reward")
    gamma: float = opt(0.5, "γ: target reward margin")


def simpo(scores, *, config):
    chosen = config.beta * scores.chosen / scores.chosen_tokens.clamp(min=1)
    rejected = config.beta * scores.rejected / scores.rejected_tokens.clamp(min=1)
    loss = -ops.logsigmoid(chosen - rejected - config.gamma)
    chosen, rejected = chosen.detach(), rejected.detach()
    return loss, {"accuracy": (chosen > rejected).float(), "reward/chosen": chosen,
                  "reward/rejected": rejected, "reward/margin": chosen - rejected}


SIMPO = AlgorithmSpec(
    name="simpo",
    description="SimPO: reference-free, length-normalised preference optimisation on pairs",
    loop="offline",
    config=SimPOConfig,
    data="pairs",
    head="lm",
    preference_loss="simpo",
    needs_reference=False,
    defaults=PREFERENCE_DEFAULTS,
)


@hookimpl
def register_algorithms(register):
    register("simpo", SIMPO)


@hookimpl
def register_preference_losses(register):
    register("simpo", simpo)
