"""Images and videos in prompts: rows with pictures, their model inputs, and how those travel.

A vision-language model (VLM) needs, beside a prompt's token ids, tensors computed from
its images and videos (``pixel_values``, ``image_grid_thw``, ``pixel_values_videos`` ...)
and, for models with multi-axis rotary positions such as Qwen2-VL's M-RoPE, the position
of every prompt token on each axis. A *VLM processor*, registered by a plugin under the
model's ``model_type`` (``register_vlm_processors``), turns a prompt and its images and
videos into those; this module reads what a row names, checks the row before anything
runs, and lays the results out for the rollout engine and the batch.

A row holds its images in the ``data.image_key`` column (a path, bytes, base64 text, a
``data:`` URI or a ``{"bytes", "path"}`` record; one or a list) and marks where each
goes with an ``<image>`` placeholder in a text prompt, or with ``{"type": "image"}``
items (which may carry the image themselves under ``"image"``) in chat messages. Videos
are the same with ``data.video_key``, ``<video>`` and ``{"type": "video"}``: a video is a
list of frames (each anything an image may be) or a video file the processor decodes.
The number of images (videos) must equal the number of their placeholders.

Each sample's tensors keep that sample's rows on dim 0 (``pixel_values``: its patches;
``image_grid_thw``: its images); a batch concatenates them and remembers how many rows
each sample owns (``Batch.extra_rows``), so it can split, shuffle and shard them.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlx import paths
from rlx.errors import ConfigError, ModelError

PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
_BASE64 = re.compile(r"^[A-Za-z0-9+/=\s]+$")
IMAGE_ITEM_TYPES = ("image", "image_url")
VIDEO_ITEM_TYPES = ("video",)


@dataclass
class ModelInputs:
    """One prompt's model inputs beyond its token ids.

    ``tensors`` hold this prompt's rows on dim 0 and go to the model's forward as keyword
    arguments. ``positions`` [axes, P] are the rotary positions of the prompt's tokens
    for models that take several axes (M-RoPE); None for plain 1-D positions. The
    response continues on every axis from the largest prompt position plus one.
    """

    tensors: dict[str, Any]
    positions: Any = None


@dataclass
class VisionPrompt:
    """A prompt as a VLM processor encodes it: readable ``text`` (one placeholder token
    per image and per video), token ``ids`` (each expanded to its tokens) and the
    ``inputs``. ``placeholder_ids`` are the ids of ``text`` itself, one image token per
    image: what an engine that expands images itself (vLLM) takes; None if the processor
    cannot say."""

    text: str
    ids: list[int]
    inputs: ModelInputs
    placeholder_ids: list[int] | None = None


@dataclass
class Video:
    """A video as a VLM processor takes it: its frames (RGB PIL images, in order) and the
    frames per second they stand for, which places them in time."""

    frames: list
    fps: float


class VLMProcessor(Protocol):
    """What ``register_vlm_processors`` factories return: ``factory(model_path, *, config)``.
    A processor that takes videos sets ``takes_videos = True``; rows with videos are
    refused for the others."""

    def encode(self, prompt: str | list[dict], images: list, videos: list[Video] = ()) -> VisionPrompt:
        """Encode ``prompt`` (text, or chat messages whose contents are text; ``<image>``
        and ``<video>`` mark each image and video in order) with ``images`` (PIL images)
        and ``videos``. Raise ``ValueError`` naming what is wrong; the caller adds the row."""
        ...


class ImageError(ValueError):
    """An image, video or frame could not be read; the message names it."""


@dataclass
class StoredVideo:
    """A prompt's video as it waits for a batch: its frames' file bytes (and
    ``data.video_fps``), or the video file it is decoded from again, at ``fps``."""

    frames: list[bytes] | None
    file: str | None
    fps: float

    def load(self, processor: VLMProcessor) -> Video:
        if self.file is not None:
            return processor.fetch_video(self.file, self.fps)
        return Video([_decode(raw, f"frame {k}") for k, raw in enumerate(self.frames, 1)], self.fps)


class MediaOnDemand:
    """A prompt's model inputs kept as its images' (and videos' frames') file bytes, the
    tensors made again by its processor whenever a batch takes them: a dataset's patch
    tensors would not fit in memory (a 1024x768 image is 1000 patches of 1176 floats,
    4.7 MB). It pickles with its processor, once per message for all the prompts that
    share it. An engine that processes images itself takes ``images()`` and
    ``placeholder_ids`` instead."""

    def __init__(self, processor: VLMProcessor, prompt: str | list[dict], files: list[bytes], positions: Any,
                 placeholder_ids: list[int] | None = None, videos: list[StoredVideo] = ()):
        self.processor, self.prompt, self.files, self.positions = processor, prompt, files, positions
        self.placeholder_ids, self.videos = placeholder_ids, list(videos)

    def images(self) -> list:
        return [_decode(raw, f"image {i}") for i, raw in enumerate(self.files, 1)]

    @property
    def tensors(self) -> dict:
        videos = [v.load(self.processor) for v in self.videos]
        return _encode(self.processor, self.prompt, self.images(), videos).inputs.tensors


def _encode(processor: VLMProcessor, prompt: str | list[dict], images: list, videos: list[Video]) -> VisionPrompt:
    """``processor.encode``, which sees ``videos`` only when there are some (a processor
    that takes none need not know the argument)."""
    return processor.encode(prompt, images, videos) if videos else processor.encode(prompt, images)


# ---------------------------------------------------------------------------
# reading a row's images


def placeholders(prompt: str | list[dict]) -> tuple[str | list[dict], list, list]:
    """``prompt`` with chat contents made text (image items become ``<image>``, video items
    ``<video>``) and, for each image and each video placeholder in order, the source an
    item carries itself (None when it comes from the row's column)."""
    if isinstance(prompt, str):
        return prompt, [None] * prompt.count(PLACEHOLDER), [None] * prompt.count(VIDEO_PLACEHOLDER)
    messages, images, videos = [], [], []

    def text(value: str) -> str:
        images.extend([None] * value.count(PLACEHOLDER))
        videos.extend([None] * value.count(VIDEO_PLACEHOLDER))
        return value

    for message in prompt:
        content = message["content"]
        if isinstance(content, str):
            messages.append({**message, "content": text(content)})
            continue
        parts = []
        for item in content:
            if item.get("type") in IMAGE_ITEM_TYPES:
                parts.append(PLACEHOLDER)
                source = item.get("image", item.get("image_url"))
                images.append(source.get("url") if isinstance(source, dict) and "url" in source else source)
            elif item.get("type") in VIDEO_ITEM_TYPES:
                parts.append(VIDEO_PLACEHOLDER)
                videos.append(item.get("video"))
            else:
                parts.append(text(item.get("text", "")))
        messages.append({**message, "content": "".join(parts)})
    return messages, images, videos


def row_media(row: dict, prompt_key: str, image_key: str, video_key: str) -> tuple[str | list[dict], list, list]:
    """The row's prompt with text contents, the image source of each image placeholder
    and the video source of each video placeholder.

    Raises ``ValueError`` when the number of images (videos) differs from the number of
    their placeholders, or a column is missing where placeholders need it.
    """
    prompt, images, videos = placeholders(row[prompt_key])
    return (prompt, _sources(row, image_key, images, "image", PLACEHOLDER),
            _sources(row, video_key, videos, "video", VIDEO_PLACEHOLDER))


def _sources(row: dict, key: str, inline: list, kind: str, mark: str) -> list:
    """The source of each placeholder of ``kind``: carried by its item, else the next of
    the ``key`` column (one source, or a list)."""
    column = row.get(key)
    if column is None:
        column = []
    elif not isinstance(column, (list, tuple)):
        column = [column]
    wanted = sum(s is None for s in inline)
    if wanted != len(column):
        carried = len(inline) - wanted
        marks = f"{mark} or {kind} items" + (f", {carried} carrying their {kind}" if carried else "")
        where = f"key {key!r} holds {_count(len(column), kind)}"
        if key not in row:
            where = f"there is no key {key!r} (columns: {', '.join(map(str, row))})"
        hint = ""
        if kind == "video" and column and not any(isinstance(c, (list, tuple)) for c in column):
            hint = " (a video given as frames is a list inside the list: [[frame, ...]])"
        raise ValueError(f"the prompt has {_count(len(inline), kind + ' placeholder')} ({marks}) but {where}; "
                         f"give one {kind} per placeholder{hint}")
    sources = iter(column)
    return [next(sources) if s is None else s for s in inline]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def describe(source: Any) -> str:
    """A short name of an image source for messages."""
    if isinstance(source, dict):
        return repr(source["path"]) if source.get("path") else f"{len(source.get('bytes') or b'')} bytes"
    if isinstance(source, (bytes, bytearray)):
        return f"{len(source)} bytes"
    if isinstance(source, str):
        return repr(source if len(source) <= 60 else source[:57] + "...")
    return type(source).__name__


def image_file(source: Any, base_dirs: list[Path], fetch=None) -> tuple[bytes, str]:
    """The file bytes of the image ``source`` names, and a name for messages. ``source`` is
    bytes, a ``{"bytes", "path"}`` record, a ``data:`` URI, a path (relative paths are tried
    in ``base_dirs`` in turn), base64 text, or a PIL image (kept as PNG). A URL goes to
    ``fetch(url)``."""
    from PIL import Image

    if isinstance(source, Image.Image):
        return _png(source), "a PIL image"
    if isinstance(source, dict):
        if source.get("bytes"):
            return source["bytes"], describe(source)
        if source.get("path"):
            return image_file(source["path"], base_dirs, fetch)
        raise ImageError(f"image record {source!r} has neither 'bytes' nor 'path'")
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), describe(source)
    if not isinstance(source, str) or not source:
        raise ImageError(f"an image should be a path, bytes or base64 text, got {describe(source)}")
    if source.startswith(("http://", "https://")):
        if fetch is None:
            raise ImageError(f"image {describe(source)} is a URL and this model's processor fetches none")
        try:
            return _png(fetch(source)), describe(source)
        except Exception as e:  # a network error, a page that is not an image ...
            raise ImageError(f"image {describe(source)} could not be fetched: {type(e).__name__}: {e}") from e
    if source.startswith("data:"):
        header, _, payload = source.partition(",")
        if ";base64" not in header:
            raise ImageError(f"image {describe(source)}: a data: URI must be base64-encoded")
        return _b64(payload, source), "the data: URI"
    path = _find(source, base_dirs)
    if path is not None:
        try:
            return path.read_bytes(), repr(str(path))
        except OSError as e:
            raise ImageError(f"image {str(path)!r} could not be read: {e}") from e
    if len(source) >= 64 and _BASE64.match(source):
        return _b64(source, source), "base64 text"
    looked = ", ".join(repr(str(p)) for p in _candidates(source, base_dirs))
    raise ImageError(f"image file {source!r} does not exist (looked for {looked})")


