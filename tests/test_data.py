"""Data loading, validation, chat templates, encoding and collation."""

import copy
import json

import datasets
import huggingface_hub.constants
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlx import data
from rlx.config import DataConfig
from rlx.data import DataError, RowSource, load_rows, required_keys, validate_rows
from rlx.tasks import TASKS


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def plain_tok(tok):
    """The same tokenizer without a chat template."""
    t = copy.deepcopy(tok)
    t.chat_template = None
    return t


def write_jsonl(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def load(path, fmt="sft", split="train", **cfg):
    return load_rows(str(path), DataConfig(**cfg), split=split, task_format=fmt, tasks=TASKS)


def check(source, fmt="sft", skip_bad=False, **cfg):
    return validate_rows(source, required_keys(DataConfig(**cfg), fmt), skip_bad)


def decode(tok, ids, mask=None):
    return tok.decode([t for i, t in enumerate(ids) if mask is None or mask[i]])


# ---------------------------------------------------------------------------
# loading


@pytest.mark.parametrize("fmt, keys", [
    ("sft", {"prompt", "response", "label"}),
    ("pairs", {"prompt", "chosen", "rejected", "label"}),
    ("unpaired", {"prompt", "completion", "desirable", "label"}),
    ("prompts", {"prompt", "label"}),
])
def test_builtin_rows_of_each_format(fmt, keys):
    source = load("builtin:count", fmt, builtin_size=40)
    rows, skipped, _ = check(source, fmt)
    assert len(rows) == 40 and skipped == 0
    assert all(set(r) == keys for r in rows)


def test_builtin_eval_split_is_the_tasks_test_split():
    train = {r["prompt"] for r in load("builtin:arithmetic", "prompts", builtin_size=2000).rows}
    test = {r["prompt"] for r in load("builtin:arithmetic", "prompts", split="test", builtin_size=200).rows}
    assert test and not train & test


def test_builtin_rows_follow_the_configured_keys():
    source = load("builtin:copy", "pairs", builtin_size=5, prompt_key="question", chosen_key="good")
    assert set(source.rows[0]) == {"question", "good", "rejected", "label"}
    rows, _, _ = check(source, "pairs", prompt_key="question", chosen_key="good")
    assert len(rows) == 5


def test_unknown_builtin_task_names_the_known_ones():
    with pytest.raises(DataError, match="unknown builtin task 'algebra'; known: arithmetic, arithmetic_small, copy, count"):
        load("builtin:algebra")


def test_jsonl_rows_are_numbered_by_line(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [
        {"prompt": "a", "response": "b"}, "", {"prompt": "c", "answer": "d"}])
    source = load(path)
    assert [r["prompt"] for r in source.rows] == ["a", "c"]
    with pytest.raises(DataError) as e:
        check(source)
    assert str(e.value) == f"{path} line 3: key 'response' is missing (columns: prompt, answer)"


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "response": "b"}, '{"prompt": "c", "response": '])
    with pytest.raises(DataError, match=rf"^{path} line 2: invalid JSON \(Expecting value"):
        check(load(path))


