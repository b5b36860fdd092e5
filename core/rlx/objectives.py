"""Objectives of the offline algorithms: how each row format turns encoded rows into a loss.

One objective per (row format, head): SFT on responses, a reward model on pairs, a
preference loss on pairs or on unpaired rows with an LM. The offline driver encodes rows
with one; the offline policy worker computes losses with its own.
"""

from __future__ import annotations

import gc
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from rlx import data, models, multimodal
from rlx.algorithm import AlgorithmSpec, PreferenceScores, UnpairedScores
from rlx.config import RunConfig
from rlx.errors import RunError


@dataclass
class Objective:
    """How one data format turns encoded rows into a loss.

    ``count(rows)`` is the normaliser's unit count in ``rows``; ``loss(model, rows,
    normaliser)`` returns the micro-batch loss already divided by the step's normaliser
    and the step-normalised sums of its metrics. ``extra_keys`` are columns the rows
    need beyond their format's (key -> allowed types), checked with the others before
    any encoding. ``prepare(train, eval, out, resume, log)``, when set, runs once after
    the examples are encoded and before the policy loads (to precompute reference
    log-probs, say); ``begin_step(model, rows, engine)``, when set, runs before the
    micro-batches of each step (and of the eval pass) with all the step's rows (every
    rank's: the engine gives the rank and reduces over ranks), for statistics over the
    whole step.
    """

    encode: Callable[[dict], dict]
    count: Callable[[list[dict]], int]
    loss: Callable[[Any, list[dict], float], tuple[Any, dict[str, float]]]
    extra_keys: dict[str, tuple[type, ...]] = field(default_factory=dict)
    prepare: Callable[..., None] | None = None
    begin_step: Callable[[Any, list[dict], Any], None] | None = None


def _image_inputs(rows_inputs: list, seqs: list[list[int]], width: int, device) -> dict:
    """Model keyword arguments for right-padded ``seqs`` whose prompts carry ``rows_inputs``
    (``ModelInputs``, one per sequence): image tensors and multi-axis positions. Empty for
    text-only rows (None)."""
    if rows_inputs[0] is None:
        return {}
    extra, _ = multimodal.collate(rows_inputs)
    kwargs = {k: v.to(device) for k, v in multimodal.present(extra).items()}
    if rows_inputs[0].positions is not None:
        positions = multimodal.padded_positions([i.positions for i in rows_inputs], [len(s) for s in seqs], width,
                                                left=False)
        kwargs["position_ids"] = multimodal.model_positions(positions.to(device))
    return kwargs


def _sft_objective(config: RunConfig, spec: AlgorithmSpec, host, tokenizer, device, vision=None) -> Objective:
    cfg = config.data
    pad_id = tokenizer.pad_token_id

    def encode(row):
        return vision.encode_sft(row) if vision is not None else data.encode_sft(row, tokenizer, cfg)

    def count(rows):
        return sum(sum(r["loss_mask"][1:]) for r in rows)

    def loss(model, rows, normaliser):
        seqs, masks = [r["input_ids"] for r in rows], [r["loss_mask"] for r in rows]
        if config.training.packing:
            batch = data.pack_batch(seqs, masks)
            logp = models.token_logprobs(model, batch["input_ids"].to(device),
                                         position_ids=batch["position_ids"].to(device))
        else:
            batch = data.pad_batch(seqs, masks, pad_id)
            images = _image_inputs([r.get("inputs") for r in rows], seqs, batch["input_ids"].shape[1], device)
            logp = models.token_logprobs(model, batch["input_ids"].to(device),
                                         attention_mask=batch["attention_mask"].to(device), **images)
        mask = batch["loss_mask"][:, 1:].to(device).to(logp.dtype)
        if config.training.packing:
            # the first token of each packed sample is predicted from the previous sample
            mask = mask * (batch["position_ids"][:, 1:].to(device) != 0)
        nll = -(logp * mask).sum() / normaliser
        return nll, {"loss": nll.item()}

    return Objective(encode, count, loss)


