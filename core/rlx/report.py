"""``rlx report``: the curves of one or several runs, drawn from their ``metrics.jsonl``.

Each panel overlays the runs, one colour per run folder. ``report.png`` holds every
panel in one figure; ``report.html`` shows the same figure as SVG (its text stays text),
the runs, the main curves a run has no metrics for (an SFT run has no KL) and each run's
latest samples from ``samples.jsonl``. matplotlib loads only when a report is drawn.
"""

from __future__ import annotations

import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlx.errors import DataError


@dataclass(frozen=True)
class Panel:
    title: str
    metrics: tuple[str, ...]  # drawn when present; a trailing * matches a prefix (eval/pass@*)
    main: bool = False  # one of the main curves: a run without any of its metrics is reported


PANELS = (
    Panel("Reward", ("reward/mean", "reward/margin", "reward/chosen", "reward/rejected"), main=True),
    Panel("KL", ("kl", "approx_kl"), main=True),
    Panel("Entropy", ("entropy",), main=True),
    Panel("Response length", ("response_length/mean",), main=True),
    Panel("Clip fraction", ("clip_frac", "value/clip_frac"), main=True),
    Panel("Loss", ("loss/policy", "loss/value", "loss", "eval/loss"), main=True),
    Panel("Throughput (tokens/s)", ("tokens_per_s/rollout", "tokens_per_s"), main=True),
    Panel("Evaluation", ("eval/greedy_accuracy", "eval/pass@*", "eval/accuracy", "accuracy")),
    Panel("Gradient norm", ("grad_norm", "critic/grad_norm")),
    Panel("Learning rate", ("lr",)),
    Panel("Step time (s)", ("time/rollout", "time/train", "time/sync", "time/step")),
)


def read_jsonl(path: Path, *, numbers: bool) -> list[dict]:
    """The rows of a run's jsonl file, each an object with an integer ``step``; with
    ``numbers`` every other value must be a number or null. A malformed line raises,
    naming the file and line; an unfinished last line (no newline: the run is writing it,
    or was killed while it did) is left out."""
    lines = path.read_text().split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):
                continue
            raise DataError(f"{path} line {number}: not valid JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            raise DataError(f"{path} line {number}: expected an object with an integer \"step\", got {line[:80]}")
        if numbers:
            for key, value in row.items():
                if value is not None and (type(value) not in (int, float)):
                    raise DataError(f"{path} line {number}: metric {key!r} is {value!r}, not a number or null")
        rows.append(row)
    return rows


@dataclass
class Run:
    name: str
    path: Path
    rows: list[dict]
    samples: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)  # config.yaml's settings by dotted key

    def series(self, metric: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], r[metric]) for r in self.rows if r.get(metric) is not None]
        return [s for s, _ in points], [v for _, v in points]

    def latest_samples(self) -> list[dict]:
        last = max((s["step"] for s in self.samples), default=None)
        return [s for s in self.samples if s["step"] == last]


def load_run(folder: str | Path) -> Run:
    """A run folder's metrics and samples; a missing, empty or malformed ``metrics.jsonl`` raises."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such run folder")
    path = folder / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{path} does not exist: {folder} is not a run folder, or its run has not logged a step")
    rows = read_jsonl(path, numbers=True)
    if not rows:
        raise DataError(f"{path} holds no metrics: the run has not logged a step yet")
    samples_path = folder / "samples.jsonl"
    samples = read_jsonl(samples_path, numbers=False) if samples_path.is_file() else []
    return Run(folder.resolve().name, folder, rows, samples, _settings(folder / "config.yaml"))


def _settings(path: Path) -> dict:
    """A run's ``config.yaml`` as {dotted key: value}; a folder without one has none."""
    import yaml

    if not path.is_file():
        return {}
    try:
        tree = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise DataError(f"{path} is not valid YAML: {e}") from e

    def flat(node, prefix: str) -> dict:
        if isinstance(node, dict):  # an empty mapping sets nothing
            return {k: v for key, child in node.items() for k, v in flat(child, f"{prefix}{key}.").items()}
        return {prefix[:-1]: node}

    return flat(tree, "") if isinstance(tree, dict) else {}