def _candidates(source: str, base_dirs: list[Path]) -> list[Path]:
    """Where a file named ``source`` may be: as given when absolute, else in ``base_dirs``
    in turn, then in the working folder."""
    path = Path(source).expanduser()
    return [path] if path.is_absolute() else list(dict.fromkeys([d / source for d in base_dirs] + [path]))


def _find(source: str, base_dirs: list[Path]) -> Path | None:
    return next((p for p in _candidates(source, base_dirs) if p.is_file()), None)


def _png(image) -> bytes:
    out = io.BytesIO()
    image.convert("RGB").save(out, format="PNG")
    return out.getvalue()


def _b64(text: str, source: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"image {describe(source)} is not valid base64 ({e})") from e


def _decode(raw: bytes, what: str):
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(raw))
        image.load()  # decode now: a truncated file fails here, not inside a training step
    except UnidentifiedImageError as e:
        raise ImageError(f"image {what} is not an image file PIL can read") from e
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"image {what} is damaged or truncated: {e}") from e
    return image.convert("RGB")


# ---------------------------------------------------------------------------
# rows to encoded examples


class VisionData:
    """A run's rows with images: checks them (``check``, for ``data.validate_rows``) and
    encodes them with the model's VLM processor, the same keys as ``rlx.data``'s
    encoders plus ``inputs`` (``ModelInputs``). Relative image paths are looked up beside
    the data that ``reading`` names, then in the working folder."""

    def __init__(self, processor: VLMProcessor, tokenizer, cfg):
        self.processor, self.tokenizer, self.cfg = processor, tokenizer, cfg
        self.base_dirs: list[Path] = []

    def reading(self, data_path: str) -> "VisionData":
        """Read the rows of ``data_path`` (a file or folder) next; returns itself."""
        path = Path(data_path).expanduser()
        self.base_dirs = [path.parent] if path.is_file() else [path] if path.is_dir() else []
        return self

    def _prompt(self, row: dict) -> VisionPrompt:
        """The row's prompt encoded; its image and video tensors are made again when a batch
        uses them."""
        prompt, sources, video_sources = row_media(row, self.cfg.prompt_key, self.cfg.image_key, self.cfg.video_key)
        if video_sources and not getattr(self.processor, "takes_videos", False):
            raise ValueError(f"the prompt has {_count(len(video_sources), 'video')}, and this model's VLM processor "
                             f"({type(self.processor).__name__}) takes none")
        files, images = self._read_images(sources, "image")
        stored, videos = [], []
        for i, source in enumerate(video_sources, 1):
            try:
                kept, video = self._video(source)
            except ImageError as e:
                raise ImageError(f"video {i} of {len(video_sources)}: {e}") from e
            stored.append(kept)
            videos.append(video)
        encoded = _encode(self.processor, prompt, images, videos)
        limit = min(self.cfg.max_prompt_length, self.cfg.max_length - 1)
        if len(encoded.ids) > limit:
            # a prompt cut from the left would lose image tokens but keep their pixels
            raise ValueError(f"the prompt is {len(encoded.ids)} tokens with its images, over the limit of {limit} "
                             f"(data.max_prompt_length, data.max_length - 1): raise it or lower data.max_pixels")
        if images or videos:
            encoded.inputs = MediaOnDemand(self.processor, prompt, [raw for raw, _ in files], encoded.inputs.positions,
                                           encoded.placeholder_ids, stored)
        return encoded

    def _read_images(self, sources: list, what: str) -> tuple[list, list]:
        """Each image source read whole: its (file bytes, name) and its decoded image. A bad
        one is named by ``what`` and its place ("frame 2 of 3")."""
        fetch = getattr(self.processor, "fetch_image", None)
        files, images = [], []
        for i, source in enumerate(sources, 1):
            try:
                files.append(image_file(source, self.base_dirs, fetch))
                images.append(_decode(*files[-1]))
            except ImageError as e:
                raise ImageError(f"{what} {i} of {len(sources)}: {e}") from e
        return files, images

    def _video(self, source: Any) -> tuple[StoredVideo, Video]:
        """A video source read (every frame whole, or the file decoded) and kept; relative
        paths are looked up beside the data, then in the working folder."""
        if isinstance(source, (list, tuple)):
            if not source:
                raise ImageError("the video has no frames")
            files, frames = self._read_images(source, "frame")
            return StoredVideo([raw for raw, _ in files], None, self.cfg.video_fps), Video(frames, self.cfg.video_fps)
        if not isinstance(source, str) or not source:
            raise ImageError(f"a video should be a list of frames or a video file's path, got {describe(source)}")
        if getattr(self.processor, "fetch_video", None) is None:
            raise ImageError(f"video {describe(source)} is a file, and this model's VLM processor decodes no video "
                             f"files: give its frames")
        path = source
        if not source.startswith(("http://", "https://")):
            found = _find(source, self.base_dirs)
            if found is None:
                looked = ", ".join(repr(str(p)) for p in _candidates(source, self.base_dirs))
                raise ImageError(f"video file {source!r} does not exist (looked for {looked})")
            path = str(found)
        kept = StoredVideo(None, path, self.cfg.video_fps)
        try:
            return kept, kept.load(self.processor)
        except Exception as e:  # a missing decoder, an unreadable file ...
            raise ImageError(f"video file {path!r} could not be read: {type(e).__name__}: {e}") from e

    def schema(self, schema):
        """``schema`` (an ``rlx.data.Schema``) that lets prompts hold image items and checks
        every row's images with ``check``."""
        import dataclasses

        from rlx.data import ImageMessages, Messages

        required = {key: tuple(ImageMessages if t is Messages else t for t in types)
                    for key, types in schema.required.items()}
        return dataclasses.replace(schema, required=required, check=self.check)

    def check(self, row: dict) -> str | None:
        """What is wrong with ``row``'s images and placeholders, or None (by encoding it:
        rows with images are encoded twice as they load, once checked and once kept)."""
        if row.get(self.cfg.messages_key) is not None:
            return (f"multi-turn rows (key {self.cfg.messages_key!r}) with images are not supported; "
                    f"use prompt and response")
        try:
            self._prompt(row)
        except ValueError as e:
            return str(e)
        return None

    def encode_prompt(self, row: dict) -> dict:
        encoded = self._prompt(row)
        cfg = self.cfg
        columns = {k: v for k, v in row.items() if k not in (cfg.prompt_key, cfg.label_key)}
        return {"prompt_ids": encoded.ids, "prompt_text": encoded.text, "label": row.get(cfg.label_key),
                "columns": columns, "inputs": encoded.inputs}

    def encode_sft(self, row: dict) -> dict:
        from rlx.data import _response_ids

        encoded = self._prompt(row)
        response = _response_ids(row[self.cfg.response_key], self.tokenizer, self.cfg.max_length - len(encoded.ids))
        return {"input_ids": encoded.ids + response, "loss_mask": [0] * len(encoded.ids) + [1] * len(response),
                "inputs": encoded.inputs}

    def encode_pair(self, row: dict) -> dict:
        from rlx.data import _response_ids

        encoded = self._prompt(row)
        out = {"inputs": encoded.inputs}
        for name, key in (("chosen", self.cfg.chosen_key), ("rejected", self.cfg.rejected_key)):
            response = _response_ids(row[key], self.tokenizer, self.cfg.max_length - len(encoded.ids))
            out[f"{name}_ids"] = encoded.ids + response
            out[f"{name}_mask"] = [0] * len(encoded.ids) + [1] * len(response)
        return out


