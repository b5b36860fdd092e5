"""Training data: loading, row validation, chat templates, encoding and collation.

Rows are plain dicts. They come from a built-in task (``builtin:NAME``), a local
json/jsonl/csv/parquet file, a ``save_to_disk`` folder or a hub dataset, and are
checked before any encoding so that a bad row is reported with its file and row
number instead of failing deep inside a training step. Encoders return plain int
lists; only the collate functions make tensors (torch is imported there).

Four row formats, named by ``task_format``:

- ``sft``: prompt + response, or a multi-turn chat under ``messages_key``
- ``pairs``: prompt + chosen + rejected
- ``unpaired``: prompt + completion + desirable (bool)
- ``prompts``: prompt (+ label and any other columns, for rewards)
"""

from __future__ import annotations

import codecs
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rlx.config import DataConfig
from rlx.errors import DataError

FORMATS = ("sft", "pairs", "unpaired", "prompts")
FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
MAX_REPORTED_ERRORS = 5
# Splits that mean "held-out data" when a builtin task is asked for one.
EVAL_SPLITS = ("test", "validation", "eval")


class Messages:
    """Type marker for ``validate_rows``: a list of ``{"role", "content"}`` chat messages."""


class Conversation(Messages):
    """Type marker: chat messages that include at least one assistant message."""


class ImageMessages(Messages):
    """Type marker: chat messages whose contents may be lists of text, image and video items."""


@dataclass(frozen=True)
class BadRow:
    """A row that could not even be parsed (an invalid JSON line)."""

    problem: str


@dataclass
class RowSource:
    """Rows and where they came from (``source``: a file, folder, hub or builtin name).

    ``rows`` is a list of dicts or a ``datasets.Dataset``. ``numbers`` holds the
    1-based number that names each row in messages (the line number for JSON lines,
    where ``unit`` is "line"); when None a row is named by its position.
    """

    source: str
    rows: Sequence[Any]
    numbers: list[int] | None = None
    unit: str = "row"

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, index: int) -> str:
        number = self.numbers[index] if self.numbers is not None else index + 1
        return f"{self.source} {self.unit} {number}"


# ---------------------------------------------------------------------------
# loading


def load_rows(
    path: str, cfg: DataConfig, *, split: str, task_format: str, tasks: dict, key: str = "data.path"
) -> RowSource:
    """Load the rows named by ``path`` (``key`` is the config key, for messages).

    ``builtin:NAME`` generates ``cfg.builtin_size`` rows of ``task_format`` from task
    ``tasks[NAME]`` (split "train", or the task's test split for "test",
    "validation" or "eval"), under the column names of ``cfg``. Anything else is a
    local file, a local folder (``save_to_disk`` or a folder of data files), or a
    hub dataset name.
    """
    if task_format not in FORMATS:
        raise ValueError(f"unknown task format {task_format!r}; known: {', '.join(FORMATS)}")
    if path.startswith("builtin:"):
        return _builtin_rows(path, cfg, split, task_format, tasks, key)
    local = Path(path).expanduser()
    if local.is_file():
        return _file_rows(local, cfg)
    if local.is_dir():
        return _folder_rows(local, split)
    check_path(path, key)
    return _hub_rows(path, split, key)


def check_path(path: str, key: str) -> None:
    """A data path that can only name a local file (one with a data file's suffix, or
    starting with ``.``, ``/`` or ``~``) must exist; anything else may be a builtin task
    or a hub dataset."""
    local = Path(path).expanduser()
    if path.startswith("builtin:") or local.exists():
        return
    if local.suffix in FILE_FORMATS or path.startswith((".", "/", "~")):
        raise DataError(f"{key}: data file {path!r} does not exist")


