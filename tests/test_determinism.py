"""--deterministic true: two serial runs of the same flags and seed give the same figures and bit-identical
weights on the CPU; another seed gives others."""

import pytest
from conftest import train_error

import sf_engine
from sf_engine.runtime.checkpoint import load_checkpoint, policy_states

LEARNING_FIGURES = (
    "env_steps",
    "episodes",
    "episode_return_mean",
    "learner_version",
    "learner_samples",
    "policy_lag_mean",
    "policy_lag_max",
    "samples_dropped_lag",
)


def _run(tmp_path, shm_dir, algo: str, seed: int, name: str):
    result = sf_engine.train(
        algo=algo,
        mode="serial",
        deterministic=True,
        seed=seed,
        experiment=name,
        train_dir=str(tmp_path),
        shm_dir=shm_dir,
        train_for_env_steps=12_000,
        num_envs_per_worker=8,
        rollout=32,
    )
    weights = policy_states(load_checkpoint(result.checkpoint, "cpu"))[0]["model"]
    return {key: result.summary[key] for key in LEARNING_FIGURES}, weights


@pytest.mark.e2e
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_two_runs_of_the_same_seed_are_the_same_and_another_seed_differs(tmp_path, shm_dir, algo):
    figures, weights = _run(tmp_path, shm_dir, algo, 3, "first")
    again, weights_again = _run(tmp_path, shm_dir, algo, 3, "second")
    other, weights_other = _run(tmp_path, shm_dir, algo, 4, "other")
    assert figures["episodes"] > 0 and figures["learner_version"] > 0
    assert figures == again
    assert weights.keys() == weights_again.keys()
    assert all(weights[name].numpy().tobytes() == weights_again[name].numpy().tobytes() for name in weights)
    assert any(not weights[name].equal(weights_other[name]) for name in weights)


def test_deterministic_outside_serial_mode_is_one_line(tmp_path, capsys):
    line = train_error(["--deterministic", "true", "--mode", "sync"], tmp_path, capsys)
    assert "--deterministic true is built for --mode serial" in line and "--mode serial" in line