# ---------------------------------------------------------------------------
# batches


def collate(inputs: list[ModelInputs]) -> tuple[dict, dict]:
    """The samples' tensors concatenated on dim 0 (``Batch.extra``) and each sample's row
    count of each (``Batch.extra_rows``, [B]). A sample without a tensor (a prompt with no
    image) owns no rows of it."""
    import torch

    made: dict[int, dict] = {}  # the samples of one prompt share its inputs: make them once
    for item in inputs:
        if id(item) not in made:
            made[id(item)] = item.tensors
    tensors = [made[id(item)] for item in inputs]
    shapes = {k: v.shape[1:] for item in tensors for k, v in item.items()}
    extra, rows = {}, {}
    for key, shape in shapes.items():
        parts = [item.get(key) for item in tensors]
        like = next(p for p in parts if p is not None)
        parts = [like.new_zeros((0, *shape)) if p is None else p for p in parts]
        extra[key], rows[key] = torch.cat(parts), torch.tensor([len(p) for p in parts])
    return extra, rows


def present(extra: dict) -> dict:
    """``extra`` without its empty tensors: samples without images give a VLM no pixels."""
    return {k: v for k, v in extra.items() if v.shape[0]}


def sequence_positions(prompt, length: int):
    """[axes, length]: the prompt's positions, then text positions that continue on every
    axis from its largest position plus one."""
    import torch

    after = prompt.max() + 1 + torch.arange(length - prompt.shape[1])
    return torch.cat([prompt, after.expand(prompt.shape[0], -1)], dim=1)


