"""The W&B logger in offline mode: what it leaves on disk, read back record by record."""

import json
import math
import subprocess
import sys

import pytest
import yaml

from rlx.config import ConfigError, LoggingConfig
from rlx.metrics import RunLogger
from rlx.plugins import build_host

OPTIONS = {"mode": "offline", "project": "rlx-tests", "name": "tiny-run"}


def records(path):
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then LevelDB-log
    chunks (crc32, length, type) in 32 KiB blocks; type 1 is a whole record, 2-4 parts."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def kinds(path, kind):
    return [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]


def history(path) -> list[dict]:
    """Each logged step's values; W&B keeps a key with a slash as its parts."""
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item}
            for h in kinds(path, "history")]


def offline_runs(folder):
    return sorted((folder / "wandb").glob("offline-run-*"))


def log_steps(out, steps, start_step=0, samples_at=(), **options):
    cfg = LoggingConfig(tensorboard=False, progress=False, loggers=["wandb"],
                        logger_options={"wandb": {**OPTIONS, **options}})
    with RunLogger(out, cfg, total_steps=10, start_step=start_step, host=build_host()) as logger:
        for step in steps:
            logger.log(step, {"reward/mean": step / 10, "loss/policy": math.nan if step == 2 else 1.0 / step})
            if step in samples_at:
                logger.log_samples(step, [{"prompt": "1+2=", "completion": "3", "reward": 1.0, "advantage": 0.5},
                                          {"prompt": "4-1=", "completion": "2?", "reward": 0.0, "advantage": -0.5}])


def test_offline_run_holds_metrics_samples_and_config(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"algo": "grpo", "training": {"lr": 1e-4}}))
    log_steps(tmp_path, [1, 2, 3], samples_at=(3,))
    (run,) = offline_runs(tmp_path)
    (events,) = run.glob("run-*.wandb")
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    assert run.name.endswith(f"-{run_id}") and events.name == f"run-{run_id}.wandb"

    (info,) = kinds(events, "run")
    assert (info.project, info.display_name, info.run_id) == ("rlx-tests", "tiny-run", run_id)
    config = {item.key: json.loads(item.value_json) for item in info.config.update}
    assert config["algo"] == "grpo" and config["training"] == {"lr": 1e-4}

    rows = history(events)
    assert [r["_step"] for r in rows] == [1, 2, 3]
    assert [r["reward/mean"] for r in rows] == pytest.approx([0.1, 0.2, 0.3])
    assert "loss/policy" not in rows[1] and rows[2]["loss/policy"] == pytest.approx(1 / 3)  # NaN is left out
    assert rows[2]["samples/_type"] == "table-file"
    (table,) = run.glob("files/media/table/samples_3_*.table.json")
    content = json.loads(table.read_text())
    assert content["columns"] == ["step", "prompt", "completion", "reward", "advantage"]
    assert content["data"] == [[3, "1+2=", "3", 1.0, 0.5], [3, "4-1=", "2?", 0.0, -0.5]]


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    log_steps(tmp_path, [1, 2])
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    log_steps(tmp_path, [2, 3], start_step=1)
    assert (tmp_path / "wandb-run-id").read_text().strip() == run_id
    first, second = offline_runs(tmp_path)
    assert f"-{run_id}" in first.name and f"-{run_id}" in second.name  # (a run started in the same second ends -1)
    (events,) = second.glob("run-*.wandb")
    assert [r["_step"] for r in history(events)] == [2, 3]


def test_dir_and_disabled_mode(tmp_path):
    log_steps(tmp_path / "run", [1], dir=str(tmp_path / "elsewhere"))
    (run,) = offline_runs(tmp_path / "elsewhere")
    assert list(run.glob("run-*.wandb")) and not (tmp_path / "run" / "wandb").exists()
    log_steps(tmp_path / "off", [1], mode="disabled")
    assert not (tmp_path / "off" / "wandb").exists()
    assert (tmp_path / "off" / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 0.1, "loss/policy": 1.0}\n'


def test_bad_options_name_the_key(tmp_path):
    cfg = LoggingConfig(tensorboard=False, progress=False, loggers=["wandb"],
                        logger_options={"wandb": {"projet": "x"}})
    with pytest.raises(ConfigError, match=r"unknown config key 'logging.logger_options.wandb.projet'. "
                                          r"Did you mean 'logging.logger_options.wandb.project'"):
        RunLogger(tmp_path, cfg, total_steps=1, host=build_host())
    cfg.logger_options = {"wandb": {"mode": "offfline"}}
    with pytest.raises(ConfigError, match=r"logging.logger_options.wandb.mode: 'offfline' is not one of"):
        RunLogger(tmp_path, cfg, total_steps=1, host=build_host())
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "metrics.jsonl").exists()


def test_importing_the_plugin_imports_no_wandb():
    code = "import sys, rlx_wandb; from rlx.plugins import build_host; build_host(); print('wandb' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_a_missing_wandb_package_is_named(tmp_path):
    code = ("import sys; sys.modules['wandb'] = None\n"  # as if wandb were not installed
            "from rlx.config import ConfigError, LoggingConfig\n"
            "from rlx.metrics import RunLogger\n"
            "cfg = LoggingConfig(tensorboard=False, progress=False, loggers=['wandb'])\n"
            f"try:\n    RunLogger({str(tmp_path)!r}, cfg, total_steps=1)\n"
            "except ConfigError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "logging.loggers names wandb, but the wandb package does not import" in result.stdout, result.stderr
    assert "pip install 'wandb>=0.19,<1'" in result.stdout
