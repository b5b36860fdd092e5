"""The VLLMEngine as a Ray actor; weights synced from the driver through the object store.

    python ray_actor.py [--multiprocess] [--num-cpus 2] [--actor-cpus 0.5]

Checks greedy/sampled log-probs against an HF forward in the driver, perturbs every
HF parameter, ships the new state dict as safetensors bytes via ray.put, checks again,
and also tries shipping the state dict itself (tensors pickled by Ray).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
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

    from check_sync import compare
    from tiny_model import corpus, make_model
    from vllm_engine import SamplingParams, safetensors_bytes

    path = "/tmp/rlx-vllm-cpu/tiny_ray"
    shutil.rmtree(path, ignore_errors=True)
    make_model(path, seed=0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok(line.split("=")[0] + "=")["input_ids"] for line in corpus(8, seed=1)]

    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": HERE}})
    print(f"[time] ray.init(num_cpus={args.num_cpus}): {time.perf_counter() - t0:.2f} s")

    @ray.remote(num_cpus=args.actor_cpus)
    class RolloutActor:
        def __init__(self, model_path: str, multiprocess: bool):
            from vllm_engine import VLLMEngine

            self.engine = VLLMEngine(model_path, multiprocess=multiprocess)

        def info(self):
            import torch as _t

            return dict(pid=os.getpid(), omp=os.environ.get("OMP_NUM_THREADS"), torch_threads=_t.get_num_threads())

        def generate(self, prompt_ids, params):
            return self.engine.generate(prompt_ids, params)

        def update_weights_bytes(self, payload: bytes) -> float:
            t = time.perf_counter()
            self.engine.update_weights_bytes(payload)
            return time.perf_counter() - t

        def update_weights(self, state) -> float:
            t = time.perf_counter()
            self.engine.update_weights(state)
            return time.perf_counter() - t

    t0 = time.perf_counter()
    actor = RolloutActor.remote(path, args.multiprocess)
    info = ray.get(actor.info.remote())
    print(f"[time] actor ready (VLLMEngine constructed, multiprocess={args.multiprocess}): "
          f"{time.perf_counter() - t0:.2f} s; actor {info}")

    greedy = SamplingParams(greedy=True, max_new_tokens=16)
    sp = SamplingParams(n=4, temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=16, seed=123)
    out = ray.get(actor.generate.remote(prompts, greedy))
    worst = compare(hf, prompts, out, check_argmax=True)
    print(f"[check] greedy vs HF: {worst:.2e}")
    assert worst < 1e-5
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        samples = ray.get(actor.generate.remote(prompts, sp))
        times.append(time.perf_counter() - t0)
    print(f"[time] generate 32 samples x 16 tokens (round trip): {', '.join(f'{t:.3f}' for t in times)} s")
    worst = compare(hf, prompts, samples, temperature=0.8)
    print(f"[check] sampled vs HF log_softmax(logits/T): {worst:.2e}")
    assert worst < 1e-5 and len(samples) == 32

    # perturb, ship as safetensors bytes through the object store
    old = copy.deepcopy(hf)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    for attempt in range(3):
        t0 = time.perf_counter()
        payload = safetensors_bytes(hf.state_dict())
        t1 = time.perf_counter()
        ref = ray.put(payload)
        t2 = time.perf_counter()
        inside = ray.get(actor.update_weights_bytes.remote(ref))
        t3 = time.perf_counter()
        print(f"[time] sync #{attempt} ({len(payload) / 1e6:.2f} MB): serialize {t1 - t0:.3f} s, ray.put {t2 - t1:.3f} s, "
              f"remote call {t3 - t2:.3f} s (inside actor {inside:.3f} s), total {t3 - t0:.3f} s")
    out = ray.get(actor.generate.remote(prompts, greedy))
    new_d, old_d = compare(hf, prompts, out, check_argmax=True), compare(old, prompts, out)
    print(f"[check] after bytes sync: greedy vs HF(new) {new_d:.2e}, vs HF(old) {old_d:.2e}")
    assert new_d < 1e-5 and old_d > 1e-2
    samples = ray.get(actor.generate.remote(prompts, sp))
    print(f"[check] after bytes sync: sampled vs HF(new) {compare(hf, prompts, samples, temperature=0.8):.2e}")

    # the state dict itself through the object store (Ray pickles tensors)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    t0 = time.perf_counter()
    ref = ray.put({k: v.detach() for k, v in hf.state_dict().items()})
    inside = ray.get(actor.update_weights.remote(ref))
    print(f"[time] state-dict sync via ray.put: {time.perf_counter() - t0:.3f} s (inside actor {inside:.3f} s)")
    out = ray.get(actor.generate.remote(prompts, greedy))
    print(f"[check] after state-dict sync: greedy vs HF(new) {compare(hf, prompts, out, check_argmax=True):.2e}")

    ray.kill(actor)
    ray.shutdown()
    print("ALL RAY CHECKS PASSED")


if __name__ == "__main__":
    main()
