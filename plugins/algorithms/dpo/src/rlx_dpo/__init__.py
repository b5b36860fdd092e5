"""Direct preference optimisation on preference pairs, against a frozen reference.

With log π summed over response tokens, z = (log π_c − log π_r) − (log π^ref_c − log π^ref_r):

- ``dpo`` (Rafailov et al. 2023): L = −(1 − ε) log σ(βz) − ε log σ(−βz); ε =
  ``label_smoothing`` (0: DPO, > 0: conservative DPO, cDPO). TRL: ``DPOConfig(
  loss_type="sigmoid", beta=β)`` for ε = 0; TRL's ``sigmoid`` ignores ``label_smoothing``,
  so cDPO has no TRL counterpart (OpenRLHF's DPO applies it as here).
- ``ipo`` (Azar et al. 2023): L = (z − 1/(2β))². With ``length_normalize`` each log-ratio
  is divided by its response length before z: TRL's ``loss_type="ipo"``, which always
  does so; rlx's default (off) is OpenRLHF's summed form.
- ``hinge`` (SLiC, Zhao et al. 2023, in the DPO parametrisation): L = max(0, 1 − βz).
  TRL: ``loss_type="hinge"``, same β. SLiC-HF itself is reference-free, with its margin
  δ in place of 1/β and a regularising NLL term (``nll_coef`` here).
- ``robust_dpo`` (rDPO, Chowdhury et al. 2024; not cDPO): L = (−(1 − ε) log σ(βz) +
  ε log σ(−βz)) / (1 − 2ε), unbiased for the clean-label loss when labels flip with
  probability ε = ``label_smoothing`` < 1/2. TRL: ``loss_type="robust"``,
  ``label_smoothing=ε``.
- ``fdpo`` (f-DPO, Wang et al. 2023): L = −log σ(β(f'(u_c) − f'(u_r))), u = π/π_ref of
  the response; ``f_divergence`` ``js_divergence`` (default) gives f'(u) = log σ(log u)
  up to a constant, ``reverse_kl`` is DPO. TRL: ``loss_type="sigmoid"``,
  ``f_divergence_type="js_divergence"`` (TRL's ``forward_kl`` and ``alpha_divergence``
  are not offered).

Each adds ``nll_coef`` · (mean per-token NLL of the chosen response) when it is > 0
(TRL: ``"sft"`` added to ``loss_type`` with that weight). Logged per pair: ``accuracy``
(implicit reward of chosen > rejected), ``reward/chosen``, ``reward/rejected``,
``reward/margin``, with implicit rewards β(log π − log π_ref), and ``nll`` when the
chosen NLL is known.
"""

from dataclasses import dataclass
from typing import Literal

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import PREFERENCE_DEFAULTS, ConfigError, opt

# On the demo, β = 0.1 leaves greedy accuracy about 10 points lower than β = 0.5 does:
# a weaker pull to the reference lets the pushed-down rejected numbers drag the right ones.
# At lr 1e-4 for 40 steps the result swung with the seed (greedy 0.80-0.97 over 11 seeds);
# half the rate for twice the steps gives 0.92-0.95 (benchmarks/learning_seeds.py).
DEMO_DEFAULTS = {**PREFERENCE_DEFAULTS, "algorithm.beta": 0.5, "training.lr": 5e-5, "training.max_steps": 80}
# f-DPO (Jensen-Shannon) wants a larger β on the demo: at 0.5 the answers' numbers fell to
# 56% right after 40 steps, at 2.0 to 94%, at 3.0 they stayed at 97%.
FDPO_DEMO_DEFAULTS = {**PREFERENCE_DEFAULTS, "algorithm.beta": 3.0}


@dataclass
class DPOConfig:
    beta: float = opt(0.1, "β: strength of the KL regularisation towards the reference")
    label_smoothing: float = opt(0.0, "ε: assumed share of flipped labels (dpo only; > 0 is cDPO)")
    nll_coef: float = opt(0.0, "weight of an extra NLL term on the chosen response (0: off)")
    precompute_reference: bool = opt(
        False, "score every pair with the reference once before training (cached in the output folder) and free it")


@dataclass
class IPOConfig(DPOConfig):
    length_normalize: bool = opt(False, "divide each log-ratio by its response length before z (TRL's IPO)")


@dataclass
class PairConfig:
    beta: float = opt(0.1, "β: strength of the KL regularisation towards the reference")
    nll_coef: float = opt(0.0, "weight of an extra NLL term on the chosen response (0: off)")
    precompute_reference: bool = opt(
        False, "score every pair with the reference once before training (cached in the output folder) and free it")


@dataclass
class HingeConfig(PairConfig):
    beta: float = opt(0.1, "β: the hinge's margin is 1/β in z; larger stays closer to the reference")