def test_json_array_and_json_lines_in_a_json_file(tmp_path):
    array = tmp_path / "array.json"
    array.write_text(json.dumps({"data": [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d"}]}))
    lines = tmp_path / "lines.json"
    write_jsonl(lines, [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d"}])
    assert check(load(array))[0] == check(load(lines))[0] == [
        {"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d"}]
    broken = tmp_path / "broken.json"
    broken.write_text('[{"prompt": "a",\n "response": }]')
    with pytest.raises(DataError, match=r"broken.json line 2: invalid JSON"):
        load(broken)


def test_csv_and_parquet_through_datasets(tmp_path):
    rows = [{"prompt": "1+1=", "completion": "2", "desirable": True},
            {"prompt": "2+2=", "completion": "", "desirable": False}]
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "d.csv").write_text("prompt,completion,desirable\n1+1=,2,true\n2+2=,,False\n")
    for name in ("d.csv", "d.parquet"):
        source = load(tmp_path / name, "unpaired")
        assert source.rows[0] == rows[0]  # csv text stays text ("2", not 2.0); booleans are read
        good, skipped, errors = check(source, "unpaired", skip_bad=True)
        assert good == rows[:1] and skipped == 1
        # csv reads an empty cell as null, parquet keeps the empty string
        assert errors[0] in (f"{tmp_path / name} row 2: key 'completion' is empty",
                             f"{tmp_path / name} row 2: key 'completion' is null")


GOOD_LINE = '{"prompt": "1+1=", "response": "2"}\n'


@pytest.mark.parametrize("name, text, line, offset", [
    # a Latin-1 "é" on line 3 of JSON lines
    ("latin1.jsonl", GOOD_LINE * 2 + '{"prompt": "caf\xe9", "response": "x"}\n', 3, 2 * len(GOOD_LINE) + 15),
    # a stray byte inside a JSON document
    ("doc.json", '[{"prompt": "a", "response": "b"},\n {"prompt": "\xff", "response": "b"}]', 2, 48),
    # a multi-byte character cut short on the last line of a CSV file
    ("cut.csv", "prompt,response\n1+1=,2\n2+2=,\xe2\x82", 3, 28),
], ids=["jsonl", "json", "csv"])
def test_invalid_utf8_names_file_line_and_offset(tmp_path, name, text, line, offset):
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(DataError) as e:
        load(path)
    message = str(e.value)
    assert message.startswith(f"{path} line {line}: not valid UTF-8 (")
    assert f"at byte offset {offset}:" in message and "save the file as UTF-8" in message
    assert isinstance(e.value.__cause__, UnicodeDecodeError)


def test_utf8_check_finds_the_same_place_across_chunks(tmp_path):
    # "é" is two bytes: small chunks cut characters in two, and the bad byte's place must
    # still count from the start of the file
    raw = "prompt,response\ncafé,é\n".encode() * 5 + b"bad,\xe9x\n" + "é\n".encode()
    path = tmp_path / "d.csv"
    path.write_bytes(raw)
    with pytest.raises(DataError) as whole:
        data._decode_utf8(path)
    offset = raw.index(b"bad,") + 4
    assert f"line 11: not valid UTF-8 (byte e9 at byte offset {offset}:" in str(whole.value)
    for size in (1, 2, 3, 7, 1 << 20):
        with pytest.raises(DataError) as chunked:
            data._check_utf8(path, chunk_size=size)
        assert str(chunked.value) == str(whole.value)
    path.write_bytes("é\n".encode() * 9)
    data._check_utf8(path, chunk_size=3)  # good text split mid-character passes


def test_utf8_bom_and_line_separators_in_json_lines(tmp_path):
    # a byte-order mark is no row; U+2028 inside a string is no line break
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "a\u2028b", "response": "c"}, {"prompt": "d", "response": "e"}]
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    source = load(path)
    assert list(source.rows) == rows and source.numbers == [1, 2]


def test_save_to_disk_folder_picks_the_split(tmp_path):
    rows = [{"prompt": f"{i}+0=", "label": str(i)} for i in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:3]),
                          "test": datasets.Dataset.from_list(rows[3:])}).save_to_disk(tmp_path / "dd")
    assert len(load(tmp_path / "dd", "prompts")) == 3
    assert load(tmp_path / "dd", "prompts", split="test").rows[0]["label"] == "3"
    with pytest.raises(DataError, match="has no split 'validation'; it has train, test"):
        load(tmp_path / "dd", "prompts", split="validation")
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "one")
    assert len(load(tmp_path / "one", "prompts")) == 4


def test_missing_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match=f"data.path: data file '{missing}' does not exist"):
        load(missing)


def test_unsupported_extension(tmp_path):
    (tmp_path / "d.txt").write_text("hello")
    with pytest.raises(DataError, match="unsupported extension"):
        load(tmp_path / "d.txt")


def test_hub_name_that_cannot_load_says_so(monkeypatch):
    # offline mode fails at once instead of retrying an unreachable hub
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="data.path 'foo/bar' is not a local file or folder, and loading it "
                                        "from the hub failed: "):
        load("foo/bar")


