"""enjoy.py and evaluation during training: replay, video, best checkpoint, one-line errors."""

import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO, main_error, read_json, run_train
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.e2e

SERIAL = ["--mode", "serial", "--num_workers", "1", "--num_envs_per_worker", "64", "--batch_size", "1024"]


def enjoy(*args, timeout=300):
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "enjoy.py")] + list(args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A short CartPole run with evaluation every 0.5 s."""
    train_dir = tmp_path_factory.mktemp("enjoy")
    result = run_train(
        [
            "--experiment",
            "cartpole",
            "--train_for_env_steps",
            "150000",
            "--eval_every_sec",
            "0.5",
            "--eval_episodes",
            "4",
        ]
        + SERIAL,
        train_dir,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return train_dir


def test_evaluation_logs_and_keeps_the_best_checkpoint(trained):
    exp = trained / "cartpole"
    assert (exp / "checkpoints" / "best.pt").exists()
    summary = read_json(exp / "summary.json")
    assert summary["eval_return_best"] >= summary["eval_return_mean"] > 0
    events = EventAccumulator(str(exp))
    events.Reload()
    assert "eval/return_mean" in events.Tags()["scalars"]
    assert len(events.Scalars("eval/return_mean")) >= 1


def test_a_resumed_run_keeps_the_earlier_best(trained):
    from sf_engine.runtime.checkpoint import load_checkpoint

    best = trained / "cartpole" / "checkpoints" / "best.pt"
    before = load_checkpoint(best)["eval_return"]
    result = run_train(
        [
            "--experiment",
            "cartpole",
            "--train_for_env_steps",
            "170000",
            "--eval_every_sec",
            "0.5",
            "--eval_episodes",
            "2",
            "--eval_max_steps",
            "30",
        ]
        + SERIAL,
        trained,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert load_checkpoint(best)["eval_return"] >= before  # unfinished episodes never win


@pytest.mark.parametrize("checkpoint", ["latest", "best"])
def test_enjoy_prints_episodes_and_a_summary_line(trained, checkpoint):
    result = enjoy(
        "--train_dir", str(trained), "--experiment", "cartpole", "--num_episodes", "3", "--checkpoint", checkpoint
    )
    assert result.returncode == 0, result.stderr
    episodes = re.findall(r"^episode (\d+): return ([0-9.]+), length (\d+)$", result.stdout, re.M)
    assert [int(e[0]) for e in episodes] == [0, 1, 2]
    summary = re.search(
        r"^3 episodes of CartPole-v1 from (\S+): return ([0-9.]+) \+- ([0-9.]+), length ([0-9.]+)$", result.stdout, re.M
    )
    assert summary, result.stdout
    mean = sum(float(e[1]) for e in episodes) / 3
    assert float(summary.group(2)) == pytest.approx(mean, abs=0.06)
    assert (summary.group(1) == "best.pt") == (checkpoint == "best")
    figures = json.loads(result.stdout.strip().splitlines()[-1])  # the last line, for scripts
    assert figures["episodes"] == 3 and figures["checkpoint"] == summary.group(1)
    assert figures["return_mean"] == pytest.approx(mean, abs=0.06)
    assert figures["return_std"] == pytest.approx(float(summary.group(3)), abs=0.06)
    assert figures["length_mean"] == pytest.approx(float(summary.group(4)), abs=0.06)


def test_video_decodes_to_every_frame_at_the_render_size(trained, tmp_path, capsys):
    import imageio.v3 as iio

    from sf_engine.play import enjoy as enjoy_script  # in this process: the video is what this test is about

    video = tmp_path / "run.mp4"
    assert (
        enjoy_script.main(
            [
                "--train_dir",
                str(trained),
                "--experiment",
                "cartpole",
                "--num_episodes",
                "2",
                "--video",
                str(video),
                "--deterministic",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    lengths = [int(n) for n in re.findall(r"^episode \d+: return [0-9.]+, length (\d+)$", out, re.M)]
    frames = iio.imread(video)
    # the first observation, every step, and the reset step between two episodes
    assert frames.shape == (1 + sum(lengths) + len(lengths) - 1, 400, 600, 3)
    assert frames.std() > 0
    for capped in (tmp_path / "capped.mp4", tmp_path / "capped.gif"):  # both through the same ffmpeg pipe
        assert (
            enjoy_script.main(
                [
                    "--train_dir",
                    str(trained),
                    "--experiment",
                    "cartpole",
                    "--num_episodes",
                    "1",
                    "--video",
                    str(capped),
                    "--max_frames",
                    "40",
                ]
            )
            == 0
        )
        frames = iio.imread(capped)
        assert frames.shape[:3] == (40, 400, 600) and frames.std() > 0


def enjoy_error(capsys, *args) -> str:
    """enjoy.py's promised failure (sf_engine.play.enjoy.main, as enjoy.py calls it)."""
    from sf_engine.play.enjoy import main

    return main_error(main, args, capsys)


def test_checkpoint_of_another_env_is_refused(trained, tmp_path, capsys):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    assert (
        run(
            build_plan(
                [
                    "--experiment",
                    "acrobot",
                    "--env",
                    "Acrobot-v1",
                    "--train_for_env_steps",
                    "5000",
                    "--train_dir",
                    str(tmp_path),
                ]
                + SERIAL
            )
        )
        == 0
    )
    acrobot_checkpoint = glob.glob(str(tmp_path / "acrobot" / "checkpoints" / "checkpoint_*.pt"))[0]
    line = enjoy_error(
        capsys, "--train_dir", str(trained), "--experiment", "cartpole", "--checkpoint", acrobot_checkpoint
    )
    assert "Acrobot-v1" in line and "cartpole" in line


def test_bad_input_is_one_line(trained, tmp_path, capsys):
    def error_of(*args):
        return enjoy_error(capsys, *args)

    assert "no experiment" in error_of("--train_dir", str(tmp_path), "--experiment", "missing")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.json").write_text(json.dumps({"env": {"env": "CartPole-v1"}}))
    assert "no checkpoint yet" in error_of("--train_dir", str(tmp_path), "--experiment", "fresh")
    assert "no best checkpoint" in error_of(
        "--train_dir", str(tmp_path), "--experiment", "fresh", "--checkpoint", "best"
    )
    latest = sorted(glob.glob(str(trained / "cartpole" / "checkpoints" / "checkpoint_*.pt")))[-1]
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(open(latest, "rb").read()[:2000])
    message = error_of("--train_dir", str(trained), "--experiment", "cartpole", "--checkpoint", str(truncated))
    assert "truncated or corrupted" in message


def test_bad_replay_flags_are_one_line_before_anything_is_loaded(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    missing = ["--train_dir", str(tmp_path), "--experiment", "missing"]  # checked before the experiment
    for args, words in (
        (["--video_fps", "0", "--video", str(tmp_path / "v.mp4")], "--video_fps"),
        (["--max_frames", "0"], "--max_frames"),
        (["--max_episode_steps", "0"], "--max_episode_steps"),
        (["--video", str(tmp_path / "no_dir" / "v.mp4")], "not writable"),
        (["--video", str(tmp_path / "v.avi")], ".mp4 or .gif"),
        (["--render"], "no display"),
    ):
        assert words in enjoy_error(capsys, *missing, *args)
    assert os.listdir(tmp_path) == []


def test_episodes_are_cut_at_max_episode_steps(trained, capsys):
    from sf_engine.play import enjoy as enjoy_script

    assert (
        enjoy_script.main(
            [
                "--train_dir",
                str(trained),
                "--experiment",
                "cartpole",
                "--num_episodes",
                "2",
                "--max_episode_steps",
                "30",
                "--deterministic",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("length 30 (cut at --max_episode_steps)") == 2, out


def test_video_memory_stays_flat_in_the_number_of_frames(trained, tmp_path):
    """Frames are written as they are played: 5,000 frames take about the memory of 100 (the two
    replays run side by side; each one's peak resident memory is sampled with psutil)."""
    import psutil

    runs = {}
    for frames, episodes in ((100, 1), (5000, 30)):
        proc = subprocess.Popen(
            [
                sys.executable,
                os.path.join(REPO, "enjoy.py"),
                "--train_dir",
                str(trained),
                "--experiment",
                "cartpole",
                "--num_episodes",
                str(episodes),
                "--video",
                str(tmp_path / f"{frames}.mp4"),
                "--max_frames",
                str(frames),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        runs[frames] = (proc, psutil.Process(proc.pid))
    peak = dict.fromkeys(runs, 0)
    while any(proc.poll() is None for proc, _ in runs.values()):
        for frames, (proc, process) in runs.items():
            try:
                peak[frames] = max(peak[frames], process.memory_info().rss)
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.05)
    for frames, (proc, _) in runs.items():
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        assert f"({frames} frames of 600x400" in out, out  # the video is as long as asked
    assert peak[5000] - peak[100] < 200 * 2**20, peak