def padded_positions(prompts: list, lengths: list[int], width: int, *, left: bool):
    """[B, axes, width]: each sample's ``sequence_positions`` padded with zeros to ``width``
    on the left (generation batches) or the right (training batches)."""
    import torch

    axes = prompts[0].shape[0]
    out = torch.zeros(len(prompts), axes, width, dtype=torch.long)
    for row, (prompt, length) in enumerate(zip(prompts, lengths)):
        columns = slice(width - length, width) if left else slice(0, length)
        out[row, :, columns] = sequence_positions(prompt, length)
    return out


def model_positions(position_ids):
    """Positions as the model takes them: [B, T], or [axes, B, T] from a batch's [B, axes, T]."""
    return position_ids.transpose(0, 1) if position_ids is not None and position_ids.dim() == 3 else position_ids


# ---------------------------------------------------------------------------
# finding a run's processor


def model_type(path: str) -> tuple[str, bool]:
    """The ``model_type`` of a model folder and whether transformers loads it as an
    image-text-to-text model (a VLM) rather than a causal LM."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read the config of model {path!r}: {e}") from e
    kind = config.model_type
    return kind, kind in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def processor_for(config, host) -> VLMProcessor | None:
    """The VLM processor of the run's model: ``model.vlm_processor`` when set, else the one
    registered under the model's ``model_type``, else (for any other VLM) the core one over
    transformers' ``AutoProcessor``; None for a text-only model."""
    path = paths.model_path(config.model.path)
    registry = host.registry("register_vlm_processors")
    name = config.model.vlm_processor
    kind, is_vlm = model_type(path)
    if not name:
        if kind in registry.items:
            name = kind
        elif is_vlm:
            name = "auto"
        else:
            return None
    factory = AutoProcessorVLM if name == "auto" else registry.get(name)
    return factory(path, config=config)


