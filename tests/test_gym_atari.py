"""Gymnasium's ALE ids in the Atari family: the spec, the preprocessing EnvPool's Atari envs have, the true score
beside the clipped rewards of training, and the one line that says so (and names EnvPool's id of the same game)."""

import importlib.util

import numpy as np
import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from sf_engine.envs import make_batch_env, probe_env_spec  # noqa: E402
from sf_engine.envs.gym_atari import AtariFactory  # noqa: E402

ENV = "ale_py:ALE/Breakout-v5"


def test_an_ale_id_is_of_the_atari_family_with_envpools_spec():
    spec = probe_env_spec(ENV, "auto")
    assert (spec.family, spec.frameskip, spec.obs) == ("atari", 4, (("obs", (4, 84, 84), "uint8"),))
    assert spec.action.nvec == (4,)
    pytest.importorskip("envpool")
    twin = probe_env_spec("Breakout-v5", "envpool")
    assert (twin.obs, twin.action, twin.family, twin.frameskip) == (spec.obs, spec.action, spec.family, 4)


def test_the_start_says_how_it_is_made_and_names_envpools_id(tmp_path):
    from sf_engine.run.plan import build_plan

    plan = build_plan(["--env", ENV, "--restart", "--mode", "serial", "--train_dir", str(tmp_path)])
    (line,) = [note for note in plan.notes if "preprocessing" in note]
    assert "84x84 gray, frameskip 4, sticky actions 0" in line and "episodic life" in line
    if importlib.util.find_spec("envpool") is not None:
        assert line.endswith("--env Breakout-v5")
    assert plan.cfg.model.encoder == "nature_cnn" and plan.cfg.learner.learning_rate == 2.5e-4  # the family's


def test_training_sees_lives_and_clipped_rewards_while_the_score_is_the_games():
    env = AtariFactory("ALE/Breakout-v5", training=True)()
    obs, info = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and info["reward"] == 0.0
    rng, score, shown = np.random.default_rng(0), 0.0, 0.0
    for _ in range(40):  # whole games of random play, until one scores
        if shown > 0:
            break
        lives_lost = 0
        while True:
            obs, reward, terminated, truncated, info = env.step(int(rng.integers(0, 4)))
            score, shown = score + info["reward"], shown + reward
            assert reward in (0.0, 1.0) and info["reward"] >= reward
            if info["terminated"] or truncated:
                break
            if terminated:  # a life lost: the same game goes on after the reset
                lives_lost += 1
                env.reset()
        assert terminated and lives_lost == 4  # Breakout's five lives
        env.reset()
    assert score >= shown > 0


def test_a_batch_reports_the_true_game_over_and_score(tmp_path):
    spec = probe_env_spec(ENV, "auto")
    env = make_batch_env(ENV, "auto", 2, seed=0, spec=spec, training=True)
    env.reset()
    overs = ends = 0
    rng = np.random.default_rng(1)
    for _ in range(4000):
        step = env.step(rng.integers(0, 4, 2))
        ends += int(step.terminated.sum())
        overs += int(step.episode_over.sum())
        if overs:
            break
    env.close()
    assert overs >= 1 and ends > overs  # lives ended the learner's episodes, one game ended