def _reward_model_objective(config: RunConfig, spec: AlgorithmSpec, host, tokenizer, device) -> Objective:
    cfg = config.data
    pad_id = tokenizer.pad_token_id
    preference_loss = host.get("register_preference_losses",
                               getattr(config.algorithm, "preference_loss", None) or spec.preference_loss)
    margin_key = getattr(config.algorithm, "margin_key", "")

    def encode(row):
        example = data.encode_pair(row, tokenizer, cfg)
        example["margin"] = float(row[margin_key]) if margin_key else 0.0
        return example

    def count(rows):
        return len(rows)

    def loss(model, rows, normaliser):
        seqs = [r["chosen_ids"] for r in rows] + [r["rejected_ids"] for r in rows]
        masks = [r["chosen_mask"] for r in rows] + [r["rejected_mask"] for r in rows]
        batch = data.pad_batch(seqs, masks, pad_id)
        attention = batch["attention_mask"].to(device)
        rewards = models.last_token_values(
            models.token_values(model, batch["input_ids"].to(device), attention), attention).float()
        n = len(rows)
        margin = torch.tensor([r["margin"] for r in rows], device=device)
        per_pair, metrics = preference_loss(
            PreferenceScores(chosen=rewards[:n], rejected=rewards[n:], margin=margin), config=config.algorithm)
        return per_pair.sum() / normaliser, {"loss": per_pair.sum().item() / normaliser,
                                             **{k: v.sum().item() / normaliser for k, v in metrics.items()}}

    return Objective(encode, count, loss, extra_keys={margin_key: (int, float)} if margin_key else {})


def _summed_logps(model, seqs: list[list[int]], masks: list[list[int]], pad_id: int, device, inputs=None):
    """Summed response log-probs [B] and response token counts [B] of one padded batch
    (``inputs``: each sequence's image inputs, or None)."""
    batch = data.pad_batch(seqs, masks, pad_id)
    images = _image_inputs(inputs, seqs, batch["input_ids"].shape[1], device) if inputs else {}
    logp = models.token_logprobs(model, batch["input_ids"].to(device),
                                 attention_mask=batch["attention_mask"].to(device), **images)
    mask = batch["loss_mask"][:, 1:].to(device).to(logp.dtype)  # entry t scores token t + 1
    return (logp * mask).sum(-1), mask.sum(-1)


def _preference_loss(config: RunConfig, spec: AlgorithmSpec, host):
    return host.get("register_preference_losses",
                    getattr(config.algorithm, "preference_loss", None) or spec.preference_loss)


class _Reference:
    """The frozen reference policy, loaded on first use and freed on demand."""

    def __init__(self, config: RunConfig, device):
        self.config, self.device, self.model = config, device, None

    def get(self):
        if self.model is None:
            self.model = models.load_causal_lm(self.config.model, self.device, trainable=False)
        return self.model

    def free(self):
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _pair_fingerprint(examples: list[dict], model_path: str) -> str:
    digest = hashlib.sha256(model_path.encode())
    for e in examples:
        digest.update(repr((e["chosen_ids"], e["chosen_mask"], e["rejected_ids"], e["rejected_mask"])).encode())
        for tensor in e["inputs"].tensors.values() if "inputs" in e else ():
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


REFERENCE_CACHE = "reference_logps.pt"


