"""The Doom family (envs/doom.py): its spec and observations, Sample Factory's settings, frames that
count the frame skip, serial training on doom_basic, images bit-exact on the learner, and the one-line
install hint without VizDoom."""

import os
import sys
import time

import numpy as np
import pytest
from conftest import SerialRun, read_json, serial_plan, train_error
from test_reliability import alive, no_leftover_runs  # noqa: F401  (a failed test leaves no run behind)

from sf_engine.envs import EnvError, make_batch_env, probe_env_spec
from sf_engine.run.runner import run


@pytest.mark.parametrize(
    "env_id, actions", [("doom_basic", 4), ("VizdoomBasic-v1", 4), ("doom_health_gathering_supreme", 5)]
)
def test_doom_spec_and_batched_observations(env_id, actions):
    spec = probe_env_spec(env_id, "auto")
    assert (spec.family, spec.frameskip) == ("doom", 4)
    assert spec.obs == (("obs", (72, 128, 3), "uint8"),)  # Sample Factory's 128x72 RGB
    assert (spec.action.kind, spec.action.nvec) == ("discrete", (actions,))  # idle + one per button
    env = make_batch_env(env_id, "auto", 2, seed=3, spec=spec)
    try:
        obs = env.reset()["obs"]
        assert obs.shape == (2, 72, 128, 3) and obs.dtype == np.uint8 and obs.std() > 5  # a rendered room
        rewards = [env.step(np.array([1, 3])).rewards for _ in range(5)]
        assert np.all(np.isfinite(rewards))
    finally:
        env.close()


def test_doom_basic_rewards_are_sample_factorys():
    """basic.cfg: -1 a tic of living reward, -5 a shot; Sample Factory scales by 0.01, 4 tics a step."""
    from sf_engine.envs.doom import DoomEnv

    env = DoomEnv("doom_basic")
    try:
        env.reset(seed=1)
        _, idle, *_ = env.step(0)
        assert idle == pytest.approx(-0.04)
        shot = sum(env.step(action)[1] for action in (3, 0, 0))  # the shot's cost lands a step later
        assert shot == pytest.approx(-0.17) or shot > 0  # a miss costs 5; a hit kills (+101)
        screen = env.render()
        assert screen.shape == (120, 160, 3)  # the full screen, not the network's input
    finally:
        env.close()


@pytest.mark.e2e
def test_doom_basic_trains_in_serial_mode_and_frames_count_the_skip(tmp_path, shm_dir):
    plan = serial_plan(tmp_path, shm_dir, "doom_basic", "--train_for_env_steps", "256")
    cfg = plan.cfg
    assert (cfg.model.encoder, cfg.model.rnn, cfg.model.rnn_size) == ("convnet_simple", "gru", 512)
    assert run(plan) == 0
    summary = read_json(tmp_path / "family" / "summary.json")
    assert summary["learner_version"] >= 2 and summary["env_steps"] >= 256
    assert summary["frames"] == 4 * summary["env_steps"]
    assert os.listdir(shm_dir) == []


class _Recording:
    """A batch env that keeps a copy of every observation it hands out."""

    def __init__(self, env, returned: list):
        self.env, self.returned = env, returned

    def reset(self):
        obs = self.env.reset()
        self.returned.append(obs["obs"].copy())
        return obs

    def step(self, actions):
        result = self.env.step(actions)
        self.returned.append(result.obs["obs"].copy())
        return result

    def __getattr__(self, name):
        return getattr(self.env, name)


