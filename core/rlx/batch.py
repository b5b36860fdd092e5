"""The batch type: one step's samples as they travel between roles.

A ``Batch`` holds padded tensors, prompts on the left and responses on the right, one
row per sample. Fields the step has not reached yet are ``None`` (the reference's
log-probs before the reference has scored the batch ...). ``extra`` carries model inputs
beyond token ids (image tensors, say). An entry named in ``extra_rows`` is ragged: each
sample owns ``extra_rows[key][b]`` consecutive rows of it (a VLM's ``pixel_values`` holds
every image patch of the batch, a sample's patches together); any other entry has the
samples on dim 0. ``position_ids`` is [B, axes, P + R] for models with several rotary
axes (M-RoPE).

It splits by rank (``split``), comes back together (``concat``), takes any subset of
its samples (``select``) and pickles as plain tensors, so a launcher can ship it to a
worker in another process unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    position_ids: torch.Tensor  # [B, P + R]
    action_mask: torch.Tensor  # [B, R] 1 on generated tokens that get a gradient
    prompt_len: int  # P: responses start at this column of input_ids
    rewards: torch.Tensor  # [B] after length shaping
    group_ids: torch.Tensor  # [B] samples with equal ids share a prompt
    rollout_logp: torch.Tensor | None = None  # [B, R] the engine's log-probs of the sampled tokens
    old_logp: torch.Tensor | None = None  # [B, R] the policy's before this step's updates
    ref_logp: torch.Tensor | None = None  # [B, R]
    values: torch.Tensor | None = None  # [B, R] the critic's
    advantages: torch.Tensor | None = None  # [B, R]
    returns: torch.Tensor | None = None  # [B, R]
    policy_version: torch.Tensor | None = None  # [B] the policy version of each sample's oldest token
    token_versions: torch.Tensor | None = None  # [B, R] the policy version that sampled each response token
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # model inputs beyond token ids
    extra_rows: dict[str, torch.Tensor] = field(default_factory=dict)  # [B] rows of each ragged extra per sample

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)}

    def select(self, index: list[int] | torch.Tensor) -> "Batch":
        """The samples at ``index``, in that order."""
        placed: dict[torch.device, torch.Tensor] = {}

        def pick(value: torch.Tensor) -> torch.Tensor:
            if value.device not in placed:
                placed[value.device], = on_device(value.device, index)
            return value[placed[value.device]]

        picked = {name: pick(value) for name, value in self._tensors().items()}
        extra = {k: _ragged_select(v, self.extra_rows[k], index) if k in self.extra_rows else pick(v)
                 for k, v in self.extra.items()}
        return dataclasses.replace(self, **picked, extra=extra, extra_rows={k: pick(v) for k, v in self.extra_rows.items()})

    def split(self, parts: int) -> list["Batch"]:
        """``parts`` contiguous shares of nearly equal size (a rank's share each); every
        sample lands in exactly one, in order."""
        if not 1 <= parts <= max(len(self), 1):
            raise ValueError(f"cannot split {len(self)} samples into {parts} parts")
        bounds = [round(i * len(self) / parts) for i in range(parts + 1)]
        return [self.select(list(range(bounds[i], bounds[i + 1]))) for i in range(parts)]

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        """The samples of ``batches`` in order; they must share their padded widths."""
        first = batches[0]
        for b in batches[1:]:
            if b.prompt_len != first.prompt_len or b.action_mask.shape[1] != first.action_mask.shape[1]:
                raise ValueError("batches of different padded widths cannot be concatenated")
        joined = {}
        for f in dataclasses.fields(first):
            values = [getattr(b, f.name) for b in batches]
            if isinstance(values[0], torch.Tensor):
                if any(v is None for v in values):
                    raise ValueError(f"field {f.name!r} is set in some batches and not in others")
                joined[f.name] = torch.cat(values)
        extra = {k: torch.cat([b.extra[k] for b in batches]) for k in first.extra}
        rows = {k: torch.cat([b.extra_rows[k] for b in batches]) for k in first.extra_rows}
        return dataclasses.replace(first, **joined, extra=extra, extra_rows=rows)

    def to(self, device) -> "Batch":
        moved = {name: value.to(device) for name, value in self._tensors().items()}
        return dataclasses.replace(self, **moved, extra={k: v.to(device) for k, v in self.extra.items()})

    @property
    def responses(self) -> torch.Tensor:
        """The response tokens, [B, R]."""
        return self.input_ids[:, self.prompt_len:]


def on_device(device: torch.device, *indices) -> list[torch.Tensor]:
    """Integer indices (lists, numpy arrays or tensors) as int64 tensors on ``device``; from
    the host to a GPU in one copy that does not wait for it. A host index makes each tensor
    it indexes copy it over first, a copy that waits for the GPU's queue to drain: once per
    tensor of every micro-batch, the GPU idling each time while the host queued the next
    forward."""
    parts = [torch.as_tensor(i, dtype=torch.long) for i in indices]
    if device.type != "cuda" or any(p.device.type != "cpu" for p in parts):
        return [p.to(device) for p in parts]
    flat = torch.cat([p.flatten() for p in parts]).pin_memory().to(device, non_blocking=True)
    return [t.view(p.shape) for t, p in zip(flat.split([p.numel() for p in parts]), parts)]


def _ragged_select(values: torch.Tensor, rows: torch.Tensor, index: list[int] | torch.Tensor) -> torch.Tensor:
    """The rows of the samples at ``index`` (in that order) of a tensor whose sample ``b``
    owns ``rows[b]`` consecutive rows."""
    starts = (rows.cumsum(0) - rows).tolist()
    counts = rows.tolist()
    index = index.tolist() if isinstance(index, torch.Tensor) else index
    if not index:
        return values[:0]
    return torch.cat([values[starts[i]:starts[i] + counts[i]] for i in index])
