"""SimPO: reference-free preference optimisation with length-normalised log-probs.

With m = β/|y_c|·log π_c − β/|y_r|·log π_r − γ, log π summed over response tokens and |y|
the response length in tokens (EOS included):

- ``simpo`` (Meng et al. 2024): L = −(1 − ε) log σ(m) − ε log σ(−m); ε =
  ``label_smoothing``, default 0 (the paper's L = −log σ(m)). β = 2.0 and γ = 0.5 are the
  paper's defaults. TRL: ``CPOConfig(loss_type="simpo", beta=β, simpo_gamma=γ,
  label_smoothing=ε, cpo_alpha=0)``.
- ``cpo_simpo`` (CPO-SimPO: SimPO plus the NLL term of CPO, Xu et al. 2024): the same
  plus α·NLL_c, NLL_c the mean per-token negative log-likelihood of the chosen response
  and α = ``cpo_alpha`` (default 1.0, TRL's). TRL: ``CPOConfig(loss_type="simpo",
  beta=β, simpo_gamma=γ, label_smoothing=ε, cpo_alpha=α)``; TRL's NLL is the mean over
  all chosen tokens of its batch, rlx's the mean over pairs of each one's per-token mean
  (the same when the chosen responses are equally long).

Logged per pair: ``accuracy`` (chosen reward > rejected), ``reward/chosen``,
``reward/rejected``, ``reward/margin`` with reward β·mean token log-prob; ``nll`` for
``cpo_simpo``.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import PREFERENCE_DEFAULTS, opt


@dataclass
class SimPOConfig:
    beta: float = opt(2.0, "β: scale of the length-normalised reward")
    gamma: float = opt(0.5, "γ: target reward margin")
    label_smoothing: float = opt(0.0, "ε: assumed share of flipped labels (0: the SimPO paper's loss)")


@dataclass
class CPOSimPOConfig(SimPOConfig):
    cpo_alpha: float = opt(1.0, "α: weight of the NLL term on the chosen response")


def simpo(scores, *, config):
    loss = ops.simpo_loss(scores.chosen, scores.rejected, scores.chosen_tokens, scores.rejected_tokens,
                          beta=config.beta, gamma=config.gamma,
                          label_smoothing=getattr(config, "label_smoothing", 0.0))
    return loss, _metrics(scores, config)


def cpo_simpo(scores, *, config):
    loss, metrics = simpo(scores, config=config)
    nll = scores.chosen_nll if scores.chosen_nll is not None else -scores.chosen / scores.chosen_tokens.clamp(min=1)
    return loss + config.cpo_alpha * nll, {**metrics, "nll": nll.detach()}


def _metrics(scores, config):
    chosen = (config.beta * scores.chosen / scores.chosen_tokens.clamp(min=1)).detach()
    rejected = (config.beta * scores.rejected / scores.rejected_tokens.clamp(min=1)).detach()
    return {"accuracy": (chosen > rejected).float(), "reward/chosen": chosen,
            "reward/rejected": rejected, "reward/margin": chosen - rejected}


def _spec(name, description, config):
    return AlgorithmSpec(name=name, description=description, loop="offline", config=config, data="pairs", head="lm",
                         preference_loss=name, needs_reference=False, defaults=PREFERENCE_DEFAULTS)


SIMPO = _spec("simpo", "SimPO: reference-free, length-normalised preference optimisation on pairs", SimPOConfig)
CPO_SIMPO = _spec("cpo_simpo", "CPO-SimPO: SimPO plus an NLL term on the chosen response", CPOSimPOConfig)


@hookimpl
def register_algorithms(register):
    register("simpo", SIMPO)
    register("cpo_simpo", CPO_SIMPO)


@hookimpl
def register_preference_losses(register):
    register("simpo", simpo)
    register("cpo_simpo", cpo_simpo)
