"""The policy (actor) worker: the trained model and its engine."""

from __future__ import annotations

from pathlib import Path

import torch

from rlx import models, ops
from rlx.algorithm import call_with_accepted, check_loss_output
from rlx.batch import Batch
from rlx.checkpoint import load_checkpoint, save_checkpoint
from rlx.engines import remap
from rlx.engine import make_engine, save_hf
from rlx.metrics import add_tensors
from rlx.workers.forward import Host, batched, chunks, forward_micro_batch, response_logprobs


class PolicyWorker:
    """Holds the policy model in a training engine (plain or DeepSpeed); computes its
    log-probs and trains it on a scored batch with the algorithm's losses, looked up by
    name in this process's own plugin host."""

    def __init__(self, config, host=None, *, total_steps: int, micro_steps: int):
        host, spec = own_host(config, host)
        self.config, self.a, self.t, self.r = config, config.algorithm, config.training, config.rollout
        device = models.resolve_device(self.t.device)
        torch.manual_seed(self.t.seed)  # the same weights wherever a launcher builds this worker
        self.engine = make_engine(models.load_causal_lm(config.model, device), self.t,
                                  total_steps=total_steps, micro_steps_per_step=micro_steps)
        self.loss_name = spec.policy_loss
        self.policy_loss = host.get("register_policy_losses", spec.policy_loss)
        name = getattr(self.a, "off_policy_correction", "")
        self.correction = host.get("register_off_policy_corrections", name) if name else None
        self.kl = ops.kl_estimator(self.a.kl_estimator) if hasattr(self.a, "kl_estimator") else None

    def rank(self) -> int:
        """This worker's data-parallel rank (rank 0 writes the run's files)."""
        return self.engine.rank

    def module(self) -> torch.nn.Module:
        """The Hugging Face module itself (the local launcher's rollout samples with it)."""
        return models.hf_module(self.engine.model)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        """log π(response tokens) under the current weights, [B, R]."""
        self.engine.model.eval()
        return batched(lambda part: response_logprobs(self.engine.model, part, self.r.temperature, packed=self.t.packing,
                                                      share=self.t.share_prompts)[0], batch, forward_micro_batch(self.t))

    def train_step(self, batch: Batch, *, token_count: float, seq_count: float,
                   beta: float) -> tuple[dict[str, float], dict[str, float]]:
        """One optimizer step on this rank's share of the step's samples. ``token_count`` and
        ``seq_count`` count the action tokens and non-empty sequences of the whole step (all
        ranks), so that losses are normalised as on one device. Returns this rank's share of
        the step's metrics (the driver sums them over ranks) and the update's own metrics."""
        self.engine.model.train()
        device = next(self.engine.model.parameters()).device
        memory = {}
        if device.type == "cuda":  # what the step held before the update, and its peak since the last update
            peak, _ = _peaks(device)
            memory = {"memory/before_update_gib": (torch.cuda.memory_allocated(device) + remap.mapped(device)) / 2**30,
                      "memory/rollout_peak_gib": peak}
        agg = dict(token_count=token_count, seq_count=seq_count, max_len=self.r.max_new_tokens)
        totals: dict[str, torch.Tensor] = {}
        # one optimizer step whatever the micro-batches hold: a prompt's samples go together,
        # so that each micro-batch runs its prompts once (forward._shared_prompts)
        batch = batch.select(torch.argsort(batch.group_ids.cpu(), stable=True).tolist())
        host = Host.of(batch)  # the micro-batches' layouts, worked out without waiting for the GPU
        for index in chunks(len(batch), self.t.micro_batch_size):
            add_tensors(totals, self._micro_step(batch.select(index), host.select(index), beta, token_count, agg))
        update = self.engine.step()
        if device.type == "cuda":  # the update's own peak, then the rollout's is counted afresh
            memory["memory/update_peak_gib"], memory["memory/peak_reserved_gib"] = _peaks(device)
        update.update(memory)
        return {k: v.item() for k, v in totals.items()}, update

    def _micro_step(self, micro: Batch, host: Host, beta: float, tokens: float, agg: dict) -> dict[str, torch.Tensor]:
        a, engine, mask = self.a, self.engine, micro.action_mask
        logp, entropy = response_logprobs(engine.model, micro, self.r.temperature, with_entropy=True,
                                          entropy_grad=bool(a.entropy_coef), packed=self.t.packing,
                                          share=self.t.share_prompts, host=host)
        share = mask.sum() / tokens
        measured = {}
        old_logp = micro.old_logp
        if old_logp is None:  # the driver skipped the old pass: this forward's log-probs are the old ones
            old_logp = logp.detach()
            if micro.rollout_logp is not None:
                diff = (micro.rollout_logp - old_logp).abs() * mask
                measured = {"rollout/logp_diff": ops.masked_mean(diff, mask) * share, "rollout/logp_diff_max": diff.max()}
        per_token, extra = call_with_accepted(self.policy_loss, logp, old_logp, micro.advantages, mask,
                                              config=a, rollout_logp=micro.rollout_logp)
        check_loss_output("policy loss", self.loss_name, per_token, extra, mask)
        if self.correction is not None:
            per_token, corrected = self.correction(per_token, old_logp, micro.rollout_logp, mask, config=a)
            extra = {**extra, **corrected}
        loss = ops.aggregate(per_token, mask, a.loss_agg, **agg)
        policy = loss.detach()
        if a.kl_loss and micro.ref_logp is not None:
            loss = loss + beta * ops.aggregate(self.kl(logp, micro.ref_logp), mask, a.loss_agg, **agg)
        entropy_term = ops.aggregate(entropy, mask, a.loss_agg, **agg)
        if a.entropy_coef:
            loss = loss - a.entropy_coef * entropy_term
        engine.backward(loss * engine.world_size)
        return {"loss/policy": policy, "entropy": entropy_term, **measured,
                **{k: torch.as_tensor(v, device=share.device) * share for k, v in extra.items()}}

    def rollout_weights(self) -> dict[str, torch.Tensor] | None:
        """What a rollout engine holding its own copy loads after an update (rank 0; None on
        the others; every rank must call it): checkpoint names, LoRA merged, and under LoRA
        only the adapted layers."""
        state = self.engine.full_state_dict()
        return None if state is None else models.engine_weights(self.engine.model, state)

    def save(self, checkpoints: Path, step: int, state: dict, keep: int) -> Path:
        return save_checkpoint(checkpoints, step, self.engine, state, keep=keep)

    def load(self, path: Path) -> dict:
        return load_checkpoint(path, self.engine)

    def save_final(self, tokenizer, out: Path) -> None:
        save_hf(self.engine, tokenizer, out)


def own_host(config, host=None):
    """The plugin host a worker looks its parts up in, and the run's algorithm spec. A
    worker in another process gets no host from the driver (registries do not pickle) and
    builds its own from the installed plugins and the run's local ones."""
    if host is None:
        from rlx.plugins import build_host

        host = build_host(config.plugins)
    return host, host.algorithms.get(config.algo)


def _peaks(device: torch.device) -> tuple[float, float]:
    """Peak GiB allocated and reserved since the last call, counting the native engine's
    cache mapped outside PyTorch's allocator (``remap``); both peaks start afresh."""
    mapped = remap.peak_mapped(device)
    peaks = ((torch.cuda.max_memory_allocated(device) + mapped) / 2**30,
             (torch.cuda.max_memory_reserved(device) + mapped) / 2**30)
    torch.cuda.reset_peak_memory_stats(device)
    remap.reset_peak(device)
    return peaks
