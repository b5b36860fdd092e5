import math
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
import transformers

from rlx import engine as engines
from rlx import models
from rlx.config import LoraConfig, ModelConfig, TrainingConfig

VOCAB = 16


def _tiny_hf_config(**kwargs):
    return transformers.Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1, intermediate_size=128, **kwargs)


class TinyLM(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, VOCAB)

    def forward(self, ids):
        return self.head(self.norm(torch.tanh(self.emb(ids))))


def _batch(seed=1, rows=8, length=6):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, length), generator=g)
    targets = torch.randint(0, VOCAB, (rows, length), generator=g)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).float()  # token counts differ per row
    return ids, targets, mask


def _train_step(engine, batch, micro_batches):
    """One optimizer step; every micro-batch loss is normalised by the step's token count."""
    ids, targets, mask = batch
    total = mask.sum()
    for part in torch.arange(len(ids)).chunk(micro_batches):
        logits = engine.model(ids[part])
        nll = F.cross_entropy(logits.flatten(0, 1), targets[part].flatten(), reduction="none")
        engine.backward((nll * mask[part].flatten()).sum() / total)
    return engine.step()


def _params(engine):
    with engine.gathered() as module:
        return torch.cat([p.detach().flatten().clone() for p in module.parameters()])


def _cfg(**kwargs):
    base = dict(lr=1e-2, weight_decay=0.1, max_grad_norm=0.5, warmup_steps=1, scheduler="cosine")
    return TrainingConfig(**{**base, **kwargs})


def _engine(micro, seed=0, **kwargs):
    return engines.make_engine(TinyLM(seed), _cfg(**kwargs), total_steps=4, micro_steps_per_step=micro)


@pytest.fixture(scope="module", autouse=True)
def own_process_group():
    """DeepSpeed starts torch.distributed in this process; end it and its env with the module."""
    env = dict(os.environ)
    was_initialized = torch.distributed.is_initialized()
    yield
    if torch.distributed.is_initialized() and not was_initialized:
        import deepspeed.comm

        # DeepSpeed's own teardown: it also drops the groups DeepSpeed cached, which a later
        # DeepSpeed engine in this process would otherwise find stale ("group not registered")
        deepspeed.comm.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)


BACKENDS = [dict(backend="plain"), dict(backend="deepspeed", zero_stage=0), dict(backend="deepspeed", zero_stage=2),
            dict(backend="deepspeed", zero_stage=3)]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: f"{b['backend']}{b.get('zero_stage', '')}")
def test_micro_batches_add_up_to_the_full_batch(backend):
    batch = _batch()
    whole, split = _engine(1, **backend), _engine(4, **backend)
    start = _params(whole)
    for _ in range(2):
        a, b = _train_step(whole, batch, 1), _train_step(split, batch, 4)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert not torch.allclose(_params(whole), start)
    torch.testing.assert_close(_params(split), _params(whole), atol=1e-6, rtol=0)