def _pairs_lm_objective(config: RunConfig, spec: AlgorithmSpec, host, tokenizer, device, vision=None) -> Objective:
    """DPO-style losses on an LM: summed response log-probs of chosen and rejected.

    Chosen and rejected go through one forward in one padded batch. With
    ``spec.needs_reference`` the frozen reference scores the same sequences, live per
    micro-batch under no_grad, or (``algorithm.precompute_reference``) once for every
    train and eval example before training, cached in ``out/reference_logps.pt``
    (reused on --resume), after which the reference is freed.
    """
    cfg = config.data
    pad_id = tokenizer.pad_token_id
    preference_loss = _preference_loss(config, spec, host)
    reference = _Reference(config, device) if spec.needs_reference else None
    precompute = bool(getattr(config.algorithm, "precompute_reference", False)) and reference is not None
    micro = config.training.micro_batch_size

    def encode(row):
        return vision.encode_pair(row) if vision is not None else data.encode_pair(row, tokenizer, cfg)

    def count(rows):
        return len(rows)

    def scores_of(model, rows):
        seqs = [r["chosen_ids"] for r in rows] + [r["rejected_ids"] for r in rows]
        masks = [r["chosen_mask"] for r in rows] + [r["rejected_mask"] for r in rows]
        inputs = [r["inputs"] for r in rows] * 2 if "inputs" in rows[0] else None
        return _summed_logps(model, seqs, masks, pad_id, device, inputs)

    def prepare(train_examples, eval_examples, out: Path, resume: bool, log):
        if not precompute:
            return
        everything = train_examples + eval_examples
        path = out / REFERENCE_CACHE
        fingerprint = _pair_fingerprint(everything, config.model.path)
        cached = torch.load(path, weights_only=True) if path.exists() else None
        if cached is not None and cached.get("fingerprint") == fingerprint:
            logps = cached["logps"]
            log(f"reference log-probs read from {path}")
        else:
            model = reference.get()
            parts = []
            with torch.no_grad():
                for batch in micro_batches(everything, micro):
                    logp, _ = scores_of(model, batch)
                    n = len(batch)
                    parts.append(torch.stack([logp[:n], logp[n:]], dim=1).cpu())
            logps = torch.cat(parts).double()
            if int(os.environ.get("RANK", "0")) == 0:
                torch.save({"fingerprint": fingerprint, "logps": logps}, path)
            log(f"reference log-probs of {len(everything)} pairs written to {path}")
        for example, (c, r) in zip(everything, logps.tolist()):
            example["ref_chosen"], example["ref_rejected"] = c, r
        reference.free()

    def loss(model, rows, normaliser):
        logp, tokens = scores_of(model, rows)
        n = len(rows)
        ref_chosen = ref_rejected = None
        if reference is not None:
            if precompute:
                ref_chosen = torch.tensor([r["ref_chosen"] for r in rows], device=device, dtype=logp.dtype)
                ref_rejected = torch.tensor([r["ref_rejected"] for r in rows], device=device, dtype=logp.dtype)
            else:
                with torch.no_grad():
                    ref, _ = scores_of(reference.get(), rows)
                ref_chosen, ref_rejected = ref[:n], ref[n:]
        chosen, rejected = logp[:n], logp[n:]
        scores = PreferenceScores(chosen=chosen, rejected=rejected, ref_chosen=ref_chosen, ref_rejected=ref_rejected,
                                  chosen_tokens=tokens[:n], rejected_tokens=tokens[n:],
                                  chosen_nll=-chosen / tokens[:n].clamp(min=1))
        per_pair, metrics = preference_loss(scores, config=config.algorithm)
        return per_pair.sum() / normaliser, {"loss": per_pair.sum().item() / normaliser,
                                             **{k: v.sum().item() / normaliser for k, v in metrics.items()}}

    return Objective(encode, count, loss, prepare=prepare)


