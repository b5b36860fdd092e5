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


def test_wrong_model_path_is_named(tmp_path):
    path = tmp_path / "no-such-model"
    result = rlx("train", "--algo", "sft", "--model", str(path), "--output", str(tmp_path / "run"),
                 "--max-steps", "1", *cli_args())
    _assert_clear_error(result, str(path))
    _assert_nothing_trained(tmp_path / "run")
