"""Seeing a run: samples.jsonl, TensorBoard text and W&B offline files of a short GRPO run, and
`rlx report`'s figures, overlays and errors."""

from __future__ import annotations

import json
import math
import re

import pytest

from e2e import config, metrics, one_thread, rlx, train  # noqa: F401 (one_thread: autouse)
from rlx.hookspecs import hookimpl

STEPS = 3
GRPO = {"training.max_steps": STEPS, "algorithm.rollout_batch_size": 4, "algorithm.n_samples": 4,
        "training.batch_size": 16, "training.micro_batch_size": 16, "algorithm.eval_size": 8,
        "logging.tensorboard": True, "logging.samples_every": 2, "logging.samples_count": 3,
        "logging.loggers": ["wandb"], "logging.logger_options": {"wandb": {"mode": "offline", "project": "rlx-tests"}}}
PANELS = ["Reward", "KL", "Entropy", "Response length", "Clip fraction", "Loss", "Throughput (tokens/s)"]
ONLINE_ONLY = ["Reward", "KL", "Entropy", "Response length", "Clip fraction"]


@pytest.fixture(scope="module")
def grpo_run(demo_policy, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "grpo-run"
    train("grpo", out, **GRPO)
    return out


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "sft-run"
    train("sft", out, **{"model.path": tiny_model_dir, "training.max_steps": STEPS})
    return out


def samples(out) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_samples_jsonl_every_n_steps_and_the_last(grpo_run):
    rows = samples(grpo_run)
    # samples_every=2 of 3 steps: step 2, and the last step; 3 samples each
    assert [r["step"] for r in rows] == [2, 2, 2, 3, 3, 3]
    for row in rows:
        assert set(row) == {"step", "prompt", "completion", "reward", "advantage"}
        assert re.fullmatch(r"\d+[+-]\d+=", row["prompt"]), row  # the demo task's prompts
        assert isinstance(row["completion"], str)
        assert row["reward"] in (0.0, 1.0)  # exact match
        assert math.isfinite(row["advantage"])
        # GRPO: a correct answer is above its group's mean, a wrong one below (or all equal)
        assert row["advantage"] >= 0 if row["reward"] == 1.0 else row["advantage"] <= 0
    # spread over the step's prompts: three different groups
    assert len({r["prompt"] for r in rows if r["step"] == 3}) == 3


def test_samples_as_tensorboard_text(grpo_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(grpo_run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("samples/text_summary")
    assert [e.step for e in events] == [2, 3]
    text = events[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| prompt | completion | reward | advantage |")
    for row in samples(grpo_run)[3:]:
        assert f"| {row['prompt']} |" in text


class FailAfter:
    """A plugin whose observer raises after step ``step`` is logged."""

    def __init__(self, step: int):
        self.step = step

    @hookimpl
    def on_step_end(self, step, metrics):
        if step == self.step:
            raise RuntimeError(f"observer failed at step {step}")


class Recorder:
    """A logger that keeps the steps it was given, and whether it was closed."""

    opened: list = []

    def __init__(self, output_dir, options, *, start_step=0):
        self.steps, self.closed = [], False
        Recorder.opened.append(self)

    def log(self, step, metrics):
        self.steps.append(step)

    def close(self):
        self.closed = True


def test_a_failing_step_keeps_what_was_logged_and_closes_the_loggers(demo_policy, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlx.plugins import build_host
    from rlx.run import run

    out = tmp_path / "run"
    cfg, _ = config("grpo", output=str(out), **{**GRPO, "logging.samples_every": 1, "logging.loggers": ["recorder"]})
    host = build_host()
    host.pm.register(FailAfter(2))
    host.registry("register_loggers").add("recorder", Recorder, "tests")
    with pytest.raises(RuntimeError, match="observer failed at step 2"):
        run(cfg, host)
    assert [r["step"] for r in metrics(out)] == [0, 1, 2]
    assert [r["step"] for r in samples(out)] == [1, 1, 1, 2, 2, 2]
    (recorder,) = Recorder.opened
    assert recorder.steps == [0, 1, 2] and recorder.closed  # W&B's run is finished the same way
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [1, 2]


def test_wandb_offline_run_files(grpo_run):
    (run,) = (grpo_run / "wandb").glob("offline-run-*")
    (events,) = run.glob("run-*.wandb")
    data = events.read_bytes()
    assert data[:4] == b":W&B" and events.stat().st_size > 2_000
    for text in (b"rlx-tests", b"grpo-run", b"reward/mean", b"entropy", b"response_length"):
        assert text in data, text  # the project, the run's name (its folder) and the metric names
    # the sample tables hold what samples.jsonl holds
    tables = sorted(run.glob("files/media/table/samples_*.table.json"), key=lambda p: int(p.name.split("_")[1]))
    assert [t.name.split("_")[1] for t in tables] == ["2", "3"]
    logged = [row for t in tables for row in json.loads(t.read_text())["data"]]
    assert logged == [[r["step"], r["prompt"], r["completion"], r["reward"], r["advantage"]] for r in samples(grpo_run)]


def test_choosing_wandb_without_its_plugin_fails_before_the_run(tmp_path):
    out = tmp_path / "run"
    result = rlx("train", "--algo", "grpo", "--output", str(out), "--set", "logging.loggers=[tensorboard, wandb]",
                 env={"RLX_DISABLE_PLUGINS": "rlx-wandb"})
    assert result.returncode == 2
    assert "logging.loggers: unknown logger 'wandb'" in result.stderr
    assert "It is provided by rlx-wandb: pip install rlx-wandb" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_report_of_one_run(grpo_run):
    result = rlx("report", str(grpo_run))
    assert result.returncode == 0, result.stderr
    png, page = grpo_run / "report.png", grpo_run / "report.html"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    html = page.read_text()
    for title in PANELS + ["Evaluation", "Gradient norm"]:
        assert f">{title}</text>" in html, title  # the panel's axis title, as SVG text
    assert 'href="report.png"' in html
    # the latest samples: a table in the page, and lines in the terminal
    latest = samples(grpo_run)[3:]
    assert "step 3</h3>" in html
    for row in latest:
        assert f"<td class=\"text\">{row['prompt']}</td>" in html
        assert f"{row['prompt']!r} -> {row['completion']!r}" in result.stdout
    assert "latest samples of grpo-run (step 3)" in result.stdout
    assert "no metrics for" not in result.stdout  # an online run has every main curve


def test_report_overlays_two_runs(grpo_run, sft_run, tmp_path):
    result = rlx("report", str(grpo_run), str(sft_run), "--output", str(tmp_path / "both"))
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "both" / "report.html").read_text()
    assert (tmp_path / "both" / "report.png").stat().st_size > 20_000
    # both runs in the legends: the loss panel holds loss/policy (grpo) and loss, eval/loss (sft)
    for label in ("grpo-run: loss/policy", "sft-run: loss", "sft-run: eval/loss", "grpo-run: tokens_per_s/rollout"):
        assert f">{label}</text>" in html, label
    # the main curves the SFT run has no metrics for are named, not failed on
    assert f"sft-run: no metrics for {', '.join(ONLINE_ONLY)}" in result.stdout
    assert "grpo-run: no metrics" not in result.stdout
    assert "sft-run: no samples.jsonl" in html
    # what the runs were told differently: in the page, and the first settings in the terminal
    assert "<tr><td>training.lr</td><td>0.0001</td><td>0.0005</td></tr>" in html
    assert "settings that differ:\n  algo: grpo (grpo-run), sft (sft-run)\n" in result.stdout


def test_smoothing_is_tensorboards(tmp_path):
    from rlx.report import smoothed

    assert smoothed([3.0, 3.0, 3.0], 0.9) == pytest.approx([3.0, 3.0, 3.0])  # no pull towards 0
    # (0.5 * 0 + 0.5 * 10) / (1 - 0.5²)
    assert smoothed([0.0, 10.0], 0.5) == pytest.approx([0.0, 20 / 3])
    assert smoothed([1.0, 5.0], 0.0) == [1.0, 5.0]

    # a dense curve (30 steps) gets a smoothed line over its raw one; 3 evaluation points do not
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "reward/mean": (s % 2) + s / 30} for s in range(1, 31)]
    rows += [{"step": s, "eval/greedy_accuracy": s / 30} for s in (0, 15, 30)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"])))
    lines = {}
    for smooth in ("0", "0.6"):
        result = rlx("report", str(run), "--smooth", smooth, "--output", str(tmp_path / smooth))
        assert result.returncode == 0, result.stderr
        lines[smooth] = (tmp_path / smooth / "report.html").read_text().count('<g id="line2d_')
    assert lines["0.6"] == lines["0"] + 1
    result = rlx("report", str(run), "--smooth", "1", "--output", str(tmp_path / "bad"))
    assert result.returncode == 2 and "--smooth 1.0: the weight must be at least 0 and below 1" in result.stderr
    assert not (tmp_path / "bad").exists()


def test_bad_metrics_name_the_file_and_line(tmp_path):
    from rlx.errors import DataError
    from rlx.report import load_run, write_report

    run = tmp_path / "run"
    with pytest.raises(DataError, match=f"{tmp_path}/nothing: no such run folder"):
        load_run(tmp_path / "nothing")
    run.mkdir()
    with pytest.raises(DataError, match=r"run/metrics.jsonl does not exist"):
        load_run(run)
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(DataError, match=r"run/metrics.jsonl holds no metrics"):
        load_run(run)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"run/metrics.jsonl line 2: not valid JSON"):
        load_run(run)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"loss": 0.5}\n')
    with pytest.raises(DataError, match=r'line 2: expected an object with an integer "step"'):
        load_run(run)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": "high"}\n')
    with pytest.raises(DataError, match=r"line 1: metric 'loss' is 'high', not a number or null"):
        load_run(run)
    (run / "samples.jsonl").write_text('{"step": 1}\n[1]\n')
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    with pytest.raises(DataError, match=r"run/samples.jsonl line 2"):
        load_run(run)
    (run / "samples.jsonl").unlink()
    (run / "metrics.jsonl").write_text('{"step": 1, "my/metric": 1.0}\n')
    with pytest.raises(DataError, match=r"run/metrics.jsonl: no metric that rlx report draws \(reward/mean, "):
        write_report([load_run(run)], tmp_path / "report")
    assert not (tmp_path / "report").exists()
    (run / "config.yaml").write_text("training: {lr: [\n")
    with pytest.raises(DataError, match=r"run/config.yaml is not valid YAML"):
        load_run(run)
    (run / "config.yaml").unlink()
    # a run writing its next line right now: the unfinished line is left out
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": null}\n{"step": 3, "lo')
    assert [r["step"] for r in load_run(run).rows] == [1, 2]

    # the command prints the error in one line, exits 1 and writes nothing
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\nnot json\n{"step": 3}\n')
    result = rlx("report", str(run))
    assert result.returncode == 1
    assert f"Error: {run}/metrics.jsonl line 2: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run / "report.png").exists()