def vision_data(config, host, tokenizer) -> VisionData | None:
    """The run's ``VisionData``, or None for a text-only model."""
    processor = processor_for(config, host)
    return None if processor is None else VisionData(processor, tokenizer, config.data)


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def copy_processor_files(model_path: str, out: Path) -> None:
    """The image processor's settings, from the model folder into a saved model's, so the
    trained model loads with the processor it was trained with."""
    import shutil

    for name in PROCESSOR_FILES:
        source = Path(model_path).expanduser() / name
        if source.is_file() and out.is_dir():
            shutil.copyfile(source, out / name)


def check_supported(config, spec, engine: str | None = None, videos: bool = False) -> None:
    """Refuse, before any model loads, what a run with images cannot do yet (``engine``:
    the online run's rollout engine; ``videos``: whether its prompts hold any)."""
    problems = []
    if spec.loop == "online" and spec.value_loss:
        problems.append(f"{spec.name} trains a critic (a value model), which takes no images yet; "
                        f"use grpo, reinforce_pp, reinforce_pp_baseline or rloo")
    if spec.loop == "offline" and (spec.data, spec.head) not in (("sft", "lm"), ("pairs", "lm")):
        problems.append(f"{spec.name} (data {spec.data}, head {spec.head}) takes no images yet; "
                        f"use sft or a pairwise preference algorithm such as dpo")
    if config.training.packing:
        problems.append("training.packing does not pack image inputs yet; set it to false")
    if engine == "vllm":
        from rlx.engines.vllm import why_not_vision

        reason = why_not_vision(config.model.path)
        if reason:
            problems.append(f"rollout.engine=vllm: {reason}; use rollout.engine=native")
        if videos:
            problems.append("rollout.engine=vllm takes prompts with images but not with videos yet; "
                            "use rollout.engine=native")
    if spec.loop == "online" and config.environment.name:
        problems.append(f"environment {config.environment.name!r}: multi-turn episodes take no images yet")
    if spec.loop == "online" and config.rollout.partial_tokens:
        problems.append("rollout.partial_tokens: a response continued from its tokens so far takes no images yet; "
                        "set it to 0")
    if spec.loop == "online" and config.agent.name:
        problems.append(f"agent {config.agent.name!r}: agents talk to the model in text and take no images yet")
    if problems:
        raise ConfigError(f"model {config.model.path!r} is a vision-language model: " + "; ".join(problems))