def differences(runs: list[Run]) -> dict[str, list]:
    """The settings whose values differ between runs (the output folder aside): key -> one
    value per run, None where a run's config has no such key."""
    keys = sorted(set().union(*(r.config for r in runs)) - {"output"})
    return {k: [r.config.get(k) for r in runs] for k in keys
            if len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1}


def load_runs(folders: list[str | Path]) -> list[Run]:
    runs = [load_run(f) for f in folders]
    names = [r.name for r in runs]
    for run in runs:
        if names.count(run.name) > 1:  # runs/a/run and runs/b/run: the legend needs more than "run"
            run.name = str(run.path)
    return runs


def panel_metrics(panel: Panel, run: Run) -> list[str]:
    """The metrics of ``panel`` that ``run`` logged, in the panel's order."""
    keys = list(dict.fromkeys(k for row in run.rows for k, v in row.items() if v is not None and k != "step"))
    found = []
    for name in panel.metrics:
        found += [k for k in keys if k.startswith(name[:-1])] if name.endswith("*") else [name] * (name in keys)
    return list(dict.fromkeys(found))


@dataclass
class Report:
    png: Path
    html: Path
    panels: list[str]  # titles of the panels drawn
    missing: dict[str, list[str]]  # run name -> main panels it has no metric for
    differences: dict[str, list]  # setting -> one value per run, for those that differ


