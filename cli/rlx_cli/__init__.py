"""The ``rlx`` command line. Heavy libraries load only inside the commands that use them."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

import typer

from rlx.host_memory import huge_pages_for_large_tensors
from rlx.plugins import PluginError, get_host, report_failures
from rlx.registry import RegistryError

app = typer.Typer(help="rlx: RLHF research platform. `rlx train --algo grpo` runs the built-in demo.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
plugins_app = typer.Typer(help="Installed plugins.", no_args_is_help=True)
algos_app = typer.Typer(help="Installed algorithms.", no_args_is_help=True)
app.add_typer(plugins_app, name="plugins")
app.add_typer(algos_app, name="algos")

# First-party algorithms and the distribution that provides each, to name the package of
# one that is not installed (tests/test_cli.py keeps it equal to the installed plugins).
FIRST_PARTY = {
    "sft": "rlx-sft", "rm": "rlx-rm", "ppo": "rlx-ppo", "grpo": "rlx-grpo", "dr_grpo": "rlx-grpo",
    "gspo": "rlx-grpo", "reinforce_pp": "rlx-reinforce-pp", "reinforce_pp_baseline": "rlx-reinforce-pp",
    "reinforce_pp_baseline_no_std": "rlx-reinforce-pp", "rloo": "rlx-rloo", "dpo": "rlx-dpo", "ipo": "rlx-dpo",
    "fdpo": "rlx-dpo", "hinge": "rlx-dpo", "robust_dpo": "rlx-dpo", "kto": "rlx-kto", "kto_vanilla": "rlx-kto",
    "apo_zero_unpaired": "rlx-kto", "simpo": "rlx-simpo", "cpo_simpo": "rlx-simpo", "orpo": "rlx-orpo",
}


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"Error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _host(local: list[str] | None = None):
    try:
        host = get_host(tuple(local or ()))
    except (PluginError, RegistryError) as e:
        fail(str(e))
    report_failures(host)
    return host


def _show(value) -> str:
    """A setting as ``--set`` takes it: strings bare, other values as JSON (YAML reads both)."""
    return value if isinstance(value, str) else json.dumps(value)


def unknown_algorithm(name: str, host) -> str:
    if name in getattr(host.algorithms, "conflicts", {}):
        return host.algorithms.conflict_message(name)
    failures = getattr(host, "failures", {})
    package = FIRST_PARTY.get(name)
    if package in failures:
        return f"algorithm {name!r} is provided by {package}, which is installed but failed to load: {failures[package]}"
    installed = ", ".join(host.algorithms) or "none"
    if package:
        where = f"It is provided by {package}: pip install {package} (or pip install -e plugins/algorithms/...)."
    elif failures:
        where = "".join(f"{dist} is installed but failed to load, and may provide it: {reason}. "
                        for dist, reason in failures.items()).rstrip()
    else:
        where = "No known package provides it; a plugin would register it through the 'rlx' entry points."
    return f"algorithm {name!r} is not installed. Installed: {installed}. {where}"


@app.command()
def train(
    algo: str = typer.Option("grpo", "--algo", "-a", help="algorithm to run (see `rlx algos list`)"),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML run config"),
    model: Optional[str] = typer.Option(None, "--model", help="model folder or hub name (model.path)"),
    data: Optional[str] = typer.Option(None, "--data", help="data file, folder, hub name or builtin:TASK (data.path)"),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="output folder"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="stop after N optimizer steps"),
    reward: Optional[List[str]] = typer.Option(
        None, "--reward", help="reward function for online RL: a registered name or file.py:function, repeatable"),
    overrides: Optional[List[str]] = typer.Option(None, "--set", "-s", help="dotted.key=value override, repeatable"),
    plugin: Optional[List[str]] = typer.Option(None, "--plugin", help="local plugin module:attr, repeatable"),
    resume: bool = typer.Option(False, "--resume", help="continue from the latest checkpoint in the output folder"),
    launcher: Optional[str] = typer.Option(None, "--launcher", help="local (default) or ray (launcher.name)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address",
                                              help="join a Ray cluster started with `ray start --head`"),
):
    """Train a model with an installed algorithm."""
    from rlx.config import ConfigError, demo_settings, load_yaml, parse_override, resolve, set_dotted
    from rlx.metrics import check_loggers

    try:
        tree = load_yaml(config) if config else {}
        local = list(plugin or []) + list(tree.get("plugins") or [])
        host = _host(local)
        if algo not in host.algorithms:
            fail(unknown_algorithm(algo, host))
        spec = host.algorithms.get(algo)
        for key, value in [("model.path", model), ("data.path", data), ("output", output),
                           ("training.max_steps", max_steps), ("launcher.name", launcher),
                           ("launcher.ray_address", ray_address)]:
            if value is not None:
                set_dotted(tree, key, value)
        if reward:
            set_dotted(tree, "reward.functions", list(reward))
        for text in overrides or []:
            set_dotted(tree, *parse_override(text))
        tree["plugins"] = local
        run_config = resolve(spec, tree)
        check_loggers(run_config.logging, host)
    except ConfigError as e:
        fail(str(e))
    demo = demo_settings(spec, tree)
    if demo and os.environ.get("RANK", "0") == "0":
        settings = ", ".join(f"{key}={_show(value)}" for key, value in demo.items())
        typer.echo(f"demo settings (from {spec.name}'s defaults; set them to override): {settings}")

    from rlx.run import RunError, run

    try:
        run(run_config, host, resume=resume)
    except RunError as e:
        fail(str(e), code=1)


@app.command()
def report(
    runs: List[str] = typer.Argument(..., metavar="RUN_DIR",
                                     help="run folders, each holding a metrics.jsonl; several are overlaid"),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", help="folder for report.png and report.html (default: the run folder for one "
                                     "run, ./report for several)"),
    smooth: float = typer.Option(0.0, "--smooth", help="smooth each curve as TensorBoard does, with this weight "
                                                       "on the past in [0, 1) (0: raw values)"),
):
    """Plot runs' curves (reward, KL, entropy, length, losses ...) into report.png and report.html."""
    from rlx.errors import DataError
    from rlx.report import difference_lines, load_runs, sample_line, write_report

    if not 0 <= smooth < 1:
        fail(f"--smooth {smooth}: the weight must be at least 0 and below 1")
    out = output or (runs[0] if len(runs) == 1 else "report")
    try:
        loaded = load_runs(runs)
        written = write_report(loaded, out, smooth)
    except DataError as e:
        fail(str(e), code=1)
    except OSError as e:
        fail(f"cannot write the report into {out}: {e}", code=1)
    typer.echo(f"wrote {written.png} and {written.html}; panels: {', '.join(written.panels)}")
    for name, titles in written.missing.items():
        if titles:
            typer.echo(f"{name}: no metrics for {', '.join(titles)}")
    if written.differences:
        typer.echo("settings that differ:")
        typer.echo("\n".join(difference_lines(loaded, written.differences)))
    for run in loaded:
        latest = run.latest_samples()
        if latest:
            typer.echo(f"latest samples of {run.name} (step {latest[0]['step']}):")
            for sample in latest:
                typer.echo(f"  {sample_line(sample)}")