def _builtin_rows(path: str, cfg: DataConfig, split: str, task_format: str, tasks: dict, key: str) -> RowSource:
    from rlx.tasks import ROW_GENERATORS

    name = path.removeprefix("builtin:")
    if name not in tasks:
        raise DataError(f"{key}: unknown builtin task {name!r}; known: {', '.join(sorted(tasks)) or 'none'}")
    if split == "train":
        task_split = "train"
    elif split in EVAL_SPLITS:
        task_split = "test"
    else:
        raise DataError(f"{key}: builtin tasks have splits train and test, not {split!r}")
    rows = ROW_GENERATORS[task_format](tasks[name], cfg.builtin_size, split=task_split)
    # Builtin rows use the default column names; rename them to the configured ones.
    names = {
        "prompt": cfg.prompt_key, "response": cfg.response_key, "label": cfg.label_key,
        "chosen": cfg.chosen_key, "rejected": cfg.rejected_key,
        "completion": cfg.completion_key, "desirable": cfg.desirable_key,
    }
    rows = [{names[k]: v for k, v in row.items()} for row in rows]
    return RowSource(path, rows)


def _file_rows(path: Path, cfg: DataConfig) -> RowSource:
    kind = FILE_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"data file {str(path)!r}: unsupported extension; use one of {', '.join(FILE_FORMATS)}")
    if kind == "json":
        # Read with the json module rather than datasets: a bad line is then named by
        # its line number, a missing key stays missing instead of becoming null, and
        # rows whose values differ in type do not break a shared arrow schema.
        return _json_rows(path)
    import datasets

    options = {}
    if kind == "csv":
        _check_utf8(path)  # datasets would report a bad byte as a bare UnicodeDecodeError, with no place
        # CSV has no types: keep text columns as text, or an answer "68" becomes 68.0.
        text = (cfg.prompt_key, cfg.response_key, cfg.label_key, cfg.chosen_key, cfg.rejected_key, cfg.completion_key)
        options["converters"] = dict.fromkeys(text, str)
    try:
        ds = datasets.load_dataset(kind, data_files=str(path), split="train", **options)
    except Exception as e:
        raise DataError(f"data file {str(path)!r} could not be read as {kind}: {type(e).__name__}: {e}") from e
    return RowSource(str(path), ds)


def _decode_utf8(path: Path) -> str:
    """The text of ``path``, a leading byte-order mark dropped; bytes that are not UTF-8
    are a ``DataError`` naming the line and byte offset where they start."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e, offset=0, lines=0) from e


def _check_utf8(path: Path, chunk_size: int = 1 << 20) -> None:
    """``_decode_utf8`` without holding the file: for files that ``datasets`` reads."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = lines = 0  # bytes and new lines before the chunk
    with path.open("rb") as f:
        while True:
            chunk = f.read(chunk_size)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                # e.object is the chunk after the bytes of a character the last chunk cut short
                raise _utf8_error(path, e, offset - (len(e.object) - len(chunk)), lines) from e
            if not chunk:
                return
            offset += len(chunk)
            lines += chunk.count(b"\n")


def _utf8_error(path: Path, e: UnicodeDecodeError, offset: int, lines: int) -> DataError:
    """``e`` raised on bytes that start ``offset`` bytes and ``lines`` new lines into ``path``."""
    line = lines + e.object.count(b"\n", 0, e.start) + 1
    bad = e.object[e.start:e.end]
    what = f"byte{'s' if len(bad) > 1 else ''} {bad.hex(' ')}"
    return DataError(f"{path} line {line}: not valid UTF-8 ({what} at byte offset {offset + e.start}: "
                     f"{e.reason}); save the file as UTF-8")