def test_doom_images_arrive_bit_exact_on_the_learner(tmp_path, shm_dir, monkeypatch):
    """Every 72x128 frame in the learner's batch is one the envs returned, byte for byte."""
    import sf_engine.roles.rollout_worker as rollout_worker

    returned = []
    make = rollout_worker.make_batch_env
    monkeypatch.setattr(rollout_worker, "make_batch_env", lambda *a, **k: _Recording(make(*a, **k), returned))
    plan = serial_plan(
        tmp_path, shm_dir, "doom_basic", "--rollout", "8", "--batch_size", "32", "--num_batches_per_epoch", "1"
    )
    cfg, roles = plan.cfg, SerialRun(plan, tmp_path)
    try:
        batch = roles.learner.source.gather(roles.full_slots(cfg.slots_per_batch)[: cfg.slots_per_batch])
        frames = batch.obs["obs"].numpy()
        assert frames.dtype == np.uint8 and frames.shape[-3:] == (72, 128, 3)
        frames = frames.reshape(-1, 72, 128, 3)
        known = {frame.tobytes() for batch_ in returned for frame in batch_}
        assert all(frame.tobytes() in known for frame in frames)
        assert len({frame.tobytes() for frame in frames}) > 8  # frames of a game, not one frame
    finally:
        roles.close()


def test_deathmatch_shaping_counts_changes_and_stats_are_per_episode():
    """Deathmatch rewards: +1 a frag, -0.75 a death, ... (changes of game variables, not their values);
    the stats of an episode are the counters' changes over it (VizDoom's death count runs on across a
    multiplayer game's episodes)."""
    from sf_engine.envs.doom import DoomEnv

    env = DoomEnv("doom_deathmatch_bots")
    try:
        before = {"FRAGCOUNT": 2, "DEATHCOUNT": 5, "HITCOUNT": 0, "DAMAGECOUNT": 0, "HEALTH": 100, "ARMOR": 0}
        after = dict(before, FRAGCOUNT=3, DEATHCOUNT=6, HEALTH=80)
        assert env._shaping(before, after) == pytest.approx(1.0 - 0.75 - 20 * 0.003)
        assert env._shaping(before, before) == 0.0
        telefragged = dict(before, HEALTH=-999900, DEATHCOUNT=6)  # health below zero counts as zero
        assert env._shaping(before, telefragged) == pytest.approx(-0.75 - 100 * 0.003)
        assert env._shaping(telefragged, dict(telefragged, HEALTH=100)) == pytest.approx(100 * 0.005)
        assert env.action_space.n == 9  # idle + 8 buttons; the two delta buttons are left out
    finally:
        env.close()


@pytest.mark.e2e
def test_deathmatch_against_bots_reports_frags_and_deaths(tmp_path, shm_dir, monkeypatch):
    """A match against 7 built-in bots, cut to 6 s of game time: its episodes' frags and deaths reach
    summary.json, TensorBoard (episode/frags, episode/deaths) and the true objective (frags)."""
    import dataclasses

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sf_engine.envs import doom

    short = dataclasses.replace(doom.SAMPLE_FACTORY_NAMES["doom_deathmatch_bots"], minutes=0.1)
    monkeypatch.setitem(doom.SAMPLE_FACTORY_NAMES, "doom_deathmatch_bots", short)
    plan = serial_plan(tmp_path, shm_dir, "doom_deathmatch_bots", "--train_for_env_steps", "640")
    assert run(plan) == 0
    summary = read_json(tmp_path / "family" / "summary.json")
    assert summary["episodes"] >= 4
    extra = summary["episode_extra_stats"]
    assert set(extra) == {"frags", "deaths", "hits", "true_objective"}
    assert extra["true_objective"] == extra["frags"] and extra["deaths"] >= 0
    events = EventAccumulator(str(tmp_path / "family"))
    events.Reload()
    assert {"episode/frags", "episode/deaths", "episode/return"} <= set(events.Tags()["scalars"])


