"""Training engines: one interface over plain PyTorch and DeepSpeed ZeRO.

A loop trains through an engine like this::

    total = engine.all_reduce_sum(torch.tensor(float(tokens_on_this_rank))).item()
    for micro in micro_batches:                  # this rank's share of the step
        loss = token_losses(micro).sum() / total
        engine.backward(loss * engine.world_size)
    metrics = engine.step()                      # exactly one optimizer update

Gradients add up over the ``backward`` calls untouched: the loop normalises by the
token count of the whole step itself, so an engine never divides by the number of
micro-batches. Data-parallel engines average gradients over ranks; the
``world_size`` factor turns that average back into the sum the global normaliser
expects. On one process ``world_size`` is 1 and the factor changes nothing.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import os
import socket
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.optim.lr_scheduler import LambdaLR

from rlx import models
from rlx.config import TrainingConfig

log = logging.getLogger(__name__)


def lr_lambda(cfg: TrainingConfig, total_steps: int) -> Callable[[int], float]:
    """The learning-rate multiplier of optimizer step ``step`` (0-based).

    Linear warmup reaches the full rate on the last warmup step; the decay then ends
    at ``min_lr_ratio`` on the last step of ``total_steps``.
    """
    warmup, floor = cfg.warmup_steps, cfg.min_lr_ratio
    decay_steps = max(1, total_steps - warmup - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / decay_steps)
        if cfg.scheduler == "cosine":
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - (1.0 - floor) * progress

    return factor


def resync_lr(scheduler: LambdaLR) -> None:
    """Give each group the rate of the schedule at the step the scheduler was restored to.

    The optimizer state holds the rate the saving run's schedule set; a resumed run whose
    schedule differs (a larger ``max_steps``) would take one step at that stale rate.
    With the same schedule this changes nothing.
    """
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)


def param_groups(named: list[tuple[str, torch.Tensor]], weight_decay: float) -> list[dict]:
    """AdamW groups: matrices decay, biases and norm weights (1-D) do not."""
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _trainable(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class TrainEngine(abc.ABC):
    """What a training loop needs from a backend.

    ``model`` is what the loop calls forward on; ``rank``/``world_size`` describe data
    parallelism and ``device`` is where this rank's inputs go.
    """

    model: torch.nn.Module
    device: torch.device
    rank: int = 0
    world_size: int = 1

    @abc.abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Add ``loss``'s gradients to those accumulated since the last ``step``."""

    @abc.abstractmethod
    def step(self) -> dict[str, float]:
        """Clip, update once, advance the schedule and clear the gradients.

        Returns the pre-clipping gradient norm and the learning rate this update used.
        """

    @abc.abstractmethod
    def save(self, directory: Path) -> None:
        """Write model, optimizer and scheduler state (collective on several ranks)."""

    @abc.abstractmethod
    def load(self, directory: Path) -> None:
        """Restore what ``save`` wrote, so the next step is the one that would have come."""

    @abc.abstractmethod
    def unwrapped(self) -> torch.nn.Module:
        """The Hugging Face module (a peft wrapper under LoRA); ZeRO-3 leaves it partitioned."""

    def gathered(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """A context holding ``unwrapped()`` with full parameters on every rank."""
        return contextlib.nullcontext(self.unwrapped())

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """A CPU copy of the full weights on rank 0, ``None`` on the others (collective)."""
        module = self.unwrapped()
        return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()} if self.rank == 0 else None

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of ``tensor`` over ranks (``tensor`` itself on one process)."""
        if self.world_size == 1:
            return tensor
        import torch.distributed as dist

        comm = tensor.detach().to(self._comm_device(), copy=True)
        dist.all_reduce(comm, op=dist.ReduceOp.SUM)
        return comm.to(tensor.device)

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def _comm_device(self) -> torch.device:
        import torch.distributed as dist

        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


class PlainEngine(TrainEngine):
    """One device, torch AdamW and a LambdaLR schedule.

    Weights in bfloat16/float16 are trained through float32 master copies: the
    optimizer updates the masters and the model gets them rounded, so updates far
    below the low-precision resolution are not lost.
    """

    def __init__(self, model: torch.nn.Module, cfg: TrainingConfig, *, total_steps: int):
        self.model = model
        self.device = next(model.parameters()).device
        self.max_grad_norm = cfg.max_grad_norm
        models.compile_layers(model, cfg.compile, cfg.compile_memory)
        named = _trainable(model)
        if not named:
            raise ValueError("the model has no trainable parameters")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._masters = [p if p.dtype == torch.float32 else p.detach().float() for p in self._params]
        # fused on CUDA: one kernel for all tensors, and none of foreach's whole-model temporaries
        self.optimizer = torch.optim.AdamW(
            param_groups(list(zip(self._names, self._masters)), cfg.weight_decay),
            lr=cfg.lr, betas=tuple(cfg.adam_betas), fused=self.device.type == "cuda" or None)
        self.scheduler = LambdaLR(self.optimizer, lr_lambda(cfg, total_steps))

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> dict[str, float]:
        for p, m in zip(self._params, self._masters):
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self._masters, max_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._copy_masters()
        return {"grad_norm": float(norm), "lr": lr}

    @torch.no_grad()
    def _copy_masters(self) -> None:
        for p, m in zip(self._params, self._masters):
            if m is not p:
                p.copy_(m)

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # the trainable weights only (the masters where there are any): frozen ones come from the model path
        torch.save({
            "params": dict(zip(self._names, self._masters)),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }, directory / "engine.pt")

    @torch.no_grad()
    def load(self, directory: Path) -> None:
        state = torch.load(Path(directory) / "engine.pt", map_location=self.device, weights_only=True)
        missing = [n for n in self._names if n not in state["params"]]
        if missing:
            raise KeyError(f"checkpoint {directory} lacks trainable weights {', '.join(missing[:5])}")
        for name, m in zip(self._names, self._masters):
            m.copy_(state["params"][name])
        self._copy_masters()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        resync_lr(self.scheduler)

    def unwrapped(self) -> torch.nn.Module:
        return self.model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device: torch.device, timeout_s: int = 600) -> None:
    """Start torch.distributed (and DeepSpeed's view of it) unless a launcher already did.

    A single process without a launcher gets one-rank defaults on a free local port. A
    collective that waits more than ``timeout_s`` (a rank hung or gone) raises instead of
    blocking the run for ever.
    """
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        return
    rendezvous = [key for key in ("MASTER_ADDR", "MASTER_PORT") if key not in os.environ]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    import deepspeed

    try:
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", auto_mpi_discovery=False,
                                   timeout=datetime.timedelta(seconds=timeout_s))
    finally:
        # the port is now held by this process's store: a process started from this one
        # (another run, say) must not inherit it and fail with "address already in use"
        for key in rendezvous:
            os.environ.pop(key, None)


def deepspeed_config(cfg: TrainingConfig, dtype: torch.dtype, micro_steps_per_step: int, world_size: int,
                     *, pin_memory: bool = False) -> dict:
    """The DeepSpeed config for ``cfg``.

    ``managed_gradient_accumulation`` off makes every ``step()`` the accumulation
    boundary, whatever the number of ``backward`` calls before it; the batch sizes
    only feed DeepSpeed's sample counters.
    """
    if cfg.offload_optimizer and cfg.zero_stage == 0:
        raise ValueError("training.offload_optimizer needs training.zero_stage 1, 2 or 3")
    if cfg.offload_params and cfg.zero_stage != 3:
        raise ValueError("training.offload_params needs training.zero_stage 3")
    zero: dict = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if cfg.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": micro_steps_per_step,
        "train_batch_size": micro_steps_per_step * world_size,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": dtype == torch.float16},
        # a torch AdamW client optimizer is fine beside offloading (DeepSpeedCPUAdam is faster)
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31,
        "wall_clock_breakdown": False,
    }


def _adamw(groups: list[dict], cfg: TrainingConfig, device: torch.device) -> torch.optim.Optimizer:
    """torch AdamW, or DeepSpeedCPUAdam when optimizer states leave a GPU for the CPU."""
    kwargs = dict(lr=cfg.lr, betas=tuple(cfg.adam_betas))
    if cfg.offload_optimizer and device.type == "cuda":
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(groups, adamw_mode=True, **kwargs)
        except Exception as e:  # the op is compiled on first use and may not build here
            log.warning("DeepSpeedCPUAdam is unavailable (%s); using torch AdamW on the CPU", e)
    return torch.optim.AdamW(groups, **kwargs)


class DeepSpeedEngine(TrainEngine):
    """DeepSpeed ZeRO stages 0-3 with optional optimizer/parameter offload.

    ``model`` is the DeepSpeed engine (call it like the module). The precision follows
    the model's weights: bfloat16 or float16 weights turn on DeepSpeed's mixed
    precision with float32 master weights.
    """

    def __init__(self, model: torch.nn.Module, cfg: TrainingConfig, *, total_steps: int, micro_steps_per_step: int):
        import deepspeed
        import torch.distributed as dist

        device = next(model.parameters()).device
        init_distributed(device, cfg.collective_timeout)
        named = _trainable(model)
        if not named:
            raise ValueError("the model has no trainable parameters")
        dtypes = {p.dtype for p in model.parameters()}
        dtype = next((d for d in (torch.bfloat16, torch.float16) if d in dtypes), torch.float32)
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.zero_stage = cfg.zero_stage
        config = deepspeed_config(cfg, dtype, micro_steps_per_step, self.world_size,
                                  pin_memory=device.type == "cuda")
        optimizer = _adamw(param_groups(named, cfg.weight_decay), cfg, device)
        self._clip_norm: float | None = None
        if cfg.zero_stage == 0 and dtype == torch.float32:
            # DeepSpeed clips these gradients without reporting the norm: clip here instead,
            # just before the update, when the gradients are already reduced over ranks
            config["gradient_clipping"] = 0.0
            optimizer.register_step_pre_hook(self._clip_hook([p for _, p in named], cfg.max_grad_norm))
        schedule = lr_lambda(cfg, total_steps)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False,
            # a callable gets DeepSpeed's wrapped optimizer, whose groups are the ones stepped
            lr_scheduler=lambda opt: LambdaLR(opt, schedule))
        self.model = self.engine
        self.device = torch.device(self.engine.device)

    def _clip_hook(self, params: list[torch.Tensor], max_norm: float):
        def clip(optimizer, args, kwargs):
            self._clip_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf))

        return clip

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> dict[str, float]:
        lr = self.engine.get_lr()[0]
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            norm = self._clip_norm
        return {"grad_norm": math.nan if norm is None else float(norm), "lr": lr}

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag="engine", save_latest=False, exclude_frozen_parameters=True)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag="engine", load_module_strict=False,
                                              load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}")
        resync_lr(self.scheduler)

    def unwrapped(self) -> torch.nn.Module:
        return self.engine.module

    @contextlib.contextmanager
    def gathered(self) -> Iterator[torch.nn.Module]:
        module = self.unwrapped()
        if self.zero_stage != 3:
            yield module
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            yield module

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        if self.zero_stage != 3:
            return super().full_state_dict()
        import deepspeed

        # one parameter at a time, so no rank ever holds the whole model on its device
        state = {}
        for name, tensor in self.unwrapped().state_dict(keep_vars=True).items():
            with deepspeed.zero.GatheredParameters([tensor]) if hasattr(tensor, "ds_id") else contextlib.nullcontext():
                if self.rank == 0:
                    state[name] = tensor.detach().to("cpu", copy=True)
        return state if self.rank == 0 else None


def make_engine(model: torch.nn.Module, cfg: TrainingConfig, *, total_steps: int,
                micro_steps_per_step: int) -> TrainEngine:
    """The engine ``cfg.backend`` names, for ``total_steps`` optimizer steps of
    ``micro_steps_per_step`` backward calls each."""
    if cfg.backend == "plain":
        return PlainEngine(model, cfg, total_steps=total_steps)
    try:
        import deepspeed  # noqa: F401
    except ImportError as e:
        raise ImportError("training.backend 'deepspeed' needs DeepSpeed: pip install 'rlx[deepspeed]'") from e
    return DeepSpeedEngine(model, cfg, total_steps=total_steps, micro_steps_per_step=micro_steps_per_step)


def save_hf(engine: TrainEngine, tokenizer, out_dir: str | Path) -> Path:
    """Write the trained model in Hugging Face format from rank 0 (collective: every
    rank calls it; ZeRO-3 weights are gathered)."""
    state = engine.full_state_dict()
    if engine.rank == 0:
        models.save_hf(engine.unwrapped(), tokenizer, out_dir, state_dict=state)
    engine.barrier()
    return Path(out_dir)