def _json_rows(path: Path) -> RowSource:
    text = _decode_utf8(path)
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": the file holds JSON lines
                raise DataError(f"{path} line {e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from e
        else:
            return RowSource(str(path), _json_records(data, path))
    rows, numbers = [], []
    # split at "\n" only: str.splitlines also splits at U+2028 and others, which JSON strings may hold
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            rows.append(BadRow(f"invalid JSON ({e.msg} at column {e.colno})"))
        numbers.append(number)
    return RowSource(str(path), rows, numbers, unit="line")


def _json_records(data: Any, path: Path) -> list:
    """The records of a JSON document: a list, or the one list inside an object."""
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1:
            return lists[0]
    if isinstance(data, list):
        return data
    raise DataError(f"{path}: expected a JSON list of objects (or JSON lines), got {type(data).__name__}")


def _folder_rows(path: Path, split: str) -> RowSource:
    import datasets

    saved = (path / "dataset_dict.json").exists() or (path / "state.json").exists()
    try:
        ds = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(str(path))
    except Exception as e:
        raise DataError(f"data folder {str(path)!r} could not be loaded: {type(e).__name__}: {e}") from e
    if not isinstance(ds, datasets.DatasetDict):
        return RowSource(str(path), ds)
    if split not in ds:
        raise DataError(f"data folder {str(path)!r} has no split {split!r}; it has {', '.join(ds)}")
    return RowSource(f"{path} [{split}]", ds[split])


def _hub_rows(name: str, split: str, key: str) -> RowSource:
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:
        raise DataError(
            f"{key} {name!r} is not a local file or folder, and loading it from the hub failed: "
            f"{type(e).__name__}: {e}"
        ) from e
    return RowSource(f"{name} [{split}]", ds)


# ---------------------------------------------------------------------------
# validation


@dataclass(frozen=True)
class Schema:
    """What each row of one format must hold, for ``validate_rows``.

    ``required`` maps each key to its allowed types (``Messages`` or
    ``Conversation`` for chat messages); ``nonempty`` keys must not be blank
    strings; each pair in ``distinct`` must differ. A row that has the key
    ``instead[0]`` is checked against the schema ``instead[1]`` rather than this one.
    ``check(row)``, when set, looks further at a row that passes the rest (its images,
    say) and returns what is wrong, or None.
    """

    required: dict[str, tuple[type, ...]]
    nonempty: tuple[str, ...] = ()
    distinct: tuple[tuple[str, str], ...] = ()
    instead: tuple[str, Schema] | None = None
    check: Callable[[dict], str | None] | None = None

    def for_row(self, row: dict) -> Schema:
        if self.instead is not None and row.get(self.instead[0]) is not None:
            return self.instead[1]
        return self


def required_keys(cfg: DataConfig, task_format: str) -> Schema:
    """The schema of ``task_format`` rows under the column names of ``cfg``.

    An SFT row holding ``cfg.messages_key`` is a multi-turn chat and needs nothing else.
    """
    prompt = (str, Messages)
    if task_format == "sft":
        chat = Schema({cfg.messages_key: (Conversation,)})
        return Schema({cfg.prompt_key: prompt, cfg.response_key: (str,)}, nonempty=(cfg.response_key,),
                      instead=(cfg.messages_key, chat))
    if task_format == "pairs":
        keys = (cfg.chosen_key, cfg.rejected_key)
        return Schema({cfg.prompt_key: prompt, **dict.fromkeys(keys, (str,))}, nonempty=keys, distinct=(keys,))
    if task_format == "unpaired":
        return Schema({cfg.prompt_key: prompt, cfg.completion_key: (str,), cfg.desirable_key: (bool,)},
                      nonempty=(cfg.completion_key,))
    if task_format == "prompts":
        return Schema({cfg.prompt_key: prompt})
    raise ValueError(f"unknown task format {task_format!r}; known: {', '.join(FORMATS)}")


def validate_rows(
    source: RowSource, required: Schema | dict[str, tuple[type, ...]], skip_bad: bool
) -> tuple[list[dict], int, list[str]]:
    """Check every row; return (good rows, number skipped, the first few errors).

    ``required`` is a ``Schema`` (see ``required_keys``) or a plain mapping of keys
    to allowed types. A bad row raises ``DataError`` naming the source, the row and
    the key, or is skipped and counted when ``skip_bad``. A source with no good row
    at all is an error either way.
    """
    schema = required if isinstance(required, Schema) else Schema(dict(required))
    good, skipped, errors = [], 0, []
    for index, row in enumerate(source.rows):
        problem = _row_problem(row, schema)
        if problem is None and schema.check is not None:
            problem = schema.check(row)
        if problem is None:
            good.append(row)
            continue
        message = f"{source.where(index)}: {problem}"
        if not skip_bad:
            raise DataError(message)
        skipped += 1
        if len(errors) < MAX_REPORTED_ERRORS:
            errors.append(message)
    if not good:
        detail = f"; all {skipped} are malformed, first: {errors[0]}" if skipped else ""
        raise DataError(f"{source.source}: no usable rows{detail}")
    return good, skipped, errors


def _row_problem(row: Any, schema: Schema) -> str | None:
    if isinstance(row, BadRow):
        return row.problem
    if not isinstance(row, dict):
        return f"expected an object with keys {', '.join(schema.required)}, got {type(row).__name__}"
    schema = schema.for_row(row)
    for key, types in schema.required.items():
        if key not in row:
            return f"key {key!r} is missing (columns: {', '.join(map(str, row))})"
        if row[key] is None:
            return f"key {key!r} is null"
        problem = _type_problem(row[key], types)
        if problem:
            return f"key {key!r} {problem}"
    for key in schema.nonempty:
        if not row[key].strip():
            return f"key {key!r} is empty"
    for a, b in schema.distinct:
        if row[a] == row[b]:
            return f"keys {a!r} and {b!r} are the same ({_short(row[a])}); a pair needs two different responses"
    return None


def _type_problem(value: Any, types: tuple[type, ...]) -> str | None:
    messages = [t for t in types if issubclass(t, Messages)]
    if messages and isinstance(value, list):
        return _messages_problem(value, need_assistant=issubclass(messages[0], Conversation),
                                 items=issubclass(messages[0], ImageMessages))
    plain = tuple(t for t in types if not issubclass(t, Messages))
    if isinstance(value, plain) and not (isinstance(value, bool) and bool not in plain):
        return None
    names = " or ".join("a list of chat messages" if issubclass(t, Messages) else t.__name__ for t in types)
    return f"should be {names}, got {type(value).__name__} {_short(value)}"


def _messages_problem(messages: list, need_assistant: bool, items: bool = False) -> str | None:
    if not messages:
        return "is an empty list of messages"
    for i, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            return f"message {i} should be an object with role and content, got {type(message).__name__}"
        for field in ("role", "content"):
            if field not in message:
                return f"message {i} has no {field!r}"
            if items and field == "content" and isinstance(message[field], list):
                problem = _items_problem(message[field])
                if problem:
                    return f"message {i} {problem}"
            elif not isinstance(message[field], str):
                return f"message {i} {field!r} should be str, got {type(message[field]).__name__}"
    if need_assistant and not any(m["role"] == "assistant" for m in messages):
        return "has no assistant message to train on"
    return None


def _items_problem(content: list) -> str | None:
    """What is wrong with a list of content items (``{"type": "text", "text"}``,
    ``{"type": "image"}`` or ``{"type": "video"}``), or None."""
    for j, item in enumerate(content, 1):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind not in ("text", "image", "image_url", "video"):
            return f"content item {j} should be an object with type text, image or video, got {_short(item)}"
        if kind == "text" and not isinstance(item.get("text"), str):
            return f"content item {j} (text) has no 'text' string"
    return None


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------
# chat templates


def render_prompt(prompt: str | list[dict], tokenizer, chat_template: str) -> str:
    """The prompt as text, ready for the response to follow.

    ``chat_template`` is "auto" (the tokenizer's template when it has one, else plain
    text), "none" (plain text), a Jinja template, or a file holding one. Templating
    wraps a plain-string prompt as one user message and adds the generation prompt.
    Plain text joins the contents of chat messages with new lines.
    """
    template = resolve_template(tokenizer, chat_template)
    if template is None:
        return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)


