import json
import math

import pytest
import torch

from rlx.config import LoggingConfig
from rlx.metrics import RunLogger


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_json_line_per_step(tmp_path):
    cfg = LoggingConfig(tensorboard=False, progress=False)
    with RunLogger(tmp_path, cfg, total_steps=3) as logger:
        logger.log(1, {"loss": torch.tensor(0.5), "reward/mean": 1})
        # each line is on disk as soon as it is logged
        assert _rows(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 0.5, "reward/mean": 1.0}]
        logger.log(2, {"loss": math.nan, "kl": 0.25})
    rows = _rows(tmp_path / "metrics.jsonl")
    assert rows[1] == {"step": 2, "loss": None, "kl": 0.25}
    assert type(rows[0]["reward/mean"]) is float  # an int metric is written as a float


def test_log_every_keeps_the_last_step(tmp_path):
    cfg = LoggingConfig(tensorboard=False, progress=False, log_every=2)
    with RunLogger(tmp_path, cfg, total_steps=5) as logger:
        for step in range(1, 6):
            logger.log(step, {"loss": float(step)})
    assert [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [2, 4, 5]


def test_resume_drops_rows_after_the_checkpoint(tmp_path):
    cfg = LoggingConfig(tensorboard=False, progress=False)
    with RunLogger(tmp_path, cfg, total_steps=6) as logger:
        for step in range(1, 5):
            logger.log(step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss"')  # cut short by a kill

    with RunLogger(tmp_path, cfg, total_steps=6, start_step=2) as logger:
        for step in range(3, 7):
            logger.log(step, {"loss": step * 10.0})
    rows = _rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in rows] == [1.0, 2.0, 30.0, 40.0, 50.0, 60.0]


def test_only_rank_zero_writes(tmp_path):
    with RunLogger(tmp_path / "out", LoggingConfig(), total_steps=2, rank=1) as logger:
        logger.log(1, {"loss": 1.0})
    assert not (tmp_path / "out").exists()


def test_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, LoggingConfig(progress=True), total_steps=3) as logger:
        for step in range(1, 4):
            logger.log(step, {"loss": 1.0 / step, "tokens_per_s": 100.0})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("loss")] == [(1, 1.0), (2, 0.5), (3, round(1 / 3, 6))]


def test_progress_bar_shows_step_and_metrics(tmp_path, capsys):
    with RunLogger(tmp_path, LoggingConfig(tensorboard=False), total_steps=4, start_step=1) as logger:
        logger.log(2, {"loss": 0.125, "reward/mean": 0.75, "tokens_per_s": 1234.0})
    err = capsys.readouterr().err
    assert "2/4" in err and "loss=0.125" in err and "reward=0.75" in err and "tok/s=1234" in err


def test_pick_samples_spreads_over_the_batch():
    from rlx.metrics import pick_samples

    rows = pick_samples([f"p{i // 4}" for i in range(16)], [f"c{i}" for i in range(16)], [float(i) for i in range(16)],
                        [math.inf] + [0.5] * 15, count=4)
    assert [r["completion"] for r in rows] == ["c0", "c4", "c8", "c12"]  # one sample of each prompt's group
    assert rows[1] == {"prompt": "p1", "completion": "c4", "reward": 4.0, "advantage": 0.5}
    assert rows[0]["advantage"] is None  # non-finite, as in metrics.jsonl
    assert len(pick_samples(["p"], ["c"], [1.0], [0.0], count=4)) == 1


def test_samples_every_n_steps_survive_a_resume(tmp_path):
    cfg = LoggingConfig(tensorboard=False, progress=False, samples_every=2)
    sample = [{"prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5}]

    def run(start_step, last_step):
        with RunLogger(tmp_path, cfg, total_steps=5, start_step=start_step) as logger:
            for step in range(start_step + 1, last_step + 1):
                if logger.samples_due(step):
                    logger.log_samples(step, [{**sample[0], "completion": f"{step}"}])

    run(0, 4)  # killed after step 4
    with open(tmp_path / "samples.jsonl", "a") as f:
        f.write('{"step": 5, "prompt"')  # cut short by the kill
    run(2, 5)  # resumed from the checkpoint of step 2
    rows = _rows(tmp_path / "samples.jsonl")
    assert [(r["step"], r["completion"]) for r in rows] == [(2, "2"), (4, "4"), (5, "5")]
    assert rows[0] == {"step": 2, "prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5}


def test_unknown_logger_names_its_package(tmp_path):
    from rlx.config import ConfigError
    from rlx.metrics import check_loggers
    from rlx.plugins import build_host

    host = build_host()
    with pytest.raises(ConfigError, match=r"logging.loggers: unknown logger 'tensorbord'. Did you mean 'tensorboard'"):
        check_loggers(LoggingConfig(loggers=["tensorbord"]), host)
    with pytest.raises(ConfigError, match=r"logging.logger_options.wandb: no logger 'wandb' is chosen"):
        check_loggers(LoggingConfig(logger_options={"wandb": {"mode": "offline"}}), host)
    with pytest.raises(ConfigError, match="the TensorBoard logger takes no options"):
        RunLogger(tmp_path, LoggingConfig(progress=False, logger_options={"tensorboard": {"x": 1}}), total_steps=1,
                  host=host)
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()


def test_a_failing_logger_is_named_and_the_step_kept(tmp_path):
    from rlx.errors import RunError
    from rlx.plugins import build_host

    class Broken:
        def __init__(self, output_dir, options, *, start_step=0):
            pass

        def log(self, step, metrics):
            raise ConnectionError("server went away")

        def close(self):
            pass

    host = build_host()
    host.registry("register_loggers").add("broken", Broken, "tests")
    cfg = LoggingConfig(tensorboard=False, progress=False, loggers=["broken"])
    with RunLogger(tmp_path, cfg, total_steps=2, host=host) as logger:
        with pytest.raises(RunError, match=r"logger 'broken' failed at step 1 \(metrics.jsonl holds the step\): "
                                           r"ConnectionError: server went away"):
            logger.log(1, {"loss": 0.5})
    assert _rows(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 0.5}]
