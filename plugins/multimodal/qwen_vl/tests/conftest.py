import pytest

import rlx.testing  # noqa: F401  (points RLX_CACHE at a temporary folder)


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory):
    """A tiny random Qwen2.5-VL folder, built once per session."""
    from rlx_qwen_vl.tiny import make_tiny_qwen_vl

    return make_tiny_qwen_vl(tmp_path_factory.mktemp("tiny-qwen-vl"))


@pytest.fixture(scope="session")
def tiny_qwen2_vl(tmp_path_factory):
    """A tiny random Qwen2-VL folder (the first generation: another vision tower, the same M-RoPE)."""
    from rlx_qwen_vl.tiny import make_tiny_qwen_vl

    return make_tiny_qwen_vl(tmp_path_factory.mktemp("tiny-qwen2-vl"), arch="qwen2_vl")


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    """The shapes task: 256 training rows and 32 held-out ones, in every row format."""
    from rlx_qwen_vl.shapes import write_dataset

    root = tmp_path_factory.mktemp("shapes")
    return write_dataset(root / "train", 256, seed=0), write_dataset(root / "test", 32, seed=1)


@pytest.fixture
def each_bad_row_fails():
    """``check(source, schema, path, expected)``: row 1 of ``source`` is good and row k + 2
    fails alone with the message ``expected[k]`` (a pattern) after the file's path; then,
    skipping bad rows, every one is skipped. Returns what the skipping pass gives."""
    from rlx import data
    from rlx.errors import DataError

    def check(source, schema, path, expected):
        for index, message in enumerate(expected):
            one = data.RowSource(source.source, [source.rows[0], source.rows[index + 1]], [1, index + 2], unit="line")
            with pytest.raises(DataError, match=str(path) + " " + message):
                data.validate_rows(one, schema, skip_bad=False)
        good, skipped, errors = data.validate_rows(source, schema, skip_bad=True)
        assert len(good) == 1 and skipped == len(expected)
        return good, skipped, errors

    return check