def resolve_template(tokenizer, chat_template: str) -> str | None:
    """The Jinja template that ``chat_template`` names for ``tokenizer``; None for plain text."""
    if chat_template == "auto":
        return tokenizer.chat_template or None
    if chat_template == "none":
        return None
    if "{" not in chat_template:  # no Jinja markup: it names a file
        return _read_template(chat_template)
    return chat_template


@functools.lru_cache(maxsize=8)
def _read_template(path: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise DataError(f"data.chat_template: {path!r} is neither a Jinja template nor a readable file ({e})") from e


# ---------------------------------------------------------------------------
# encoding


def _eos(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no EOS token, which ends every response")
    return tokenizer.eos_token_id


def _prompt_ids(prompt: str | list[dict], tokenizer, cfg: DataConfig) -> tuple[str, list[int]]:
    """Rendered prompt text and its ids, truncated from the left.

    The prompt keeps at most ``max_prompt_length`` tokens and leaves at least one of
    ``max_length`` for the response. A templated prompt carries its own special
    tokens; plain text gets the tokenizer's (a BOS token, for tokenizers that use one).
    """
    text = render_prompt(prompt, tokenizer, cfg.chat_template)
    templated = resolve_template(tokenizer, cfg.chat_template) is not None
    ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
    limit = max(0, min(cfg.max_prompt_length, cfg.max_length - 1))
    return text, ids[len(ids) - limit:] if len(ids) > limit else ids


def _response_ids(text: str, tokenizer, room: int) -> list[int]:
    """Response ids ending with EOS, truncated from the right to ``room`` tokens."""
    return (tokenizer(text, add_special_tokens=False)["input_ids"] + [_eos(tokenizer)])[:max(room, 0)]


def encode_sft(row: dict, tokenizer, cfg: DataConfig) -> dict:
    """``{"input_ids", "loss_mask"}``: loss on the response (and its EOS) only.

    A row with ``cfg.messages_key`` is a multi-turn chat: the loss covers the tokens
    each assistant message adds to the templated conversation (its content and the
    template's end-of-turn tokens), and the whole is truncated to ``max_length``.
    """
    if row.get(cfg.messages_key) is not None:
        return _encode_conversation(row[cfg.messages_key], tokenizer, cfg)
    _, prompt = _prompt_ids(row[cfg.prompt_key], tokenizer, cfg)
    response = _response_ids(row[cfg.response_key], tokenizer, cfg.max_length - len(prompt))
    return {"input_ids": prompt + response, "loss_mask": [0] * len(prompt) + [1] * len(response)}


def _encode_conversation(messages: list[dict], tokenizer, cfg: DataConfig) -> dict:
    template = resolve_template(tokenizer, cfg.chat_template)
    if template is None:
        raise DataError(
            f"multi-turn rows (key {cfg.messages_key!r}) need a chat template, but data.chat_template is "
            f"{cfg.chat_template!r} and the tokenizer has none"
        )

    def ids(turns: list[dict], generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            turns, chat_template=template, tokenize=False, add_generation_prompt=generation_prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    full = ids(messages, False)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        # The assistant's tokens are those between the conversation so far (with the
        # generation prompt) and the conversation through this message; the common
        # prefix guards against a tokenizer merging across the boundary.
        start = _common_prefix(full, ids(messages[:i], True)) if i else 0
        end = _common_prefix(full, ids(messages[: i + 1], False))
        mask[start:end] = [1] * (end - start)
    return {"input_ids": full[: cfg.max_length], "loss_mask": mask[: cfg.max_length]}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def encode_pair(row: dict, tokenizer, cfg: DataConfig) -> dict:
    """``{"chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask"}``; masks mark response tokens."""
    _, prompt = _prompt_ids(row[cfg.prompt_key], tokenizer, cfg)
    out = {}
    for name, key in (("chosen", cfg.chosen_key), ("rejected", cfg.rejected_key)):
        response = _response_ids(row[key], tokenizer, cfg.max_length - len(prompt))
        out[f"{name}_ids"] = prompt + response
        out[f"{name}_mask"] = [0] * len(prompt) + [1] * len(response)
    return out


def encode_unpaired(row: dict, tokenizer, cfg: DataConfig) -> dict:
    """``{"prompt_ids", "completion_ids", "desirable"}``; the completion ends with EOS."""
    _, prompt = _prompt_ids(row[cfg.prompt_key], tokenizer, cfg)
    completion = _response_ids(row[cfg.completion_key], tokenizer, cfg.max_length - len(prompt))
    return {"prompt_ids": prompt, "completion_ids": completion, "desirable": bool(row[cfg.desirable_key])}


def encode_prompt(row: dict, tokenizer, cfg: DataConfig) -> dict:
    """``{"prompt_ids", "prompt_text", "prompt", "label", "columns"}`` for generation.

    ``prompt_text`` is the rendered prompt before truncation, ``prompt`` the row's own
    (a string or chat messages, for an agent to render its way); ``label`` is None when
    the row has none; ``columns`` holds the row's other keys (for reward functions).
    """
    text, ids = _prompt_ids(row[cfg.prompt_key], tokenizer, cfg)
    columns = {k: v for k, v in row.items() if k not in (cfg.prompt_key, cfg.label_key)}
    return {"prompt_ids": ids, "prompt_text": text, "prompt": row[cfg.prompt_key], "label": row.get(cfg.label_key),
            "columns": columns}


# ---------------------------------------------------------------------------
# collation


def _check_lengths(seqs: list[list[int]], masks: list[list[int]]) -> None:
    if not seqs:
        raise ValueError("cannot collate an empty batch")
    if len(seqs) != len(masks):
        raise ValueError(f"{len(seqs)} sequences but {len(masks)} masks")
    for i, (seq, mask) in enumerate(zip(seqs, masks)):
        if len(seq) != len(mask):
            raise ValueError(f"sample {i}: {len(seq)} tokens but a mask of {len(mask)}")


def pad_batch(seqs: list[list[int]], masks: list[list[int]], pad_id: int, left: bool = False) -> dict:
    """Pad to the longest sequence: ``input_ids``, ``attention_mask``, ``loss_mask`` [B, T].

    Right padding for training; ``left=True`` for generation, so every prompt ends
    at the last column.
    """
    import torch

    _check_lengths(seqs, masks)
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (seq, mask) in enumerate(zip(seqs, masks)):
        cols = slice(width - len(seq), width) if left else slice(0, len(seq))
        input_ids[i, cols] = torch.tensor(seq, dtype=torch.long)
        attention_mask[i, cols] = 1
        loss_mask[i, cols] = torch.tensor(mask, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def pack_batch(seqs: list[list[int]], masks: list[list[int]], max_tokens: int | None = None) -> dict:
    """Concatenate samples into one row with no padding.

    Returns ``input_ids``, ``position_ids`` (restarting at 0 for each sample) and
    ``loss_mask``, each [1, L], and ``seq_lens`` [B]. Call the model with these
    ``position_ids``, no attention mask and ``use_cache=False``: transformers then
    finds the sample boundaries from the positions and keeps attention within each
    sample (a KV cache turns that detection off). After the usual one-token shift, the logits at a
    sample's last token face the next sample's first token: split per sample with
    ``seq_lens`` before shifting. ``max_tokens`` bounds L.
    """
    import torch

    _check_lengths(seqs, masks)
    lengths = [len(s) for s in seqs]
    if max_tokens is not None and sum(lengths) > max_tokens:
        raise ValueError(f"{sum(lengths)} tokens do not fit in a pack of max_tokens={max_tokens}")
    flat = [t for seq in seqs for t in seq]
    positions = [p for n in lengths for p in range(n)]
    loss = [m for mask in masks for m in mask]
    return {
        "input_ids": torch.tensor([flat], dtype=torch.long),
        "position_ids": torch.tensor([positions], dtype=torch.long),
        "loss_mask": torch.tensor([loss], dtype=torch.long),
        "seq_lens": torch.tensor(lengths, dtype=torch.long),
    }
