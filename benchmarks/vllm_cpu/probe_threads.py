"""Generation time with 1 vs 2 torch/OMP threads in-process (2 shared cores).

    python probe_threads.py          # both settings, each in a fresh subprocess
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run(threads: int):
    import torch
    from transformers import AutoTokenizer

    from common import model_path, vllm_engine
    from rlx.rollout import SamplingParams

    path = model_path()
    e = vllm_engine(path, threads=threads)
    print(f"[threads] threads={threads}: process torch threads {torch.get_num_threads()}, "
          f"set_num_threads patched by vLLM: {torch.set_num_threads.__name__ == 'skip_set_num_threads'}")
    ids = [AutoTokenizer.from_pretrained(path)("12+30=")["input_ids"]] * 8
    sp = SamplingParams(n=4, temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=16, seed=1)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        e.generate(ids, sp)
        ts.append(time.perf_counter() - t)
    print(f"[threads] threads={threads}: 32 samples x 16 tokens: {', '.join(f'{t:.3f}' for t in ts)} s; "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(int(sys.argv[1]))
    else:
        for t in ("1", "2", "1", "2"):
            r = subprocess.run([sys.executable, __file__, t], capture_output=True, text=True)
            print("\n".join(x for x in r.stdout.splitlines() if x.startswith("[threads]")))