# ---------------------------------------------------------------------------
# validation


def rows_source(rows):
    return RowSource("data/train.jsonl", rows, numbers=[i * 2 + 1 for i in range(len(rows))], unit="line")


@pytest.mark.parametrize("fmt, row, message", [
    ("sft", {"prompt": "a", "response": 5}, "key 'response' should be str, got int 5"),
    ("sft", {"prompt": 3.5, "response": "b"}, "key 'prompt' should be str or a list of chat messages, got float"),
    ("sft", {"prompt": "a", "response": None}, "key 'response' is null"),
    ("sft", {"prompt": "a", "response": "  "}, "key 'response' is empty"),
    ("sft", ["a", "b"], "expected an object with keys prompt, response, got list"),
    ("sft", {"prompt": [{"role": "user"}], "response": "b"}, "key 'prompt' message 1 has no 'content'"),
    ("sft", {"prompt": [{"role": "user", "content": 1}], "response": "b"},
     "key 'prompt' message 1 'content' should be str, got int"),
    ("sft", {"prompt": [], "response": "b"}, "key 'prompt' is an empty list of messages"),
    ("sft", {"messages": [{"role": "user", "content": "hi"}]}, "key 'messages' has no assistant message"),
    ("pairs", {"prompt": "a", "chosen": "x", "rejected": "x"}, "keys 'chosen' and 'rejected' are the same ('x')"),
    ("pairs", {"prompt": "a", "chosen": "", "rejected": "x"}, "key 'chosen' is empty"),
    ("unpaired", {"prompt": "a", "completion": "", "desirable": True}, "key 'completion' is empty"),
    ("unpaired", {"prompt": "a", "completion": "x", "desirable": "yes"}, "key 'desirable' should be bool, got str"),
    ("unpaired", {"prompt": "a", "completion": "x", "desirable": 1}, "key 'desirable' should be bool, got int"),
    ("prompts", {"question": "a"}, "key 'prompt' is missing (columns: question)"),
])
def test_bad_rows_fail_with_source_row_and_key(fmt, row, message):
    good = {"sft": {"prompt": "a", "response": "b"}, "pairs": {"prompt": "a", "chosen": "x", "rejected": "y"},
            "unpaired": {"prompt": "a", "completion": "x", "desirable": False}, "prompts": {"prompt": "a"}}[fmt]
    with pytest.raises(DataError) as e:
        validate_rows(rows_source([good, good, row]), required_keys(DataConfig(), fmt), False)
    assert str(e.value).startswith(f"data/train.jsonl line 5: {message}")


def test_good_rows_of_every_shape_pass():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    rows = [{"prompt": "a", "response": "b"}, {"prompt": chat, "response": "b", "extra": 1},
            {"messages": chat + [{"role": "assistant", "content": "a"}]}]
    assert check(rows_source(rows))[0] == rows


def test_skip_bad_counts_and_keeps_the_first_errors():
    rows = [{"prompt": "p", "response": "r"}] + [{"prompt": "p"}] * 7
    good, skipped, errors = check(rows_source(rows), skip_bad=True)
    assert good == rows[:1] and skipped == 7
    assert len(errors) == data.MAX_REPORTED_ERRORS
    assert errors[0] == "data/train.jsonl line 3: key 'response' is missing (columns: prompt)"


def test_skip_bad_skips_invalid_json_lines(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "response": "b"}, "{oops", {"prompt": "c", "response": "d"}])
    good, skipped, errors = check(load(path), skip_bad=True)
    assert [r["prompt"] for r in good] == ["a", "c"] and skipped == 1
    assert errors[0].startswith(f"{path} line 2: invalid JSON")


def test_no_usable_rows_is_an_error():
    with pytest.raises(DataError, match="no usable rows; all 2 are malformed"):
        check(rows_source([{"prompt": "p"}] * 2), skip_bad=True)


def test_custom_keys_are_checked():
    source = rows_source([{"question": "q", "answer": "a"}])
    assert check(source, prompt_key="question", response_key="answer")[0] == source.rows
    with pytest.raises(DataError, match="key 'response' is missing"):
        check(source, prompt_key="question")