def _unpaired_lm_objective(config: RunConfig, spec: AlgorithmSpec, host, tokenizer, device) -> Objective:
    """KTO-style losses on unpaired rows (prompt, completion, desirable flag).

    Before each step's micro-batches, ``begin_step`` computes over all the step's rows
    (every rank's) what the loss's ``step_statistics`` attribute asks for (see
    ``UnpairedScores``): by default the KL reference point, the detached mean of
    (policy − reference) summed log-probs on mismatched pairs, the prompt of row i with
    the completion of row i + 1 rotating over the step's rows (each rank scores its share
    of the pairs, and the sum is reduced over ranks); ``"logratios"``: every row's own
    detached log-ratio; ``"none"``: nothing. So several ranks see the statistics one does.
    """
    pad_id = tokenizer.pad_token_id
    preference_loss = _preference_loss(config, spec, host)
    wants = getattr(preference_loss, "step_statistics", "kl_ref_point")
    if wants not in ("kl_ref_point", "logratios", "none"):
        raise RunError(f"algorithm {spec.name!r}: its loss asks for step statistics {wants!r}; the unpaired loop "
                       f"computes 'kl_ref_point', 'logratios' or 'none'")
    reference = _Reference(config, device)
    micro = config.training.micro_batch_size
    state: dict[str, Any] = {}

    def encode(row):
        return data.encode_unpaired(row, tokenizer, config.data)

    def count(rows):
        return len(rows)

    def logratio(model, prompts, completions):
        seqs = [p + c for p, c in zip(prompts, completions)]
        masks = [[0] * len(p) + [1] * len(c) for p, c in zip(prompts, completions)]
        policy, tokens = _summed_logps(model, seqs, masks, pad_id, device)
        with torch.no_grad():
            ref, _ = _summed_logps(reference.get(), seqs, masks, pad_id, device)
        return policy, ref, tokens

    @torch.no_grad()
    def begin_step(model, rows, engine):
        state.clear()
        if wants == "kl_ref_point":
            if len(rows) < 2:
                raise RunError(
                    f"algorithm {spec.name!r}: a step of {len(rows)} row(s) cannot form the mismatched "
                    f"prompt/completion pairs of the KL reference point; use at least 2 rows per step "
                    f"(training.batch_size={config.training.batch_size})")
            mine = list(range(engine.rank, len(rows), engine.world_size))
            total = torch.zeros((), dtype=torch.float64, device=device)
            for start in range(0, len(mine), micro):
                chunk = mine[start:start + micro]
                prompts = [rows[i]["prompt_ids"] for i in chunk]
                completions = [rows[(i + 1) % len(rows)]["completion_ids"] for i in chunk]
                policy, ref, _ = logratio(model, prompts, completions)
                total += (policy - ref).sum().double()
            state["kl_ref_point"] = (engine.all_reduce_sum(total) / len(rows)).float()
        elif wants == "logratios":
            parts = []
            for chunk in micro_batches(rows, micro):
                policy, ref, _ = logratio(model, [r["prompt_ids"] for r in chunk], [r["completion_ids"] for r in chunk])
                parts.append(policy - ref)
            state["step_logratio"] = torch.cat(parts)
            state["step_desirable"] = torch.tensor([r["desirable"] for r in rows], device=device)
        state["desirable_share"] = sum(r["desirable"] for r in rows) / len(rows)

    def loss(model, rows, normaliser):
        if "desirable_share" not in state:
            raise RunError("internal: the unpaired objective's step statistics were not computed")
        policy, ref, tokens = logratio(model, [r["prompt_ids"] for r in rows], [r["completion_ids"] for r in rows])
        scores = UnpairedScores(
            logratio=policy - ref, kl_ref_point=state.get("kl_ref_point"),
            desirable=torch.tensor([r["desirable"] for r in rows], device=device),
            policy=policy, reference=ref, tokens=tokens, desirable_share=state["desirable_share"],
            step_logratio=state.get("step_logratio"), step_desirable=state.get("step_desirable"))
        per_example, metrics = preference_loss(scores, config=config.algorithm)
        return per_example.sum() / normaliser, {"loss": per_example.sum().item() / normaliser,
                                                **{k: v.sum().item() / normaliser for k, v in metrics.items()}}

    return Objective(encode, count, loss, begin_step=begin_step)


# (row format, head) -> objective; new formats are added here, never as flags.
OBJECTIVES = {
    ("sft", "lm"): _sft_objective,
    ("pairs", "value"): _reward_model_objective,
    ("pairs", "lm"): _pairs_lm_objective,
    ("unpaired", "lm"): _unpaired_lm_objective,
}


def micro_batches(rows: list[dict], size: int) -> list[list[dict]]:
    return [rows[i:i + size] for i in range(0, len(rows), size)]
