"""A synthetic image task with exact answers: one coloured shape on a grey ground, and
the question "What colour is the square?" (or circle, triangle). Small PNGs (56x56 by
default: 4 image tokens for a Qwen2.5-VL at the tiny model's pixel bounds) and JSON
lines in the three row formats rlx reads: prompts (RL), sft and pairs (DPO).

Its video form (``write_video_dataset``) asks "Which way does the square move?" over a
few frames of a square crossing the ground (left, right, up or down).

Only the standard library and PIL are imported.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("square", "circle", "triangle")
QUESTION = "<image>What colour is the {shape}?"
VIDEO_QUESTION = "<video>Which way does the square move?"
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


def corpus() -> list[str]:
    """The task's text, for training a tiny tokenizer on."""
    return ([QUESTION.format(shape=s).removeprefix("<image>") for s in SHAPES] + list(COLOURS)
            + [VIDEO_QUESTION.removeprefix("<video>")] + list(DIRECTIONS))


def draw(shape: str, colour: str, rng: random.Random, size: int = 56):
    """A PIL image of one ``shape`` in ``colour`` at a random place and size."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (128, 128, 128))
    side = rng.randint(size // 3, size * 3 // 4)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    pen, box = ImageDraw.Draw(image), (x, y, x + side, y + side)
    if shape == "square":
        pen.rectangle(box, fill=COLOURS[colour])
    elif shape == "circle":
        pen.ellipse(box, fill=COLOURS[colour])
    else:
        pen.polygon([(x + side // 2, y), (x, y + side), (x + side, y + side)], fill=COLOURS[colour])
    return image


def moving_square(direction: str, colour: str, rng: random.Random, frames: int = 4, size: int = 56) -> list:
    """PIL frames of a square in ``colour`` crossing a grey ground towards ``direction``,
    the same distance each frame."""
    from PIL import Image, ImageDraw

    side = size // 4
    dx, dy = DIRECTIONS[direction]
    step = (size - side) // max(frames - 1, 1)
    # start where the whole path stays inside: at the far edge on the moving axis
    x = 0 if dx > 0 else size - side if dx < 0 else rng.randint(0, size - side)
    y = 0 if dy > 0 else size - side if dy < 0 else rng.randint(0, size - side)
    out = []
    for k in range(frames):
        image = Image.new("RGB", (size, size), (128, 128, 128))
        left, top = x + dx * step * k, y + dy * step * k
        ImageDraw.Draw(image).rectangle((left, top, left + side - 1, top + side - 1), fill=COLOURS[colour])
        out.append(image)
    return out


def write_video_dataset(folder: str | Path, rows: int = 64, *, seed: int = 0, frames: int = 4,
                        size: int = 56) -> dict[str, Path]:
    """The video form of ``write_dataset``: each row's frames under ``folder/frames``, and
    "Which way does the square move?" rows (label, response or chosen: the direction) in
    ``prompts.jsonl``, ``sft.jsonl`` and ``pairs.jsonl``; a row's ``videos`` holds one video,
    the list of its frames' paths."""
    folder = Path(folder)
    (folder / "frames").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines: dict[str, list[str]] = {"prompts": [], "sft": [], "pairs": []}
    for i in range(rows):
        direction, colour = rng.choice(sorted(DIRECTIONS)), rng.choice(sorted(COLOURS))
        names = []
        for k, frame in enumerate(moving_square(direction, colour, rng, frames, size)):
            names.append(f"frames/{i:05d}_{k}.png")
            frame.save(folder / names[-1])
        row = {"prompt": VIDEO_QUESTION, "videos": [names]}
        wrong = rng.choice([d for d in sorted(DIRECTIONS) if d != direction])
        lines["prompts"].append(json.dumps({**row, "label": direction}))
        lines["sft"].append(json.dumps({**row, "response": direction}))
        lines["pairs"].append(json.dumps({**row, "chosen": direction, "rejected": wrong}))
    return _write(folder, lines)


def write_dataset(folder: str | Path, rows: int = 64, *, seed: int = 0, size: int = 56) -> dict[str, Path]:
    """Write ``rows`` images under ``folder/images`` and their rows in three files:
    ``prompts.jsonl`` (prompt, images, label), ``sft.jsonl`` (+ response) and
    ``pairs.jsonl`` (chosen: the right colour; rejected: another). Image paths are
    relative to ``folder``, where rlx looks for them first. Returns the files by format."""
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines: dict[str, list[str]] = {"prompts": [], "sft": [], "pairs": []}
    for i in range(rows):
        shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        name = f"images/{i:05d}.png"
        draw(shape, colour, rng, size).save(folder / name)
        row = {"prompt": QUESTION.format(shape=shape), "images": [name]}
        wrong = rng.choice([c for c in sorted(COLOURS) if c != colour])
        lines["prompts"].append(json.dumps({**row, "label": colour}))
        lines["sft"].append(json.dumps({**row, "response": colour}))
        lines["pairs"].append(json.dumps({**row, "chosen": colour, "rejected": wrong}))
    return _write(folder, lines)


def _write(folder: Path, lines: dict[str, list[str]]) -> dict[str, Path]:
    files = {}
    for kind, text in lines.items():
        files[kind] = folder / f"{kind}.jsonl"
        files[kind].write_text("\n".join(text) + "\n")
    return files
