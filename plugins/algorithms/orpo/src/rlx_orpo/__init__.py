"""ORPO: reference-free odds-ratio preference optimisation with an SFT term.

With p = exp(mean token log-prob of a response) and odds = p/(1 − p):
L = NLL_c − λ·log σ(log odds_c − log odds_r), NLL_c the mean per-token negative
log-likelihood of the chosen response, λ default 0.1 (Hong et al. 2024). Logged per
pair: ``accuracy`` (odds_c > odds_r), ``log_odds_ratio``, ``nll``, ``reward/chosen``,
``reward/rejected``, ``reward/margin`` (mean token log-probs).
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import PREFERENCE_DEFAULTS, opt


@dataclass
class ORPOConfig:
    lam: float = opt(0.1, "λ: weight of the odds-ratio term against the chosen NLL")


def log_odds(mean_logp):
    """log(p/(1 − p)) for p = exp(mean_logp) < 1, stable near both ends."""
    m = mean_logp.clamp(max=-1e-6)
    log1m = (-m.expm1()).log().where(m > -0.6931, (-m.exp()).log1p())
    return m - log1m


def orpo(scores, *, config):
    chosen = scores.chosen / scores.chosen_tokens.clamp(min=1)
    rejected = scores.rejected / scores.rejected_tokens.clamp(min=1)
    ratio = log_odds(chosen) - log_odds(rejected)
    nll = -chosen
    loss = nll - config.lam * ops.logsigmoid(ratio)
    chosen, rejected = chosen.detach(), rejected.detach()
    return loss, {"accuracy": (ratio > 0).float(), "log_odds_ratio": ratio.detach(), "nll": nll.detach(),
                  "reward/chosen": chosen, "reward/rejected": rejected, "reward/margin": chosen - rejected}


ORPO = AlgorithmSpec(
    name="orpo",
    description="ORPO: reference-free odds-ratio preference optimisation with an SFT term on the chosen",
    loop="offline",
    config=ORPOConfig,
    data="pairs",
    head="lm",
    preference_loss="orpo",
    needs_reference=False,
    defaults=PREFERENCE_DEFAULTS,
)


@hookimpl
def register_algorithms(register):
    register("orpo", ORPO)


@hookimpl
def register_preference_losses(register):
    register("orpo", orpo)
