"""DPO, cDPO and IPO against numbers worked out by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlx.algorithm import PreferenceScores
from rlx_dpo import DPOConfig, dpo, ipo


def scores(chosen=-1.0, rejected=-3.0, ref_chosen=-2.0, ref_rejected=-2.0, nll=0.5):
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    return PreferenceScores(chosen=t(chosen), rejected=t(rejected), ref_chosen=t(ref_chosen),
                            ref_rejected=t(ref_rejected), chosen_tokens=t(2.0), rejected_tokens=t(2.0),
                            chosen_nll=t(nll))


def config(**kw):
    return SimpleNamespace(**{"beta": 0.5, "label_smoothing": 0.0, "nll_coef": 0.0, **kw})


def test_defaults():
    c = DPOConfig()
    assert (c.beta, c.label_smoothing, c.nll_coef, c.precompute_reference) == (0.1, 0.0, 0.0, False)


def test_dpo_by_hand():
    # z = (−1 − −3) − (−2 − −2) = 2; βz = 1; L = −log σ(1) = log(1 + e^−1)
    loss, metrics = dpo(scores(), config=config())
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1)), abs=1e-9)
    assert loss.item() == pytest.approx(0.3132617, abs=1e-6)
    assert metrics["reward/chosen"].item() == pytest.approx(0.5)    # 0.5·(−1 + 2)
    assert metrics["reward/rejected"].item() == pytest.approx(-0.5)  # 0.5·(−3 + 2)
    assert metrics["reward/margin"].item() == pytest.approx(1.0)
    assert metrics["accuracy"].item() == 1.0


def test_cdpo_label_smoothing_by_hand():
    # 0.8·(−log σ(1)) + 0.2·(−log σ(−1)) = 0.8·0.3132617 + 0.2·1.3132617
    loss, _ = dpo(scores(), config=config(label_smoothing=0.2))
    assert loss.item() == pytest.approx(0.8 * 0.3132617 + 0.2 * 1.3132617, abs=1e-6)
    assert loss.item() == pytest.approx(0.5132617, abs=1e-6)
    # ε = 0.5 makes the loss symmetric: the same for z and −z
    flipped, _ = dpo(scores(chosen=-3.0, rejected=-1.0), config=config(label_smoothing=0.5))
    half, _ = dpo(scores(), config=config(label_smoothing=0.5))
    assert flipped.item() == pytest.approx(half.item())


def test_ipo_by_hand():
    loss, metrics = ipo(scores(), config=config())                 # (2 − 1/(2·0.5))² = 1
    assert loss.item() == pytest.approx(1.0)
    loss, _ = ipo(scores(), config=config(beta=0.1))               # (2 − 5)² = 9
    assert loss.item() == pytest.approx(9.0)
    assert metrics["accuracy"].item() == 1.0


def test_nll_term_on_chosen():
    plain, _ = dpo(scores(), config=config())
    with_nll, _ = dpo(scores(nll=0.5), config=config(nll_coef=2.0))
    assert with_nll.item() == pytest.approx(plain.item() + 1.0)
    ipo_nll, _ = ipo(scores(nll=0.5), config=config(nll_coef=2.0))
    assert ipo_nll.item() == pytest.approx(2.0)


def test_gradient_raises_chosen_and_lowers_rejected():
    s = scores()
    s.chosen.requires_grad_(True)
    s.rejected.requires_grad_(True)
    loss, _ = dpo(s, config=config())
    loss.sum().backward()
    # dL/dchosen = −β(1 − σ(βz)) = −0.5·σ(−1)
    assert s.chosen.grad.item() == pytest.approx(-0.5 / (1 + math.e), abs=1e-9)
    assert s.rejected.grad.item() == pytest.approx(0.5 / (1 + math.e), abs=1e-9)


def test_ties_count_as_wrong_in_accuracy():
    _, metrics = dpo(scores(chosen=-2.0, rejected=-2.0), config=config())
    assert metrics["accuracy"].item() == 0.0


def test_gradient_at_z_zero_is_half_beta():
    # policy == reference (the first step) makes z exactly 0: dL/dchosen = −β σ(0) = −β/2
    s = scores(chosen=-2.0, rejected=-2.0)
    s.chosen.requires_grad_(True)
    loss, _ = dpo(s, config=config())
    loss.sum().backward()
    assert s.chosen.grad.item() == pytest.approx(-0.25, abs=1e-12)


# --- the DPO family TRL users reach for: hinge, robust DPO, f-DPO, IPO on per-token log-ratios ----------------
# scores(): log π_c − log π^ref_c = −1 − (−2) = 1, log π_r − log π^ref_r = −3 − (−2) = −1, z = 2

from rlx.config import ConfigError  # noqa: E402
from rlx_dpo import FDPOConfig, HingeConfig, IPOConfig, RobustDPOConfig, fdpo, hinge, robust_dpo  # noqa: E402


def softplus(x):
    return math.log1p(math.exp(x))


def test_new_defaults():
    assert (HingeConfig().beta, HingeConfig().nll_coef) == (0.1, 0.0)
    assert RobustDPOConfig().label_smoothing == 0.1
    assert FDPOConfig().f_divergence == "js_divergence"
    assert IPOConfig().length_normalize is False


def test_hinge_by_hand():
    loss, metrics = hinge(scores(), config=config(beta=0.1))            # max(0, 1 − 0.1·2) = 0.8
    assert loss.item() == pytest.approx(0.8)
    assert metrics["accuracy"].item() == 1.0
    loss, _ = hinge(scores(), config=config(beta=0.5))                  # βz = 1: on the hinge, 0
    assert loss.item() == 0.0
    loss, _ = hinge(scores(chosen=-3.0, rejected=-1.0), config=config(beta=0.5))  # z = −2: 1 + 1
    assert loss.item() == pytest.approx(2.0)
    s = scores()
    s.chosen.requires_grad_(True)
    hinge(s, config=config(beta=0.1))[0].sum().backward()
    assert s.chosen.grad.item() == pytest.approx(-0.1)                  # inside the margin: dL/dz·dz/dchosen = −β


def test_robust_dpo_by_hand():
    # β = 0.5, z = 2: log σ(1) = −log(1 + e^−1) = −0.3132617, log σ(−1) = −1.3132617
    loss, _ = robust_dpo(scores(), config=config(label_smoothing=0.2))
    assert loss.item() == pytest.approx((0.8 * 0.3132617 - 0.2 * 1.3132617) / 0.6, abs=1e-6)
    assert loss.item() == pytest.approx(-0.0200716, abs=1e-6)  # below 0: the robust loss is unbounded below
    # ε = 0 is DPO
    plain, _ = robust_dpo(scores(), config=config(label_smoothing=0.0))
    assert plain.item() == pytest.approx(math.log1p(math.exp(-1)), abs=1e-9)
    # unbiased: averaged over a label flipped with probability ε it is the clean DPO loss −log σ(βz)
    flipped, _ = robust_dpo(scores(chosen=-3.0, rejected=-1.0), config=config(label_smoothing=0.2))
    assert 0.8 * loss.item() + 0.2 * flipped.item() == pytest.approx(math.log1p(math.exp(-1)), abs=1e-9)


def test_robust_dpo_refuses_half_or_more():
    with pytest.raises(ConfigError, match="label_smoothing"):
        RobustDPOConfig(label_smoothing=0.5)


def test_fdpo_jensen_shannon_by_hand():
    # f'(u) = log(2u/(1 + u)): the score is log σ(log u) (+ log 2, which cancels)
    # log u_c = 1, log u_r = −1: log σ(1) − log σ(−1) = 1, so L = −log σ(0.5·1) at β = 0.5
    loss, metrics = fdpo(scores(), config=config(f_divergence="js_divergence"))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)), abs=1e-9)
    assert metrics["reward/margin"].item() == pytest.approx(1.0)  # implicit rewards stay β·log u
    # log u_c = 2, log u_r = 0 (β = 1): z_js = (2 − softplus(2)) − (0 − softplus(0)) = 2 − 2.126928 + 0.693147
    z_js = 2 - softplus(2) + softplus(0)
    assert z_js == pytest.approx(0.5662192, abs=1e-6)
    loss, _ = fdpo(scores(chosen=0.0, rejected=-2.0), config=config(beta=1.0, f_divergence="js_divergence"))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-z_js)), abs=1e-9)
    # reverse KL is DPO
    rkl, _ = fdpo(scores(), config=config(f_divergence="reverse_kl"))
    assert rkl.item() == pytest.approx(math.log1p(math.exp(-1)), abs=1e-9)


def pair(chosen, rejected, ref_chosen, ref_rejected, chosen_tokens, rejected_tokens):
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    return PreferenceScores(chosen=t(chosen), rejected=t(rejected), ref_chosen=t(ref_chosen),
                            ref_rejected=t(ref_rejected), chosen_tokens=t(chosen_tokens),
                            rejected_tokens=t(rejected_tokens))


def test_ipo_on_per_token_log_ratios_by_hand():
    s = pair(-1.0, -3.0, -2.0, -2.0, chosen_tokens=4, rejected_tokens=1)
    # TRL's form: z = 1/4 − (−1)/1 = 1.25; β = 0.5: (1.25 − 1)² = 0.0625
    loss, _ = ipo(s, config=config(length_normalize=True))
    assert loss.item() == pytest.approx(0.0625)
    # summed (the default): z = 2, (2 − 1)² = 1
    assert ipo(s, config=config(length_normalize=False))[0].item() == pytest.approx(1.0)
    assert ipo(s, config=config())[0].item() == pytest.approx(1.0)


def test_dpo_and_ipo_without_the_chosen_nll():
    # a loop that gives no NLL of the chosen response: with nll_coef 0 nothing needs it
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    s = PreferenceScores(chosen=t(-1.0), rejected=t(-3.0), ref_chosen=t(-2.0), ref_rejected=t(-2.0), chosen_nll=None)
    for fn in (dpo, ipo, hinge, robust_dpo):
        loss, metrics = fn(s, config=config())
        assert torch.isfinite(loss).all() and "nll" not in metrics
    assert dpo(s, config=config())[0].item() == pytest.approx(math.log1p(math.exp(-1)), abs=1e-9)
    # with the lengths it is worked out from the summed log-prob: −(−1)/2
    s.chosen_tokens = t(2.0)
    loss, metrics = dpo(s, config=config(nll_coef=1.0))
    assert metrics["nll"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1)) + 0.5, abs=1e-9)