# ---------------------------------------------------------------------------
# chat templates


def test_render_prompt_auto_uses_the_tokenizer_template(tok, plain_tok):
    assert data.render_prompt("1+1=", tok, "auto") == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert data.render_prompt(chat, tok, "auto") == (
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n")
    assert data.render_prompt("1+1=", plain_tok, "auto") == "1+1="


def test_render_prompt_none_and_custom_templates(tok, tmp_path):
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert data.render_prompt("1+1=", tok, "none") == "1+1="
    assert data.render_prompt(chat, tok, "none") == "s\nu"
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}" \
               "{% if add_generation_prompt %}[assistant] {% endif %}"
    assert data.render_prompt("hi", tok, template) == "[user] hi\n[assistant] "
    (tmp_path / "t.jinja").write_text(template)
    assert data.render_prompt(chat, tok, str(tmp_path / "t.jinja")) == "[system] s\n[user] u\n[assistant] "
    with pytest.raises(DataError, match="neither a Jinja template nor a readable file"):
        data.render_prompt("hi", tok, str(tmp_path / "missing.jinja"))


# ---------------------------------------------------------------------------
# encoding


def test_encode_sft_masks_the_response_and_ends_with_eos(tok):
    ex = data.encode_sft({"prompt": "23+45=", "response": "68"}, tok, DataConfig())
    assert len(ex["input_ids"]) == len(ex["loss_mask"])
    assert decode(tok, ex["input_ids"]) == "<|im_start|>user\n23+45=<|im_end|>\n<|im_start|>assistant\n68<|endoftext|>"
    assert decode(tok, ex["input_ids"], ex["loss_mask"]) == "68<|endoftext|>"
    assert ex["input_ids"][-1] == tok.eos_token_id and ex["loss_mask"][0] == 0


def test_encode_sft_plain_text(tok):
    ex = data.encode_sft({"q": "23+45=", "a": "68"}, tok, DataConfig(chat_template="none", prompt_key="q", response_key="a"))
    assert decode(tok, ex["input_ids"]) == "23+45=68<|endoftext|>"
    assert decode(tok, ex["input_ids"], ex["loss_mask"]) == "68<|endoftext|>"


def test_truncation_keeps_the_prompt_end_and_the_response_start(tok):
    cfg = DataConfig(chat_template="none", max_prompt_length=4, max_length=7)
    prompt, response = "abcdefghijklmnop", "0123456789"
    ex = data.encode_sft({"prompt": prompt, "response": response}, tok, cfg)
    full_prompt = tok(prompt)["input_ids"]
    assert ex["input_ids"][:4] == full_prompt[-4:]  # truncated from the left
    assert decode(tok, ex["input_ids"], ex["loss_mask"]) == "012"  # then from the right
    assert len(ex["input_ids"]) == 7
    # a prompt at max_length still leaves one response token
    ex = data.encode_sft({"prompt": prompt, "response": "7"}, tok, DataConfig(chat_template="none", max_length=5))
    assert len(ex["input_ids"]) == 5 and ex["loss_mask"] == [0, 0, 0, 0, 1]


def test_multi_turn_loss_only_on_assistant_turns(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
    ]
    ex = data.encode_sft({"messages": messages}, tok, DataConfig())
    assert decode(tok, ex["input_ids"]) == tok.apply_chat_template(messages, tokenize=False)
    spans, current = [], []
    for t, m in zip(ex["input_ids"], ex["loss_mask"]):
        if m:
            current.append(t)
        elif current:
            spans.append(tok.decode(current))
            current = []
    spans += [tok.decode(current)] if current else []
    assert spans == ["2<|im_end|>\n", "4<|im_end|>\n"]


def test_multi_turn_needs_a_template(plain_tok):
    with pytest.raises(DataError, match="multi-turn rows .* need a chat template"):
        data.encode_sft({"messages": [{"role": "assistant", "content": "x"}]}, plain_tok, DataConfig())


