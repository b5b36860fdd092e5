"""Rewards over HTTP: `rlx serve-reward` in a subprocess scores a run exactly as the same
function does locally; servers that are down, slow, failing or answering garbage stop
the run with the URL named, or are retried and counted when asked."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlx.config import RemoteRewardConfig, RewardConfig, resolve
from rlx.errors import RewardError
from rlx.plugins import build_host
from rlx.remote_rewards import reward_server, url_of
from rlx.rewards import build_reward
from rlx.run import run
from rlx.testing import one_thread  # noqa: F401  (one torch thread for the runs here)

REWARD = (
    "import threading, time\n"
    "lock, running, peak = threading.Lock(), 0, 0\n"
    "\n"
    "def slow(prompts, completions, labels, **columns):\n"
    "    global running, peak\n"
    "    with lock:\n"
    "        running += 1\n"
    "        peak = max(peak, running)\n"
    "    time.sleep(0.3)\n"
    "    with lock:\n"
    "        running -= 1\n"
    "    return {'rewards': [0.0] * len(completions), 'peak': peak}\n"
    "\n"
    "def score(prompts, completions, labels, level, **columns):\n"
    "    rewards = [float(c == l) for c, l in zip(completions, labels)]\n"
    "    return {'rewards': rewards, 'level_seen': [float(x) for x in level]}\n"
    "\n"
    "def broken(prompts, completions, labels, **columns):\n"
    "    raise ValueError('no score for you')\n"
)


@pytest.fixture(scope="module")
def host():
    return build_host()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("remote")
    (folder / "my_reward.py").write_text(REWARD)
    return folder


def serve(spec: str, cwd):
    """``rlx serve-reward SPEC --port 0`` in a subprocess, and the URL it prints."""
    process = subprocess.Popen([sys.executable, "-m", "rlx_cli", "serve-reward", spec, "--port", "0"], cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:  # the URL comes once it listens
        if line.startswith("serving ") and " at http://" in line:
            return process, line.rsplit(" at ", 1)[1].strip()
    process.kill()
    raise AssertionError(f"serve-reward ended without a URL; stderr: {process.stderr.read()}")


@pytest.fixture(scope="module")
def served(workdir):
    process, url = serve("exact_match", workdir)
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def in_thread(host):
    """``reward_server(SPEC)`` serving from a thread of this process; gives its URL."""
    servers = []

    def start(spec, threads=1):
        server = reward_server(spec, host, threads=threads)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return url_of(server)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def grpo_metrics(host, out, reward, **remote):
    tree = {"output": str(out), "logging": {"progress": False, "tensorboard": False}, "training": {"max_steps": 2},
            "algorithm": {"eval_size": 8}, "reward": {"functions": [reward], "remote": remote}}
    run(resolve(host.algorithms.get("grpo"), tree), host)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_remote_run_equals_the_local_run(host, demo_policy, tmp_path, served):
    local = grpo_metrics(host, tmp_path / "local", "exact_match")
    remote = grpo_metrics(host, tmp_path / "remote", served, batch_size=5, concurrency=2)
    timing = lambda row: {k: v for k, v in row.items() if not k.startswith(("time/", "tokens_per_s"))}  # noqa: E731
    assert [timing(r) for r in remote] == [timing(r) for r in local]
    assert 0 < local[-1]["reward/exact_match"] < 1 and local[-1]["eval/pass@4"] > 0


def test_a_remote_reward_scores_a_ray_run_as_the_local_run(host, demo_policy, tmp_path, served):
    """Under Ray the reward worker is an actor of its own: it calls the server from there."""
    pytest.importorskip("ray", reason="the Ray launcher needs ray (installed by requirements-dev.txt)")
    local = grpo_metrics(host, tmp_path / "local", "exact_match")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "rlx_cli", "train", "--algo", "grpo", "--launcher", "ray", "--reward", served,
         "--max-steps", "2", "--output", str(tmp_path / "ray"), "--set", "algorithm.eval_size=8",
         "--set", "logging.progress=false", "--set", "logging.tensorboard=false"],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    kept = lambda row: {k: v for k, v in row.items()  # noqa: E731 - timing, and the engine-trainer rounding
                        if not k.startswith(("time/", "tokens_per_s", "rollout/logp_diff"))}
    assert len(rows) == len(local) and local[-1]["reward/exact_match"] > 0
    for row, want in zip(rows, local):
        assert kept(row) == pytest.approx(kept(want), rel=1e-5, abs=1e-6)


def test_columns_and_metrics_cross_the_wire(in_thread, workdir):
    url = in_thread(f"{workdir / 'my_reward.py'}:score")
    result = build_reward(RewardConfig(functions=[url], remote=RemoteRewardConfig(batch_size=2)), None)(
        ["1+1=", "1+2=", "2+2="], ["2", "3", "5"], ["2", "3", "4"], {"level": [0, 1, 2]})
    assert result.rewards == [1.0, 1.0, 0.0]
    assert result.metrics == {"reward/my_reward.py:score": 2 / 3, "reward/my_reward.py:score/level_seen": 1.0}


def test_the_server_scores_as_many_requests_at_once_as_it_has_threads(in_thread, workdir):
    options = RemoteRewardConfig(batch_size=1, concurrency=2)
    for threads in (1, 2):  # the peak of concurrent calls, seen by the function itself
        url = in_thread(f"{workdir / 'my_reward.py'}:slow", threads=threads)
        pipeline = build_reward(RewardConfig(functions=[url], remote=options), None)
        result = pipeline(["p", "q"], ["a", "b"], [None] * 2, {})
        assert result.metrics["reward/my_reward.py:slow/peak"] == threads


def test_a_function_that_raises_on_the_server_is_named(in_thread, workdir):
    url = in_thread(f"{workdir / 'my_reward.py'}:broken")
    with pytest.raises(RewardError) as err:
        build_reward(RewardConfig(functions=[url]), None)(["p"], ["c"], ["l"], {})
    assert str(err.value).startswith(f"reward server {url}: answered HTTP 422 Unprocessable Entity: reward function ")
    assert "my_reward.py:broken' raised ValueError on sample 0 (prompt 'p', completion 'c'): no score for you" \
        in str(err.value)


def test_a_reward_model_folder_is_served(in_thread, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rlx.tiny import make_tokenizer

    tokenizer = make_tokenizer(tmp_path)
    config = AutoConfig.for_model("qwen2", vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=1, num_key_value_heads=1, intermediate_size=64, num_labels=1,
                                  pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    batch = (["1+1=", "2+2=", "3+3="], ["2", "4", "7"], [None] * 3, {})
    local = build_reward(RewardConfig(functions=[], model=str(tmp_path)), build_host(), device="cpu")(*batch)
    remote = build_reward(RewardConfig(functions=[in_thread(str(tmp_path))]), None)(*batch)
    assert remote.rewards == local.rewards and len(set(local.rewards)) == 3
    assert remote.metrics == local.metrics == {"reward/model": pytest.approx(sum(local.rewards) / 3)}


def test_train_with_a_down_server_stops_before_training(tiny_model_dir, tmp_path):
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "rlx_cli", "train", "--algo", "grpo", "--model", tiny_model_dir,
                             "--reward", f"http://127.0.0.1:{port}/score", "--max-steps", "1", "--output", "out",
                             "--set", "logging.progress=false"], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1
    assert f"Error: reward server http://127.0.0.1:{port}/score: cannot connect: " in result.stderr, result.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_serve_reward_refuses_an_unknown_reward(workdir):
    result = subprocess.run([sys.executable, "-m", "rlx_cli", "serve-reward", "exact_matc", "--port", "0"],
                            capture_output=True, text=True, timeout=60, cwd=workdir)
    assert result.returncode == 2 and "exact_match" in result.stderr  # names the nearest registered name


# ---------------------------------------------------------------------------
# misbehaving servers (real HTTP, in a thread of this process)


class Misbehaving(BaseHTTPRequestHandler):
    """POST /MODE answers per MODE; ``failures_left`` 500s come first in mode ``flaky``."""

    sizes: list = []
    in_flight = peak = 0
    failures_left = 0
    lock = threading.Lock()

    def do_GET(self):
        self.answer(404, b"no such page")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = len(body["completions"])
        cls = type(self)
        with cls.lock:
            cls.sizes.append(n)
            cls.in_flight += 1
            cls.peak = max(cls.peak, cls.in_flight)
        try:
            mode = self.path.strip("/")
            if mode == "flaky":
                with cls.lock:
                    fail, cls.failures_left = cls.failures_left > 0, cls.failures_left - 1
                if fail:
                    return self.answer(500, b'{"error": "overloaded"}')
            if mode == "slow":
                time.sleep(0.2)
            answers = {"garbage": b"<html>oops</html>", "short": json.dumps({"rewards": [1.0] * (n - 1)}).encode(),
                       "text": json.dumps({"rewards": ["high"] * n}).encode(), "list": b"[1, 2]"}
            if mode == "error":
                return self.answer(500, b'{"error": "database is down"}')
            self.answer(200, answers.get(mode, json.dumps({"rewards": [float(len(c)) for c in body["completions"]],
                                                           "scores": [1.0] * n}).encode()))
        finally:
            with cls.lock:
                cls.in_flight -= 1

    def answer(self, status, data):
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client timed out first
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def bad_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    Misbehaving.sizes, Misbehaving.peak, Misbehaving.failures_left = [], 0, 0
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def score(url, n=5, **remote):
    pipeline = build_reward(RewardConfig(functions=[url], remote=RemoteRewardConfig(**remote)), None)
    return pipeline([f"p{i}" for i in range(n)], ["x" * i for i in range(n)], [None] * n, {})


def test_batches_and_concurrency_limit(bad_server):
    result = score(bad_server + "/slow", n=7, batch_size=2, concurrency=2)
    assert result.rewards == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and result.scores == [1.0] * 7
    assert sorted(Misbehaving.sizes) == [1, 2, 2, 2] and Misbehaving.peak == 2
    # a server without a name page is named by its URL
    assert f"reward/{bad_server.split('://')[1]}/slow" in result.metrics


@pytest.mark.parametrize("mode, message", [
    ("garbage", "answered something that is not JSON: b'<html>oops</html>'"),
    ("short", "answered 4 rewards for 5 samples (samples 0-4)"),
    ("text", "answered rewards[0] = 'high' (samples 0-4): not a finite number"),
    ("list", "answered [1, 2] for samples 0-4: expected an object with 'rewards'"),
    ("error", "answered HTTP 500 Internal Server Error: database is down"),
])
def test_bad_answers_stop_with_the_url(bad_server, mode, message):
    with pytest.raises(RewardError) as err:
        score(f"{bad_server}/{mode}")
    assert str(err.value) == f"reward server {bad_server}/{mode}: {message}"


def test_slow_server_times_out(bad_server):
    started = time.perf_counter()
    with pytest.raises(RewardError, match=r"/slow: no answer within 0.05 s \(reward.remote.timeout\)"):
        score(bad_server + "/slow", timeout=0.05)
    assert time.perf_counter() - started < 2


def free_port() -> int:
    """A port that nothing listens on (once the probe closes)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_down_server_fails_before_any_scoring():
    port = free_port()
    with pytest.raises(RewardError) as err:
        build_reward(RewardConfig(functions=[f"http://127.0.0.1:{port}/score"]), None)
    assert str(err.value).startswith(f"reward server http://127.0.0.1:{port}/score: cannot connect: ")
    assert "Connection refused" in str(err.value)


def test_retries_are_counted_and_then_give_up(bad_server):
    Misbehaving.failures_left = 2
    result = score(bad_server + "/flaky", retries=3, backoff=0.01)
    assert result.rewards == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert result.metrics[f"reward/{bad_server.split('://')[1]}/flaky/failed_requests"] == 2

    Misbehaving.failures_left = 10
    with pytest.raises(RewardError, match=r"/flaky after 3 attempts \(reward.remote.retries=2\): answered HTTP 500"):
        score(bad_server + "/flaky", retries=2, backoff=0.01)


def test_bad_remote_options_and_urls_fail(bad_server):
    with pytest.raises(RewardError, match="reward.remote.concurrency is 0"):
        score(bad_server, concurrency=0)
    with pytest.raises(RewardError, match=r"'http://\[::1/score' is not a reward server's URL: Invalid IPv6 URL"):
        score("http://[::1/score")
    with pytest.raises(RewardError, match="'http:///score' is not a reward server's URL: it names no host"):
        score("http:///score")
