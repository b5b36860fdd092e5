"""What of ``rlx.engines.remap`` only a GPU shows (one CUDA device):

- a ``Remappable`` dropped without ``close`` gives its memory back (the module's mapped
  count and the driver's free memory both return);
- a driver that refuses to map falls back with one warning, and the W1 engine's rollouts
  (64 prompts × 8 samples, 128 new tokens here) are then the same, token for token, as
  with the addresses kept, before and after ``sleep``.

    python benchmarks/remap_check.py [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_engine  # noqa: E402


def dropped(device: torch.device) -> dict:
    from rlx.engines import remap

    before, free_before = remap.mapped(device), torch.cuda.mem_get_info(device)[0]
    memory = remap.Remappable(device, [((1024, 1024, 256), torch.bfloat16)])  # 512 MiB
    held, free_held = remap.mapped(device), torch.cuda.mem_get_info(device)[0]
    del memory
    gc.collect()
    after, free_after = remap.mapped(device), torch.cuda.mem_get_info(device)[0]
    return {"mapped_mib": [before / 2**20, held / 2**20, after / 2**20],
            "free_gib": [free_before / 2**30, free_held / 2**30, free_after / 2**30],
            "ok": after == before and held > before and free_after - free_held >= held - before}


def rollouts(engine, prompts, params) -> list[list[list[int]]]:
    """A rollout, then one after ``sleep`` and ``wake``: each sample's tokens."""
    tokens = []
    for asleep in (False, True):
        if asleep:
            engine.sleep()
            engine.wake()
        tokens.append([c.token_ids for c in engine.generate(prompts, params)])
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    from rlx.engines import remap

    device = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "supported": remap.supported(device),
              "dropped": dropped(device)}
    engine, prompts, params = w1_engine()
    params = dataclasses.replace(params, max_new_tokens=128)
    kept = rollouts(engine, prompts, params)
    result["kept_remappable"] = engine.static.remappable
    engine.static.release()

    def refuse(self, device, specs):
        raise RuntimeError("cuMemCreate failed: CUDA_ERROR_NOT_SUPPORTED (801)")

    remap.Remappable.__init__ = refuse  # as a driver without virtual memory management answers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refused = rollouts(engine, prompts, params)
    result["fallback"] = {"warnings": [str(w.message) for w in caught], "remappable": engine.static.remappable,
                          "same_tokens": refused == kept, "awake_equals_asleep": kept[0] == kept[1]}
    result["ok"] = (result["dropped"]["ok"] and result["kept_remappable"] and not engine.static.remappable
                    and len(caught) == 1 and refused == kept)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
