"""Bad input through the CLI: each mistake is named (file, line, key or path) before any
training starts, with a non-zero exit and no traceback."""

from __future__ import annotations

import json

import pytest

from e2e import cli_args, metrics, one_thread, rlx  # noqa: F401 (one_thread: autouse)

GOOD = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a, b in
        [(1, 2), (3, 4), (10, 5), (7, 7), (20, 1), (6, 3), (11, 11), (9, 0), (4, 8), (13, 2), (5, 5), (8, 1)]]


def _write(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _rows() -> list[str]:
    return [json.dumps(r) for r in GOOD]


@pytest.fixture
def train(tiny_model_dir, tmp_path):
    def train(data, *more, output=None, **settings):
        return rlx("train", "--algo", "sft", "--model", tiny_model_dir, "--data", str(data),
                   "--output", str(output or tmp_path / "run"), "--max-steps", "2", *cli_args(**settings), *more)

    return train


def _assert_nothing_trained(out):
    assert not (out / "metrics.jsonl").exists()
    assert not (out / "checkpoints").exists() and not (out / "final").exists()


def _assert_clear_error(result, *needles):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert error, result.stderr
    for needle in needles:
        assert needle in error[0], (needle, error[0])


def test_malformed_json_line_is_named_and_skip_bad_rows_goes_on(train, tmp_path):
    lines = _rows()
    lines[3] = '{"prompt": "2+2=", "response": "4"'  # line 4: cut short
    lines[8] = lines[8][:-1] + ', "response": }'  # line 9: invalid too
    path = _write(tmp_path / "sft.jsonl", lines)
    result = train(path)
    _assert_clear_error(result, f"{path} line 4", "invalid JSON")
    _assert_nothing_trained(tmp_path / "run")

    # the same command with skip_bad_rows, into the same output folder, trains
    skipped = train(path, **{"data.skip_bad_rows": True})
    assert skipped.returncode == 0, skipped.stderr
    assert f"skipped 2 malformed rows of {path}" in skipped.stdout
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2]
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_missing_key_is_named(train, tmp_path):
    lines = _rows()
    lines[2] = json.dumps({"prompt": "3+4=", "answer": "7"})
    path = _write(tmp_path / "sft.jsonl", lines)
    result = train(path)
    _assert_clear_error(result, f"{path} line 3", "key 'response' is missing", "answer")
    _assert_nothing_trained(tmp_path / "run")


def test_missing_data_file_is_named(train, tmp_path):
    path = tmp_path / "not-there.jsonl"
    result = train(path)
    _assert_clear_error(result, str(path), "does not exist")
    _assert_nothing_trained(tmp_path / "run")


def test_invalid_utf8_in_a_data_file_is_named(train, tmp_path):
    lines = [line.encode() for line in _rows()]
    lines[4] = '{"prompt": "caf\xe9 1+2=", "response": "3"}'.encode("latin-1")  # line 5: Latin-1, not UTF-8
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = train(path)
    offset = sum(len(line) + 1 for line in lines[:4]) + len('{"prompt": "caf')
    _assert_clear_error(result, f"{path} line 5: not valid UTF-8", f"byte offset {offset}")
    assert "demo settings" not in result.stdout  # the user's own data takes none of sft's demo settings
    _assert_nothing_trained(tmp_path / "run")


def test_wrong_model_path_is_named(tmp_path):
    path = tmp_path / "no-such-model"
    result = rlx("train", "--algo", "sft", "--model", str(path), "--output", str(tmp_path / "run"),
                 "--max-steps", "1", *cli_args())
    _assert_clear_error(result, str(path))
    _assert_nothing_trained(tmp_path / "run")


@pytest.mark.parametrize("model", ["/nonexistent", "./no-such-model", "models/no/such-model"])
def test_model_path_that_names_no_folder_says_so(tiny_model_dir, tmp_path, model):
    # none of these can be a hub name ("owner/name"): the error is about the folder, not the hub's naming rules
    result = rlx("train", "--algo", "sft", "--model", model, "--output", str(tmp_path / "run"),
                 "--max-steps", "1", *cli_args(), cwd=tmp_path)
    _assert_clear_error(result, f"model folder {model!r} does not exist")
    assert "repo id" not in result.stderr.lower() and "repo_id" not in result.stderr
    _assert_nothing_trained(tmp_path / "run")


def test_model_folder_without_config_json_says_so(tiny_model_dir, tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a model")
    result = rlx("train", "--algo", "sft", "--model", str(folder), "--output", str(tmp_path / "run"),
                 "--max-steps", "1", *cli_args())
    _assert_clear_error(result, f"model folder {str(folder)!r} holds no config.json")
    _assert_nothing_trained(tmp_path / "run")