@app.command("serve-reward")
def serve_reward(
    spec: str = typer.Argument(..., help="what --reward takes (a registered name or file.py:function) "
                                          "or a reward-model folder"),
    port: int = typer.Option(8000, "--port", help="port to listen on (0: a free one)"),
    host_name: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
    model_type: str = typer.Option("model", "--model-type", help="reward-model loader, when SPEC is a folder"),
    threads: int = typer.Option(1, "--threads", help="requests scored at once (1: the reward need not be thread-safe)"),
    plugin: Optional[List[str]] = typer.Option(None, "--plugin", help="local plugin module:attr, repeatable"),
):
    """Serve a reward over HTTP, for `rlx train --reward http://HOST:PORT/score` (docs/rewards.md)."""
    from rlx.errors import RewardError
    from rlx.remote_rewards import reward_server, url_of

    if threads < 1:
        fail(f"--threads is {threads}; it must be at least 1")
    try:
        server = reward_server(spec, _host(plugin), address=(host_name, port), model_type=model_type,
                               threads=threads)
    except RewardError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot listen on {host_name}:{port}: {e}")
    typer.echo(f"serving {server.source.what} at {url_of(server)}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@plugins_app.command("list")
def plugins_list(as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """Show each plugin's distribution, version, hooks and components."""
    host = _host()
    rows = [
        {"name": p.name, "version": p.version, "hooks": p.hooks, "components": p.components}
        for p in host.plugins.values()
    ]
    failed = [{"name": d, "error": e} for d, e in host.failures.items()]
    if as_json:
        typer.echo(json.dumps({"plugins": rows, "failed": failed}, indent=2))
        return
    for row in rows:
        typer.echo(f"{row['name']} {row['version'] or ''}".rstrip())
        typer.echo(f"  hooks: {', '.join(row['hooks'])}")
        for kind, names in row["components"].items():
            typer.echo(f"  {kind}: {', '.join(names)}")
    for row in failed:
        typer.echo(f"{row['name']} FAILED: {row['error']}")


@plugins_app.command("new")
def plugins_new(
    name: str = typer.Argument(..., help="plugin name: cispo makes rlx-cispo with package rlx_cispo"),
    kind: str = typer.Option(..., "--kind", help="algorithm, reward, estimator, policy-loss, sampler, reward-model "
                                                 "or vlm-processor"),
    directory: str = typer.Option(".", "--dir", help="folder to write the distribution into"),
):
    """Write a ready plugin distribution: pyproject, src layout, hook implementation and a contract test."""
    from rlx.scaffold import new_plugin

    try:
        root = new_plugin(name, kind, directory)
    except (ValueError, FileExistsError) as e:
        fail(str(e))
    typer.echo(f"wrote {root}\nnext: pip install -e {root} && python -m pytest {root / 'tests'}")


@plugins_app.command("check")
def plugins_check(
    dist: str = typer.Argument(..., help="distribution name, e.g. rlx-cispo"),
    train: bool = typer.Option(True, "--train/--no-train", help="train each algorithm two tiny steps"),
):
    """Run the plugin contract suite (rlx.contract) on an installed distribution."""
    from rlx.contract import run_checks

    results = run_checks(dist, train=train)
    for check, failure in results:
        typer.echo(f"{'FAIL' if failure else 'ok':4s}  {check}" + (f"\n      {failure}" if failure else ""))
    failed = sum(1 for _, failure in results if failure)
    typer.echo(f"{len(results) - failed} passed, {failed} failed")
    if failed:
        raise typer.Exit(1)


@algos_app.command("list")
def algos_list():
    """List installed algorithms."""
    host = _host()
    width = max((len(name) for name in host.algorithms), default=0)
    for name in host.algorithms:
        spec = host.algorithms.get(name)
        typer.echo(f"{name:{width}s}  {spec.loop:8s} {spec.description}  [{host.algorithms.providers[name]}]")


@algos_app.command("show")
def algos_show(name: str):
    """Show an algorithm's parts and every config key with type, default and help."""
    from rlx.config import RunConfig, demo_data, describe_fields

    host = _host()
    if name not in host.algorithms:
        fail(unknown_algorithm(name, host))
    spec = host.algorithms.get(name)
    typer.echo(f"{spec.name}: {spec.description}")
    typer.echo(f"provided by {host.algorithms.providers[name]}; loop: {spec.loop}")
    for part in ("data", "head", "estimator", "policy_loss", "value_loss", "preference_loss"):
        value = getattr(spec, part)
        if value is not None:
            typer.echo(f"  {part}: {value}")
    typer.echo(f"  needs_reference: {spec.needs_reference}")
    rows = []
    if spec.config is not object:
        rows += describe_fields(spec.config, "algorithm.")
    rows += describe_fields(RunConfig)
    typer.echo("\nconfig keys (key, type, default, help):")
    if spec.defaults:
        typer.echo(f"  values marked (demo) apply only on {name}'s demo data, {demo_data(spec)}; on other data the "
                   f"value after 'otherwise' does (and data of your own needs --model)")
    for key, tp, default, help_text in rows:
        if key in ("algo", "algorithm"):
            continue
        if key in spec.defaults:
            shown = f"{spec.defaults[key]!r} (demo; otherwise {default!r})"
        else:
            shown = repr(default)
        typer.echo(f"  {key} ({tp}) = {shown}\n      {help_text}")


def main() -> None:
    huge_pages_for_large_tensors()  # before any plugin imports torch
    # Plugins may add commands; one broken plugin must not break the CLI.
    try:
        host = get_host()
    except (PluginError, RegistryError) as e:  # RLX_STRICT_PLUGINS, or a local plugin
        typer.secho(f"Error: {e}", fg=typer.colors.RED, err=True)
        if sys.argv[1:2] != ["--help"]:
            raise SystemExit(2)
        host = None
    for impl in host.hook.register_commands.get_hookimpls() if host else []:
        try:
            impl.function(app=app)
        except Exception as e:
            dist = impl.plugin_name.split(":")[0]
            typer.secho(f"Warning: plugin {dist} failed in register_commands: {type(e).__name__}: {e}",
                        fg=typer.colors.YELLOW, err=True)
    app()