@dataclass
class RobustDPOConfig(PairConfig):
    label_smoothing: float = opt(0.1, "ε: assumed probability that a pair's labels are flipped, 0 <= ε < 0.5")

    def __post_init__(self):
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"algorithm.label_smoothing: robust DPO needs 0 <= ε < 0.5, got {self.label_smoothing}")


@dataclass
class FDPOConfig(PairConfig):
    f_divergence: Literal["js_divergence", "reverse_kl"] = opt(
        "js_divergence", "the f-divergence to the reference (reverse_kl: DPO)")


def dpo(scores, *, config):
    loss = ops.dpo_loss(scores.chosen, scores.rejected, scores.ref_chosen, scores.ref_rejected,
                        beta=config.beta, label_smoothing=config.label_smoothing)
    return _with_nll(loss, scores, config), _metrics(scores, config)


def ipo(scores, *, config):
    lengths = ((scores.chosen_tokens, scores.rejected_tokens) if getattr(config, "length_normalize", False)
               else (None, None))
    loss = ops.ipo_loss(scores.chosen, scores.rejected, scores.ref_chosen, scores.ref_rejected, beta=config.beta,
                        chosen_tokens=lengths[0], rejected_tokens=lengths[1])
    return _with_nll(loss, scores, config), _metrics(scores, config)


def hinge(scores, *, config):
    loss = ops.hinge_loss(scores.chosen, scores.rejected, scores.ref_chosen, scores.ref_rejected, beta=config.beta)
    return _with_nll(loss, scores, config), _metrics(scores, config)


def robust_dpo(scores, *, config):
    loss = ops.robust_dpo_loss(scores.chosen, scores.rejected, scores.ref_chosen, scores.ref_rejected,
                               beta=config.beta, label_smoothing=config.label_smoothing)
    return _with_nll(loss, scores, config), _metrics(scores, config)


def fdpo(scores, *, config):
    loss = ops.f_dpo_loss(scores.chosen, scores.rejected, scores.ref_chosen, scores.ref_rejected,
                          beta=config.beta, divergence=config.f_divergence)
    return _with_nll(loss, scores, config), _metrics(scores, config)


def _chosen_nll(scores):
    """Mean per-token NLL of the chosen response: given, else from the summed log-prob and length."""
    if scores.chosen_nll is not None:
        return scores.chosen_nll
    if scores.chosen_tokens is not None:
        return -scores.chosen / scores.chosen_tokens.clamp(min=1)
    return None


def _with_nll(loss, scores, config):
    if not config.nll_coef:
        return loss
    nll = _chosen_nll(scores)
    if nll is None:
        raise ValueError("nll_coef > 0 needs the chosen response's NLL (scores.chosen_nll or chosen_tokens)")
    return loss + config.nll_coef * nll


def _metrics(scores, config):
    chosen = ops.implicit_reward(scores.chosen, scores.ref_chosen, config.beta)
    rejected = ops.implicit_reward(scores.rejected, scores.ref_rejected, config.beta)
    metrics = {
        "accuracy": (chosen > rejected).float(),
        "reward/chosen": chosen,
        "reward/rejected": rejected,
        "reward/margin": chosen - rejected,
    }
    nll = _chosen_nll(scores)
    if nll is not None:
        metrics["nll"] = nll.detach()
    return metrics


def _spec(name, description, config, defaults=PREFERENCE_DEFAULTS):
    return AlgorithmSpec(name=name, description=description, loop="offline", config=config, data="pairs", head="lm",
                         preference_loss=name, needs_reference=True, defaults=defaults)


DPO = _spec("dpo", "Direct preference optimisation on pairs (cDPO with label_smoothing > 0)", DPOConfig,
            DEMO_DEFAULTS)
IPO = _spec("ipo", "Identity preference optimisation on pairs: squared loss on the DPO log-ratio", IPOConfig)
HINGE = _spec("hinge", "Hinge (SLiC) loss on the DPO log-ratio: max(0, 1 − βz)", HingeConfig, DEMO_DEFAULTS)
ROBUST_DPO = _spec("robust_dpo", "Robust DPO: an unbiased DPO loss under labels flipped with probability ε",
                   RobustDPOConfig, DEMO_DEFAULTS)
FDPO = _spec("fdpo", "f-DPO: DPO with an f-divergence to the reference (Jensen-Shannon by default)", FDPOConfig,
             FDPO_DEMO_DEFAULTS)
SPECS = {s.name: s for s in (DPO, IPO, HINGE, ROBUST_DPO, FDPO)}
LOSSES = {"dpo": dpo, "ipo": ipo, "hinge": hinge, "robust_dpo": robust_dpo, "fdpo": fdpo}


@hookimpl
def register_algorithms(register):
    for name, spec in SPECS.items():
        register(name, spec)


@hookimpl
def register_preference_losses(register):
    for name, loss in LOSSES.items():
        register(name, loss)