def test_missing_vizdoom_is_one_line_with_the_install_command(tmp_path, shm_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vizdoom", None)  # import vizdoom now raises ImportError
    with pytest.raises(EnvError, match=r"pip install 'sf_engine\[doom\]'"):
        probe_env_spec("doom_basic", "auto")
    line = train_error(["--env", "doom_basic", "--shm_dir", shm_dir], tmp_path, capsys)
    assert "--env doom_basic" in line and "pip install 'sf_engine[doom]'" in line


@pytest.mark.e2e
def test_doom_replay_video_shows_the_full_screen(tmp_path, shm_dir, capsys):
    """enjoy.py on a Doom experiment: the video holds the 160x120 screen, not the 128x72 network input."""
    import imageio.v3 as iio

    from sf_engine.play import enjoy as replay

    assert run(serial_plan(tmp_path, shm_dir, "doom_basic", "--train_for_env_steps", "64")) == 0
    video = tmp_path / "doom.mp4"
    assert (
        replay.main(
            [
                "--train_dir",
                str(tmp_path),
                "--experiment",
                "family",
                "--num_episodes",
                "1",
                "--video",
                str(video),
                "--max_frames",
                "30",
            ]
        )
        == 0
    )
    frames = iio.imread(video)
    assert frames.shape == (30, 120, 160, 3) and frames.std() > 5
    assert "_vizdoom.ini" not in os.listdir(os.getcwd())  # VizDoom's ini goes to a temporary folder


def _vizdoom_segments() -> set:
    return {name for name in os.listdir("/dev/shm") if name.startswith("ViZDoom")}


def _games_of(pids) -> list:
    """The VizDoom game processes this family started for any of `pids`."""
    import psutil

    from sf_engine.envs.doom import _arg, _owner

    games = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        config = _arg(process.info["cmdline"] or [], "-config")
        if config and _owner(os.path.dirname(config)) in pids:
            games.append(process.info["pid"])
    return games


@pytest.mark.e2e
def test_a_killed_worker_and_ctrl_c_leave_no_game_or_segment_behind(tmp_path, shm_dir):
    """VizDoom runs each game in a process of its own with segments in /dev/shm: a rollout worker killed
    with SIGKILL has its games reaped before it is restarted, and Ctrl-C stops every game."""
    import signal

    from test_reliability import alive, start_train, wait_for, wait_for_children

    before = _vizdoom_segments()
    exp = str(tmp_path / "doom")
    proc = start_train(
        [
            "--env",
            "doom_basic",
            "--num_workers",
            "2",
            "--num_envs_per_worker",
            "2",
            "--shm_dir",
            shm_dir,
            "--train_for_seconds",
            "300",
        ],
        tmp_path,
        "doom",
    )
    rows = wait_for_children(exp, 4)
    worker = next(r["pid"] for r in rows if r["role"] == "rollout_worker" and r["index"] == 0)
    deadline = time.monotonic() + 60
    while len(_games_of([worker])) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
    killed_games = _games_of([worker])
    assert len(killed_games) == 2
    os.kill(worker, signal.SIGKILL)
    wait_for(exp, "worker_restarts", 1)
    assert not alive(killed_games)
    deadline, games = time.monotonic() + 60, []
    while len(games) < 4 and time.monotonic() < deadline:  # the restarted worker's two and the other's two
        time.sleep(0.3)
        games = _games_of([r["pid"] for r in read_json(os.path.join(exp, "processes.json"))["processes"]])
    assert len(games) == 4
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group, games included
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert out.count("reaped a VizDoom game") == 2, out
    assert not alive(games)
    assert _vizdoom_segments() - before == set()
    assert os.listdir(shm_dir) == []


def _short_duel(monkeypatch, minutes=0.05):
    """doom_duel cut to `minutes` of game time (its players' processes get the length from the env)."""
    import dataclasses

    from sf_engine.envs import doom

    short = dataclasses.replace(doom.SAMPLE_FACTORY_NAMES["doom_duel"], minutes=minutes)
    monkeypatch.setitem(doom.SAMPLE_FACTORY_NAMES, "doom_duel", short)


def test_doom_duel_is_two_agents_of_one_multiplayer_game(monkeypatch):
    """Two games of doom_duel (3 s each) batched as four rows: each player sees its own screen, a game
    ends for both of its players at once, each reports its frags and true objective, and closing leaves
    no player, game or segment behind."""
    _short_duel(monkeypatch)
    before = _vizdoom_segments()
    spec = probe_env_spec("doom_duel", "auto")
    assert (spec.family, spec.agents, spec.turn_based) == ("doom", ("player_0", "player_1"), False)
    assert spec.obs == (("obs", (72, 128, 3), "uint8"),)
    env = make_batch_env("doom_duel", "auto", 4, seed=3, spec=spec)
    try:
        obs = env.reset()["obs"]
        assert np.abs(obs[0].astype(int) - obs[1]).mean() > 1  # two players, two viewpoints
        players = [p.pid for game in env.games for p in game._procs]
        assert len(players) == 4 and len(_games_of(players)) == 4
        ended, truncated, objective, names = np.zeros(4, int), 0, [], set()
        rng = np.random.default_rng(0)
        for _ in range(200):
            result = env.step(rng.integers(0, spec.action.nvec[0], 4))
            assert np.array_equal(result.terminated[0::2], result.terminated[1::2])  # a game ends for both
            ended += result.terminated
            truncated += int(result.truncated.sum())
            names |= set(result.extra_stats or {})
            if result.objective is not None:
                objective += result.objective[result.terminated].tolist()
            if ended.min() >= 2:
                break
        assert ended.min() >= 2 and truncated == 0 and all(game.stalls == 0 for game in env.games)
        assert len(objective) == int(ended.sum()) and np.isfinite(objective).all()  # each player's frags
        assert {"frags", "deaths", "hits", "true_objective"} <= names
    finally:
        env.close()
    assert not alive(players) and _games_of(players) == []
    assert _vizdoom_segments() - before == set()


def test_a_stalled_duel_is_killed_and_its_episode_truncated(monkeypatch):
    """A player that stops answering (frozen here with SIGSTOP): after the stall timeout both players and
    their games are killed, the episode ends truncated for both agents, and reset() starts a new game."""
    import signal

    from sf_engine.envs import doom_duel

    _short_duel(monkeypatch, minutes=1.0)
    monkeypatch.setattr(doom_duel, "STALL_TIMEOUT_S", 2.0)
    before = _vizdoom_segments()
    env = doom_duel.DoomMultiplayer("doom_duel")
    try:
        env.reset(seed=1)
        env.step({"player_0": 1, "player_1": 2})
        frozen = [p.pid for p in env._procs]
        games = _games_of(frozen)
        os.kill(frozen[1], signal.SIGSTOP)
        _, rewards, terms, truncs, _ = env.step({"player_0": 1, "player_1": 2})
        assert truncs == {"player_0": True, "player_1": True} and not any(terms.values())
        assert env.agents == [] and env.stalls == 1
        assert not alive(frozen) and not alive(games)
        obs, _ = env.reset(seed=2)
        assert set(obs) == {"player_0", "player_1"} and env.step({"player_0": 0, "player_1": 0})[0]
        players = [p.pid for p in env._procs]
    finally:
        env.close()
    assert not alive(players) and _vizdoom_segments() - before == set()


@pytest.mark.e2e
def test_doom_duel_trains_two_policies_in_self_play(tmp_path, shm_dir, monkeypatch):
    """doom_duel end to end in serial mode with two policies: each policy's figures and the players'
    frags reach summary.json."""
    _short_duel(monkeypatch, minutes=0.05)
    plan = serial_plan(tmp_path, shm_dir, "doom_duel", "--num_policies", "2", "--train_for_env_steps", "1024")
    assert run(plan) == 0
    summary = read_json(tmp_path / "family" / "summary.json")
    assert summary["episodes"] >= 4 and "frags" in summary["episode_extra_stats"]
    assert [p["policy"] for p in summary["policies"]] == [0, 1]
    assert all(p["version"] >= 1 for p in summary["policies"])