def test_encode_pair_shares_the_prompt(tok):
    ex = data.encode_pair({"prompt": "1+1=", "chosen": "2", "rejected": "3"}, tok, DataConfig())
    n = ex["chosen_mask"].index(1)
    assert ex["chosen_ids"][:n] == ex["rejected_ids"][:n] and ex["rejected_mask"].index(1) == n
    assert decode(tok, ex["chosen_ids"], ex["chosen_mask"]) == "2<|endoftext|>"
    assert decode(tok, ex["rejected_ids"], ex["rejected_mask"]) == "3<|endoftext|>"


def test_encode_unpaired(tok):
    ex = data.encode_unpaired({"prompt": "1+1=", "completion": "3", "desirable": False}, tok, DataConfig())
    assert decode(tok, ex["prompt_ids"]) == data.render_prompt("1+1=", tok, "auto")
    assert decode(tok, ex["completion_ids"]) == "3<|endoftext|>" and ex["desirable"] is False


def test_encode_prompt_keeps_label_and_other_columns(tok):
    ex = data.encode_prompt({"prompt": "1+1=", "label": "2", "level": 3}, tok, DataConfig())
    assert ex["prompt_text"] == data.render_prompt("1+1=", tok, "auto")
    assert decode(tok, ex["prompt_ids"]) == ex["prompt_text"]
    assert ex["label"] == "2" and ex["columns"] == {"level": 3}
    assert data.encode_prompt({"prompt": "x"}, tok, DataConfig())["label"] is None


# ---------------------------------------------------------------------------
# collation

SEQS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20, 21, 22]]
MASKS = [[0, 0, 1, 1, 1, 1], [0, 1, 1], [0] * 4 + [1] * 5]


def test_pad_batch_right_and_left():
    right = data.pad_batch(SEQS[:2], MASKS[:2], pad_id=0)
    assert right["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]]
    assert right["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert right["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
    left = data.pad_batch(SEQS[:2], MASKS[:2], pad_id=99, left=True)
    assert left["input_ids"].tolist()[1] == [99, 99, 99, 11, 12, 13]
    assert left["attention_mask"].tolist()[1] == [0, 0, 0, 1, 1, 1]
    assert right["input_ids"].dtype == torch.long


def test_collate_rejects_mismatched_masks():
    with pytest.raises(ValueError, match="sample 1: 3 tokens but a mask of 2"):
        data.pad_batch(SEQS[:2], [MASKS[0], [0, 1]], 0)
    with pytest.raises(ValueError, match="do not fit"):
        data.pack_batch(SEQS, MASKS, max_tokens=10)


def test_pack_batch_layout():
    p = data.pack_batch(SEQS, MASKS, max_tokens=18)
    assert p["input_ids"].tolist() == [sum(SEQS, [])]
    assert p["position_ids"].tolist() == [list(range(6)) + list(range(3)) + list(range(9))]
    assert p["loss_mask"].tolist() == [sum(MASKS, [])]
    assert p["seq_lens"].tolist() == [6, 3, 9]


def _token_logprobs(logits, ids):
    logp = torch.log_softmax(logits.float(), -1)
    return logp[:-1].gather(-1, ids[1:, None]).squeeze(-1)


def test_packed_logprobs_equal_padded_logprobs(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", dtype=torch.float32)
    model.eval()
    padded, packed = data.pad_batch(SEQS, MASKS, pad_id=0), data.pack_batch(SEQS, MASKS)
    with torch.no_grad():
        pad_logits = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                           use_cache=False).logits
        pack_logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                            use_cache=False).logits[0]
        naive_logits = model(input_ids=packed["input_ids"], use_cache=False).logits[0]  # one long sequence
    start = 0
    for i, n in enumerate(packed["seq_lens"].tolist()):
        ids = packed["input_ids"][0, start:start + n]
        reference = _token_logprobs(pad_logits[i, :n], ids)
        assert torch.allclose(_token_logprobs(pack_logits[start:start + n], ids), reference, atol=1e-5, rtol=0)
        if i:  # without the position ids, later samples would attend to earlier ones
            assert not torch.allclose(_token_logprobs(naive_logits[start:start + n], ids), reference, atol=1e-3)
        start += n
