"""``rlx plugins new``: a ready plugin distribution of one kind, to edit and install.

The folder it writes is what docs/plugin-guide.md describes: a ``pyproject.toml`` with a
build system, a version and an ``rlx`` entry point; a src layout holding the hook
implementation; and a test that runs the contract suite (``rlx.contract``) on it::

    rlx-NAME/
        pyproject.toml
        README.md
        src/rlx_NAME/__init__.py
        tests/test_rlx_NAME.py
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "$description"
requires-python = ">=3.10"
dependencies = ["rlx"]

[project.optional-dependencies]
test = ["pytest"]

[project.entry-points.rlx]
$name = "$package"

[tool.setuptools.packages.find]
where = ["src"]
"""

README = """\
# $dist

$description, as an rlx plugin.

```
pip install -e .            # rlx finds it through the `rlx` entry point
rlx plugins list            # shows $dist and what it registers
python -m pytest tests      # the rlx plugin contract suite
```
"""

TEST = """\
\"\"\"$dist keeps the rlx plugin contract (docs/plugin-guide.md, "Testing a plugin").\"\"\"

from rlx.contract import contract_tests
from rlx.testing import one_thread  # noqa: F401  (one torch thread: tiny models run best so)

test_contract = contract_tests("$dist")
"""

SOURCES = {
    "algorithm": ("an online RL algorithm", '''\
"""$title: an online algorithm for rlx.

Advantages: each sample's reward minus its group's mean, over the group's std (samples
with equal ``group_ids`` answer the same prompt), given to every response token.
Policy loss: the clipped importance weight is a constant factor of a REINFORCE term,
-min(ρ, 1 + ε) A log π (CISPO-style), so clipped tokens still get a gradient.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import ONLINE_DEFAULTS, ConfigError, OnlineConfig, opt


@dataclass
class Config(OnlineConfig):
    weight_clip: float = opt(1.0, "ε: the importance weight is clipped at 1 + ε")

    def validate(self, config) -> None:
        super().validate(config)
        if self.n_samples < 2:
            raise ConfigError("algorithm.n_samples must be at least 2: a group of one has no baseline")


def advantages(rewards, mask, *, kl, beta, group_ids, config, **_):
    r = ops.clip_rewards(ops.group_normalize(rewards, group_ids), config.reward_clip)
    adv = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=1.0)
    return adv, adv, ops.group_metrics(rewards, group_ids)


def policy_loss(logp, old_logp, advantages, mask, *, config):
    ratio = (logp - old_logp).clamp(-20, 20).exp()
    weight = ratio.clamp(max=1 + config.weight_clip).detach()
    clipped = (ratio > 1 + config.weight_clip).float()
    return -weight * advantages * logp, {"clip_frac": ops.masked_mean(clipped, mask).detach()}


@hookimpl
def register_algorithms(register):
    register("$name", AlgorithmSpec(
        name="$name", description="$title: group-normalised advantages, clipped-weight policy gradient",
        loop="online", config=Config, data="prompts", estimator="${name}_advantages", policy_loss="${name}_loss",
        defaults=ONLINE_DEFAULTS))


@hookimpl
def register_advantage_estimators(register):
    register("${name}_advantages", advantages)


@hookimpl
def register_policy_losses(register):
    register("${name}_loss", policy_loss)
'''),
    "estimator": ("an advantage estimator", '''\
"""$title: leave-one-out advantages for rlx (choose it in an algorithm's spec by name).

A sample's advantage is its reward minus the mean reward of the other samples of its
group (the samples with the same ``group_ids``), given to every response token.
"""

from rlx import hookimpl, ops


def leave_one_out(rewards, mask, *, kl, beta, group_ids, config, **_):
    r = ops.clip_rewards(ops.rloo_baseline(rewards, group_ids), config.reward_clip)
    adv = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=1.0)
    return adv, adv, ops.group_metrics(rewards, group_ids)


@hookimpl
def register_advantage_estimators(register):
    register("$name", leave_one_out)
'''),
    "policy-loss": ("a policy loss", '''\
"""$title: a policy loss for rlx (choose it in an algorithm's spec by name).

REINFORCE with a clipped importance weight as a constant factor, -min(ρ, 1 + ε) A log π,
with ε = ``algorithm.clip_high``: a clipped token still gets a gradient.
"""

from rlx import hookimpl, ops


def clipped_weight(logp, old_logp, advantages, mask, *, config):
    ratio = (logp - old_logp).clamp(-20, 20).exp()
    weight = ratio.clamp(max=1 + config.clip_high).detach()
    clipped = (ratio > 1 + config.clip_high).float()
    return -weight * advantages * logp, {"clip_frac": ops.masked_mean(clipped, mask).detach()}


@hookimpl
def register_policy_losses(register):
    register("$name", clipped_weight)
'''),
    "reward": ("a rule reward", '''\
"""$title: a rule reward for rlx (``--reward $name``).

1.0 when the completion's first line, stripped, equals the row's label; 0.0 otherwise.
"""

from rlx import hookimpl


def first_line_matches(prompts, completions, labels, **columns):
    return [float(c.strip().split("\\n", 1)[0].strip() == str(label).strip()) for c, label in zip(completions, labels)]


@hookimpl
def register_reward_functions(register):
    register("$name", first_line_matches)
'''),
    "sampler": ("a rollout-group sampler", '''\
"""$title: a group sampler for rlx (``--set algorithm.sampler=$name``).

Keeps a prompt's group only when its scores differ by at least ``min_spread``: a group
whose samples all score alike has no group-relative signal.
"""

from dataclasses import dataclass

from rlx import hookimpl
from rlx.config import build, opt


@dataclass
class Options:
    min_spread: float = opt(0.5, "keep a group whose max - min score is at least this")
    max_rounds: int = opt(2, "extra generation rounds to replace dropped groups")


@dataclass
class SpreadFilter:
    min_spread: float
    max_rounds: int

    def keep(self, groups: list[list[float]]) -> list[bool]:
        return [max(g) - min(g) >= self.min_spread for g in groups]


def spread_filter(options: dict) -> SpreadFilter:
    o = build(Options, options, "algorithm.sampler_options")  # unknown options fail, named
    return SpreadFilter(o.min_spread, o.max_rounds)


@hookimpl
def register_samplers(register):
    register("$name", spread_filter)
'''),
    "reward-model": ("a reward-model loader", '''\
"""$title: a reward-model loader for rlx (``--set reward.model=PATH --set reward.model_type=$name``).

Scores each completion with a Hugging Face sequence-classification model of one label.
torch and transformers are imported only when a model is loaded.
"""

from rlx import hookimpl


def load(path, *, config=None):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()

    @torch.no_grad()
    def score(prompts: list[str], completions: list[str]) -> list[float]:
        texts = [p + c for p, c in zip(prompts, completions)]
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        return model(**batch).logits[:, 0].float().tolist()

    return score


@hookimpl
def register_reward_models(register):
    register("$name", load)
'''),
    "vlm-processor": ("a vision-language processor", '''\
"""$title: a VLM processor for rlx, registered under the model type it encodes for.

``encode(prompt, images)`` expands each ``<image>`` placeholder to the model's image
tokens and returns the image tensors. transformers is imported only when a processor is
made.
"""

from rlx import hookimpl

PLACEHOLDER = "<image>"


class Processor:
    def __init__(self, model_path, config):
        from transformers import AutoProcessor

        self.hf = AutoProcessor.from_pretrained(model_path)
        self.image_token = getattr(self.hf, "image_token", "<|image_pad|>")

    def encode(self, prompt, images):
        from rlx.multimodal import ModelInputs, VisionPrompt

        if not isinstance(prompt, str):
            prompt = self.hf.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        if prompt.count(PLACEHOLDER) != len(images):
            raise ValueError(f"{prompt.count(PLACEHOLDER)} placeholders for {len(images)} images")
        text = prompt.replace(PLACEHOLDER, self.image_token)
        out = self.hf(text=[text], images=images or None, return_tensors="pt")
        tensors = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
        return VisionPrompt(text=text, ids=out["input_ids"][0].tolist(), inputs=ModelInputs(tensors))


def make(model_path, *, config=None):
    return Processor(model_path, config)


@hookimpl
def register_vlm_processors(register):
    register("$name", make)
'''),
}

KINDS = tuple(SOURCES)


def names(name: str) -> tuple[str, str, str]:
    """(component name, distribution, package) for ``name``: ``cispo`` or ``rlx-cispo``."""
    base = re.sub(r"^rlx[-_]", "", name.strip().lower())
    base = re.sub(r"[^a-z0-9]+", "_", base).strip("_")
    if not base or not base[0].isalpha():
        raise ValueError(f"plugin name {name!r} must start with a letter")
    return base, f"rlx-{base.replace('_', '-')}", f"rlx_{base}"


def new_plugin(name: str, kind: str, directory: str | Path = ".") -> Path:
    """Write a plugin distribution of ``kind`` named after ``name``; return its folder."""
    if kind not in SOURCES:
        raise ValueError(f"unknown plugin kind {kind!r}; choose one of {', '.join(KINDS)}")
    component, dist, package = names(name)
    root = Path(directory) / dist
    if root.exists():
        raise FileExistsError(f"{root} already exists")
    description, source = SOURCES[kind]
    values = {"name": component, "dist": dist, "package": package, "description": f"{dist}: {description}",
              "title": dist}
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"src/{package}/__init__.py": source,
        f"tests/test_{package}.py": TEST,
    }
    for relative, template in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values))
    return root