def test_schedule():
    warm = engines.lr_lambda(_cfg(warmup_steps=3, min_lr_ratio=0.1, scheduler="cosine"), total_steps=10)
    assert [warm(s) for s in range(4)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    assert warm(9) == pytest.approx(0.1) and warm(20) == pytest.approx(0.1)
    assert 0.1 < warm(6) < 1.0
    linear = engines.lr_lambda(_cfg(warmup_steps=0, min_lr_ratio=0.2, scheduler="linear"), total_steps=5)
    assert [linear(s) for s in range(5)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    constant = engines.lr_lambda(_cfg(warmup_steps=2, scheduler="constant"), total_steps=5)
    assert [constant(s) for s in range(5)] == pytest.approx([0.5, 1, 1, 1, 1])


def test_step_reports_the_rate_it_used():
    cfg = _cfg(lr=0.1, warmup_steps=2, min_lr_ratio=0.1, scheduler="cosine")
    engine = engines.make_engine(TinyLM(), cfg, total_steps=5, micro_steps_per_step=1)
    rates = [_train_step(engine, _batch(), 1)["lr"] for _ in range(5)]
    assert rates == pytest.approx([0.05, 0.1, 0.1, 0.055, 0.01])


def test_clipping_and_grad_norm():
    engine = _engine(1, max_grad_norm=1e-3)
    module = engine.model
    ids, targets, mask = _batch()
    loss = F.cross_entropy(module(ids).flatten(0, 1), targets.flatten())
    grads = torch.autograd.grad(loss, list(module.parameters()), retain_graph=True)
    engine.backward(loss)
    norm = engine.step()["grad_norm"]
    assert norm == pytest.approx(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item(), rel=1e-5)
    assert norm > 1e-3  # so the step was clipped


def test_low_precision_weights_keep_float32_masters():
    module = TinyLM().to(torch.bfloat16)
    engine = engines.make_engine(module, _cfg(lr=1e-5, weight_decay=0.0, max_grad_norm=0.0), total_steps=3,
                                 micro_steps_per_step=1)
    start = [p.detach().clone() for p in module.parameters()]
    for _ in range(3):
        _train_step(engine, _batch(), 1)
    # an update of ~1e-5 is below bfloat16's resolution for most weights, but not lost
    assert all(m.dtype is torch.float32 for m in engine._masters)
    moved = sum((m - s.float()).abs().sum().item() for m, s in zip(engine._masters, start))
    assert moved > 0
    for p, m in zip(module.parameters(), engine._masters):
        assert torch.equal(p, m.to(torch.bfloat16))


@pytest.mark.parametrize("stage,offload", [(0, False), (2, False), (2, True), (3, False)])
def test_deepspeed_matches_plain(stage, offload):
    plain = _engine(2)
    ds = _engine(2, backend="deepspeed", zero_stage=stage, offload_optimizer=offload)
    assert isinstance(ds, engines.DeepSpeedEngine) and ds.world_size == 1 and ds.rank == 0
    start = _params(ds)
    a, b = _train_step(plain, _batch(), 2), _train_step(ds, _batch(), 2)
    assert b["lr"] == a["lr"] and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert a["grad_norm"] > 0.5  # clipping is part of what is compared
    assert not torch.allclose(_params(ds), start)
    torch.testing.assert_close(_params(ds), _params(plain), atol=1e-6, rtol=0)


def test_deepspeed_config():
    config = engines.deepspeed_config(_cfg(zero_stage=3, offload_optimizer=True, offload_params=True),
                                      torch.bfloat16, micro_steps_per_step=4, world_size=2)
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["bf16"]["enabled"] and not config["fp16"]["enabled"]
    assert config["train_batch_size"] == 8 and config["gradient_clipping"] == 0.5
    with pytest.raises(ValueError, match="zero_stage 3"):
        engines.deepspeed_config(_cfg(zero_stage=2, offload_params=True), torch.float32, 1, 1)


@pytest.mark.parametrize("backend", [dict(backend="plain"), dict(backend="deepspeed", zero_stage=2)],
                         ids=["plain", "deepspeed2"])
def test_save_load_resumes_the_same_step(backend, tmp_path):
    first = _engine(2, **backend)
    _train_step(first, _batch(1), 2)
    first.save(tmp_path / "ckpt")
    want = _train_step(first, _batch(2), 2)

    resumed = _engine(2, seed=7, **backend)  # other weights: load must replace them all
    resumed.load(tmp_path / "ckpt")
    got = _train_step(resumed, _batch(2), 2)
    assert got == want
    torch.testing.assert_close(_params(resumed), _params(first), atol=0, rtol=0)


def test_plain_save_hf_writes_the_module(tmp_path):
    model = transformers.Qwen2ForCausalLM(_tiny_hf_config())
    engine = engines.make_engine(model, _cfg(), total_steps=1, micro_steps_per_step=1)
    engines.save_hf(engine, None, tmp_path / "final")
    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    for a, b in zip(saved.parameters(), model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("lora", [0, 4])
def test_zero3_value_model_matches_plain(lora, tmp_path):
    """Scores taken at every position (token_values) under ZeRO-3, LoRA and
    checkpointing, accumulated over micro-batches, then saved in HF format."""
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(_tiny_hf_config(pad_token_id=0)).save_pretrained(tmp_path / "lm")
    cfg = ModelConfig(path=str(tmp_path / "lm"), gradient_checkpointing=True, lora=LoraConfig(rank=lora))
    ids = torch.randint(1, 64, (4, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    target = torch.tensor([1.0, -1.0, 0.5, 0.0])
    results = []
    for backend in (dict(backend="plain"), dict(backend="deepspeed", zero_stage=3)):
        torch.manual_seed(0)  # the same fresh score head
        engine = engines.make_engine(models.load_value_model(cfg, torch.device("cpu")), _cfg(**backend),
                                     total_steps=2, micro_steps_per_step=2)
        for part in (slice(0, 2), slice(2, 4)):
            rewards = models.last_token_values(models.token_values(engine.model, ids[part], mask[part]), mask[part])
            engine.backward(((rewards - target[part]) ** 2).sum() / 4)
        metrics = engine.step()
        out = tmp_path / backend["backend"]
        engines.save_hf(engine, None, out)
        saved = transformers.AutoModelForSequenceClassification.from_pretrained(out)
        with torch.no_grad():
            results.append((metrics, saved(input_ids=ids, attention_mask=mask).logits.squeeze(-1)))
    (plain, plain_rewards), (zero3, zero3_rewards) = results
    assert zero3["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    torch.testing.assert_close(zero3_rewards, plain_rewards, atol=1e-5, rtol=0)


@pytest.mark.parametrize("packed", [False, True])
def test_zero3_critic_values_match_plain(packed, tmp_path):
    """A critic's values (``forward.response_values``: its score head run on the states the
    forward hands back) and their gradients under ZeRO-3, padded and packed."""
    from rlx.batch import Batch
    from rlx.workers.forward import response_values

    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(_tiny_hf_config(pad_token_id=0)).save_pretrained(tmp_path / "lm")
    cfg = ModelConfig(path=str(tmp_path / "lm"))
    ids = torch.randint(1, 64, (4, 9), generator=torch.Generator().manual_seed(0))
    action = torch.ones(4, 5)
    action[1, 2:] = 0
    attention = torch.cat([torch.ones(4, 4, dtype=torch.long), action.long()], 1)
    batch = Batch(input_ids=ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
                  action_mask=action, prompt_len=4, rewards=torch.zeros(4), group_ids=torch.arange(4))
    target = torch.randn(4, 5)
    results = []
    for backend in (dict(backend="plain"), dict(backend="deepspeed", zero_stage=3)):
        torch.manual_seed(0)  # the same fresh score head
        engine = engines.make_engine(models.load_value_model(cfg, torch.device("cpu")), _cfg(**backend),
                                     total_steps=2, micro_steps_per_step=2)
        values = []
        for part in ([0, 1], [2, 3]):
            micro = batch.select(part)
            v = response_values(engine.model, micro, packed=packed)
            engine.backward((((v - target[part]) * micro.action_mask) ** 2).sum() / 4)
            values.append(v.detach())
        results.append((engine.step(), torch.cat(values) * action))
    (plain, plain_values), (zero3, zero3_values) = results
    assert zero3["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5) and plain["grad_norm"] > 0
    torch.testing.assert_close(zero3_values, plain_values, atol=1e-5, rtol=0)


TWO_RANKS = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch
    import torch.nn.functional as F
    import transformers

    from rlx import engine as engines
    from rlx.checkpoint import load_checkpoint, save_checkpoint
    from rlx.config import TrainingConfig

    out = Path(sys.argv[1])
    batches = torch.load(out / "batches.pt")
    cfg = TrainingConfig(backend="deepspeed", zero_stage=3, lr=1e-2, max_grad_norm=1.0, warmup_steps=1)
    model = transformers.Qwen2ForCausalLM.from_pretrained(out / "init")
    engine = engines.make_engine(model, cfg, total_steps=3, micro_steps_per_step=2)
    assert engine.world_size == 2

    def step(ids, mask):
        share = slice(engine.rank, None, engine.world_size)
        ids, mask = ids[share], mask[share]
        total = engine.all_reduce_sum(mask[:, 1:].sum().float()).item()
        for part in torch.arange(len(ids)).chunk(2):
            logits = engine.model(input_ids=ids[part], attention_mask=mask[part]).logits[:, :-1]
            nll = F.cross_entropy(logits.flatten(0, 1), ids[part, 1:].flatten(), reduction="none")
            loss = (nll * mask[part, 1:].flatten()).sum() / total
            engine.backward(loss * engine.world_size)
        return engine.step()

    def full():
        with engine.gathered() as module:
            return {n: p.detach().clone() for n, p in module.named_parameters()}

    metrics = [step(*batches[0])]
    save_checkpoint(out / "ckpt", 1, engine, {"step": 1}, keep=1)
    metrics.append(step(*batches[1]))
    after_two = full()
    load_checkpoint(out / "ckpt" / "step_00000001", engine)
    resumed = step(*batches[1])
    assert resumed == metrics[1], (resumed, metrics[1])
    for name, p in full().items():
        assert torch.equal(p, after_two[name]), name
    engines.save_hf(engine, None, out / "final")
    torch.save({"params": after_two, "metrics": metrics}, out / f"rank{engine.rank}.pt")
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_zero3_matches_one_process(tmp_path):
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(_tiny_hf_config()).save_pretrained(tmp_path / "init")
    g = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(2):
        ids = torch.randint(0, 64, (8, 10), generator=g)
        mask = (torch.arange(10)[None] < torch.randint(3, 11, (8, 1), generator=g)).long()
        batches.append((ids, mask))
    torch.save(batches, tmp_path / "batches.pt")
    (tmp_path / "two_ranks.py").write_text(TWO_RANKS)

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(_free_port()), str(tmp_path / "two_ranks.py"), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    for name, p in ranks[0]["params"].items():
        assert torch.equal(p, ranks[1]["params"][name]), name
    checkpoint = tmp_path / "ckpt" / "step_00000001"
    assert (checkpoint / "COMPLETE").is_file()
    assert sorted(p.name for p in (checkpoint / "rng").iterdir()) == ["rank_0.pt", "rank_1.pt"]

    # the same two steps on one process over the whole batch
    model = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "init")
    plain = engines.make_engine(model, TrainingConfig(lr=1e-2, max_grad_norm=1.0, warmup_steps=1),
                                total_steps=3, micro_steps_per_step=1)
    for i, (ids, mask) in enumerate(batches):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        nll = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        plain.backward((nll * mask[:, 1:].flatten()).sum() / mask[:, 1:].sum())
        metrics = plain.step()
        assert metrics["grad_norm"] == pytest.approx(ranks[0]["metrics"][i]["grad_norm"], rel=1e-4)
    for name, p in model.named_parameters():
        # Adam turns rounding noise in near-zero gradients into updates of up to ~lr/100
        torch.testing.assert_close(ranks[0]["params"][name], p.detach(), atol=1e-4, rtol=0, msg=name)

    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    for name, p in saved.named_parameters():
        assert torch.equal(p, ranks[0]["params"][name]), name
    assert math.isfinite(ranks[0]["metrics"][1]["lr"])


HUNG = textwrap.dedent('''
    import os, sys, time
    import torch
    import torch.distributed as dist
    from rlx.engine import init_distributed

    rank = int(os.environ["RANK"])
    init_distributed(torch.device("cpu"), timeout_s=5)
    if rank == 1:
        time.sleep(60)  # never joins the all-reduce
        sys.exit(0)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as e:
        print(f"FAILED after {time.monotonic() - started:.1f} s: {type(e).__name__}", flush=True)
        os._exit(3)  # gloo's threads may abort a normal interpreter shutdown after a timeout
    print("returned")
''')


def test_a_hung_collective_fails_after_the_timeout(tmp_path):
    (tmp_path / "hung.py").write_text(HUNG)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen([sys.executable, str(tmp_path / "hung.py")], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out, err = ranks[0].communicate(timeout=120)
    finally:
        ranks[1].kill()
    assert ranks[0].returncode == 3, out + err
    seconds = float(out.split("FAILED after ")[1].split(" s")[0])
    assert 4 <= seconds < 30