def smoothed(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average with ``weight`` on the past,
    divided by 1 - weight^n so that the first points are not pulled towards 0."""
    out, average = [], 0.0
    for n, value in enumerate(values, 1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight ** n))
    return out


def write_report(runs: list[Run], out_dir: str | Path, smooth: float = 0.0) -> Report:
    """Draw ``runs`` into ``out_dir/report.png`` and ``out_dir/report.html``; with ``smooth``
    in (0, 1) each curve of more than 20 points is drawn smoothed over its raw values, drawn
    faint."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    found = {panel: [panel_metrics(panel, run) for run in runs] for panel in PANELS}
    shown = [panel for panel in PANELS if any(found[panel])]
    if not shown:
        drawn = ", ".join(name for panel in PANELS for name in panel.metrics)
        raise DataError(f"{', '.join(str(r.path / 'metrics.jsonl') for r in runs)}: no metric that rlx report "
                        f"draws ({drawn})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    missing = {run.name: [p.title for p in PANELS if p.main and not found[p][i]] for i, run in enumerate(runs)}

    columns = min(3, len(shown))
    rows = math.ceil(len(shown) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.6 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    dashes = ["-", "--", ":", "-."]
    for ax, panel in zip(axes.flat, shown):
        names = list(dict.fromkeys(n for per_run in found[panel] for n in per_run))
        for i, run in enumerate(runs):
            for j, name in enumerate(names):
                steps, values = run.series(name)
                if not steps:
                    continue
                # one run: a colour per metric; several: a colour per run and a dash per metric
                if len(runs) == 1:
                    colour, dash, label = colours[j % len(colours)], "-", name
                else:
                    colour, dash = colours[i % len(colours)], dashes[j % len(dashes)]
                    label = run.name if len(names) == 1 else f"{run.name}: {name}"
                few = len(steps) <= 20  # evaluation steps, a short run: points, never smoothed
                if smooth and not few:
                    ax.plot(steps, values, color=colour, linestyle=dash, alpha=0.25, linewidth=0.8)
                    values = smoothed(values, smooth)
                ax.plot(steps, values, color=colour, linestyle=dash, marker="o" if few else None, markersize=3,
                        label=label)
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.tight_layout()
    png = out / "report.png"
    fig.savefig(png, dpi=100)
    svg = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none"}):  # titles and labels stay text in the page
        fig.savefig(svg, format="svg")
    plt.close(fig)

    page = out / "report.html"
    differ = differences(runs) if len(runs) > 1 else {}
    page.write_text(_html(runs, shown, missing, differ, svg.getvalue()))
    return Report(png, page, [p.title for p in shown], missing, differ)


def _html(runs: list[Run], shown: list[Panel], missing: dict[str, list[str]], differ: dict[str, list],
          svg: str) -> str:
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html><head><meta charset="utf-8">',
        f"<title>rlx report: {e(', '.join(r.name for r in runs))}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
        "td.text{font-family:monospace;white-space:pre-wrap;max-width:40em}svg{max-width:100%;height:auto}</style>",
        "</head><body>",
        "<h1>rlx report</h1>",
        "<table><tr><th>run</th><th>folder</th><th>steps logged</th><th>last step</th><th>no metrics for</th></tr>",
    ]
    for run in runs:
        parts.append(f"<tr><td>{e(run.name)}</td><td>{e(str(run.path))}</td><td>{len(run.rows)}</td>"
                     f"<td>{run.rows[-1]['step']}</td><td>{e(', '.join(missing[run.name]) or '-')}</td></tr>")
    parts += ["</table>",
              *_differences_html(runs, differ),
              f"<h2>Curves</h2><p>Panels: {e(', '.join(p.title for p in shown))}. "
              f'The same figure as an image: <a href="report.png">report.png</a>.</p>',
              svg[svg.index("<svg"):]]
    parts.append("<h2>Latest samples</h2>")
    for run in runs:
        latest = run.latest_samples()
        if not latest:
            parts.append(f"<p>{e(run.name)}: no samples.jsonl (online runs write it every "
                         f"<code>logging.samples_every</code> steps)</p>")
            continue
        parts.append(f"<h3>{e(run.name)}, step {latest[0]['step']}</h3>")
        parts.append("<table><tr><th>prompt</th><th>completion</th><th>reward</th><th>advantage</th></tr>")
        for s in latest:
            parts.append(f'<tr><td class="text">{e(str(s.get("prompt")))}</td>'
                         f'<td class="text">{e(str(s.get("completion")))}</td>'
                         f"<td>{_format(s.get('reward'))}</td><td>{_format(s.get('advantage'))}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _differences_html(runs: list[Run], differ: dict[str, list]) -> list[str]:
    if not differ:
        return []
    e = html.escape
    parts = ["<h2>Settings that differ</h2>", "<table><tr><th>setting</th>"
             + "".join(f"<th>{e(r.name)}</th>" for r in runs) + "</tr>"]
    for key, values in differ.items():
        parts.append(f"<tr><td>{e(key)}</td>" + "".join(f"<td>{e(_setting(v))}</td>" for v in values) + "</tr>")
    return parts + ["</table>"]


def _setting(value) -> str:
    """A setting as YAML and ``--set`` write it; a run without the key shows a dash."""
    return "-" if value is None else value if isinstance(value, str) else json.dumps(value)


def _format(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else html.escape(str(value))


def sample_line(sample: dict, width: int = 60) -> str:
    """One sample as a line of text: reward, advantage, the prompt's end and the completion's start."""
    prompt, completion = str(sample.get("prompt")), str(sample.get("completion"))
    prompt = prompt if len(prompt) <= width else "..." + prompt[-width:]
    completion = completion if len(completion) <= width else completion[:width] + "..."
    return (f"reward {_format(sample.get('reward'))}  advantage {_format(sample.get('advantage'))}  "
            f"{prompt!r} -> {completion!r}")


def difference_lines(runs: list[Run], differ: dict[str, list], limit: int = 10) -> list[str]:
    """The settings that differ as lines of text, at most ``limit`` of them."""
    lines = [f"  {key}: " + ", ".join(f"{_setting(v)} ({r.name})" for v, r in zip(values, runs))
             for key, values in list(differ.items())[:limit]]
    if len(differ) > limit:
        lines.append(f"  ... and {len(differ) - limit} more in report.html")
    return lines
