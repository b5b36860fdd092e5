"""rlx's vLLM engine as a Ray actor; weights synced from the driver through the object store.

    python ray_actor.py [--multiprocess] [--num-cpus 2] [--actor-cpus 0.5]

Checks greedy/sampled log-probs against an HF forward in the driver, perturbs every
HF parameter, ships the new state dict through ray.put (as rlx's Ray launcher does),
checks again, and also tries shipping it as one safetensors blob.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multiprocess", action="store_true", help="vLLM engine core in its own process inside the actor")
    ap.add_argument("--num-cpus", type=float, default=2)
    ap.add_argument("--actor-cpus", type=float, default=0.5)
    args = ap.parse_args()

    import ray
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common import TOL, compare, model_path
    from common import prompts as make_prompts
    from rlx.engines.vllm import _safetensors_bytes
    from rlx.rollout import SamplingParams

    path = model_path()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = make_prompts(AutoTokenizer.from_pretrained(path))

    t0 = time.perf_counter()
    # the actor imports common.py from here; keep the driver's PYTHONPATH too (it replaces the workers')
    pythonpath = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    print(f"[time] ray.init(num_cpus={args.num_cpus}): {time.perf_counter() - t0:.2f} s")

    @ray.remote(num_cpus=args.actor_cpus)
    class RolloutActor:
        def __init__(self, model_path: str, multiprocess: bool):
            from common import vllm_engine

            self.engine = vllm_engine(model_path, multiprocess=multiprocess)

        def info(self):
            import torch as _t

            return dict(pid=os.getpid(), omp=os.environ.get("OMP_NUM_THREADS"), torch_threads=_t.get_num_threads())

        def generate(self, prompt_ids, params):
            return self.engine.generate(prompt_ids, params)

        def update_weights(self, state) -> float:
            t = time.perf_counter()
            self.engine.update_weights(state)
            return time.perf_counter() - t

        def update_weights_bytes(self, payload: bytes) -> float:
            from safetensors.torch import load

            t = time.perf_counter()
            self.engine.update_weights(load(payload))
            return time.perf_counter() - t

    t0 = time.perf_counter()
    actor = RolloutActor.remote(path, args.multiprocess)
    info = ray.get(actor.info.remote())
    print(f"[time] actor ready (engine constructed, multiprocess={args.multiprocess}): "
          f"{time.perf_counter() - t0:.2f} s; actor {info}")

    greedy = SamplingParams(greedy=True, max_new_tokens=16)
    sp = SamplingParams(n=4, temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=16, seed=123)
    out = ray.get(actor.generate.remote(prompts, greedy))
    worst = compare(hf, prompts, out, check_argmax=True)
    print(f"[check] greedy vs HF: {worst:.2e}")
    assert worst < TOL
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        samples = ray.get(actor.generate.remote(prompts, sp))
        times.append(time.perf_counter() - t0)
    print(f"[time] generate 32 samples x 16 tokens (round trip): {', '.join(f'{t:.3f}' for t in times)} s")
    worst = compare(hf, prompts, samples, temperature=0.8)
    print(f"[check] sampled vs HF log_softmax(logits/T): {worst:.2e}")
    assert worst < TOL and len(samples) == 32

    # perturb, ship the state dict through the object store (Ray pickles tensors)
    old = copy.deepcopy(hf)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    for attempt in range(3):
        t0 = time.perf_counter()
        ref = ray.put({k: v.detach() for k, v in hf.state_dict().items()})
        t1 = time.perf_counter()
        inside = ray.get(actor.update_weights.remote(ref))
        t2 = time.perf_counter()
        print(f"[time] state-dict sync #{attempt}: ray.put {t1 - t0:.3f} s, remote call {t2 - t1:.3f} s "
              f"(inside actor {inside:.3f} s), total {t2 - t0:.3f} s")
    out = ray.get(actor.generate.remote(prompts, greedy))
    new_d, old_d = compare(hf, prompts, out, check_argmax=True), compare(old, prompts, out)
    print(f"[check] after state-dict sync: greedy vs HF(new) {new_d:.2e}, vs HF(old) {old_d:.2e}")
    assert new_d < TOL and old_d > 1e-2
    samples = ray.get(actor.generate.remote(prompts, sp))
    print(f"[check] after state-dict sync: sampled vs HF(new) {compare(hf, prompts, samples, temperature=0.8):.2e}")

    # the same as one safetensors blob
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    t0 = time.perf_counter()
    payload = _safetensors_bytes(hf.state_dict())
    t1 = time.perf_counter()
    inside = ray.get(actor.update_weights_bytes.remote(ray.put(payload)))
    print(f"[time] bytes sync ({len(payload) / 1e6:.2f} MB): serialize {t1 - t0:.3f} s, "
          f"total {time.perf_counter() - t0:.3f} s (inside actor, load included, {inside:.3f} s)")
    out = ray.get(actor.generate.remote(prompts, greedy))
    worst = compare(hf, prompts, out, check_argmax=True)
    print(f"[check] after bytes sync: greedy vs HF(new) {worst:.2e}")
    assert worst < TOL

    ray.kill(actor)
    ray.shutdown()
    print("ALL RAY CHECKS PASSED")


if __name__ == "__main__":
    main()