class AutoProcessorVLM:
    """The core's processor for VLMs no plugin handles: transformers' ``AutoProcessor`` of
    the model folder. ``<image>`` becomes the processor's own image token; the processor
    expands it and computes the image tensors; positions stay 1-D. Token-aligned outputs
    (``token_type_ids`` ...) are dropped: models that need them want a plugin of their own."""

    def __init__(self, path: str, *, config):
        from transformers import AutoProcessor

        from rlx.models import load_tokenizer

        try:
            self.hf = AutoProcessor.from_pretrained(path)
        except Exception as e:
            raise ModelError(f"model {path!r} is a vision-language model with no rlx VLM processor registered "
                             f"for it, and transformers' AutoProcessor cannot load it: {type(e).__name__}: {e}") from e
        self.tokenizer = load_tokenizer(path)
        self.cfg = config.data
        self.image_token = getattr(self.hf, "image_token", None)
        if self.image_token is None:
            raise ModelError(f"the processor of {path!r} names no image token")

    def encode(self, prompt: str | list[dict], images: list) -> VisionPrompt:
        from rlx.data import render_prompt, resolve_template

        text = render_prompt(prompt, self.tokenizer, self.cfg.chat_template).replace(PLACEHOLDER, self.image_token)
        templated = resolve_template(self.tokenizer, self.cfg.chat_template) is not None
        out = self.hf(text=[text], images=images or None, return_tensors="pt", add_special_tokens=not templated)
        ids = out["input_ids"][0]
        tensors = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")
                   and not (v.dim() == 2 and v.shape == out["input_ids"].shape)}
        placeholder_ids = self.tokenizer(text, add_special_tokens=not templated)["input_ids"]
        return VisionPrompt(text, ids.tolist(), ModelInputs(tensors), placeholder_ids)
