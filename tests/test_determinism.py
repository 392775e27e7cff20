"""--deterministic true: two serial runs, or two sync runs (processes), of the same flags and seed give the same
figures and bit-identical weights on the CPU; another seed gives others."""

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


def _run(tmp_path, shm_dir, algo: str, seed: int, name: str, **flags):
    result = sf_engine.train(
        **{
            "algo": algo,
            "mode": "serial",
            "deterministic": True,
            "seed": seed,
            "experiment": name,
            "train_dir": str(tmp_path),
            "shm_dir": shm_dir,
            "train_for_env_steps": 12_000,
            "num_envs_per_worker": 8,
            "rollout": 32,
        }
        | flags
    )
    weights = policy_states(load_checkpoint(result.checkpoint, "cpu"))[0]["model"]
    return {key: result.summary[key] for key in LEARNING_FIGURES}, weights


def _same_weights(weights, weights_again) -> bool:
    return weights.keys() == weights_again.keys() and all(
        weights[name].numpy().tobytes() == weights_again[name].numpy().tobytes() for name in weights
    )


@pytest.mark.e2e
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_two_runs_of_the_same_seed_are_the_same_and_another_seed_differs(tmp_path, shm_dir, algo):
    figures, weights = _run(tmp_path, shm_dir, algo, 3, "first")
    again, weights_again = _run(tmp_path, shm_dir, algo, 3, "second")
    other, weights_other = _run(tmp_path, shm_dir, algo, 4, "other")
    assert figures["episodes"] > 0 and figures["learner_version"] > 0
    assert figures == again
    assert weights.keys() == weights_again.keys()
    assert _same_weights(weights, weights_again)
    assert any(not weights[name].equal(weights_other[name]) for name in weights)


# sync mode: 2 rollout-worker processes, a policy-worker process and a learner process; a training batch of one
# round of the 4 env groups (2 workers x 8 envs x 32 steps = 512 samples); 12,000 env steps end with round 24
SYNC = {"mode": "sync", "num_workers": 2, "batch_size": 512, "num_batches_per_epoch": 1}
SYNC_ROUNDS = -(-12_000 // 512)


@pytest.mark.e2e
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_two_sync_runs_of_the_same_seed_are_the_same(tmp_path, shm_dir, algo):
    flags = SYNC if algo == "ppo" else {"mode": "sync", "num_workers": 2}  # DQN: a round is one slot of every split
    figures, weights = _run(tmp_path, shm_dir, algo, 3, "first", **flags)
    again, weights_again = _run(tmp_path, shm_dir, algo, 3, "second", **flags)
    assert figures["episodes"] > 0 and figures["learner_version"] > 0
    assert figures["env_steps"] == SYNC_ROUNDS * 512  # the end of the round that reaches the budget
    assert figures == again
    assert _same_weights(weights, weights_again)


@pytest.mark.e2e
def test_a_sync_run_trains_its_last_round_whole_when_its_training_outlasts_the_stop(tmp_path, shm_dir):
    """PPO's 300 epochs on the last of 2 rounds take longer than the sampling processes take to stop: the learner,
    stopped meanwhile, still takes every update of that round (a stopping learner skips the rest of a round)."""
    flags = SYNC | {"num_epochs": 300, "train_for_env_steps": 1024}
    figures, weights = _run(tmp_path, shm_dir, "ppo", 3, "first", **flags)
    again, weights_again = _run(tmp_path, shm_dir, "ppo", 3, "second", **flags)
    assert figures["env_steps"] == 1024 and figures["learner_version"] == 2
    assert figures == again
    assert _same_weights(weights, weights_again)


def test_deterministic_in_async_mode_is_one_line(tmp_path, capsys):
    line = train_error(["--deterministic", "true", "--mode", "async"], tmp_path, capsys)
    assert "--deterministic true needs --mode serial or sync" in line and "--mode sync" in line


def test_deterministic_sync_needs_a_batch_of_one_round(tmp_path, capsys):
    args = ["--deterministic", "true", "--mode", "sync", "--num_workers", "2", "--num_envs_per_worker", "8"]
    args += ["--rollout", "32", "--batch_size", "1024", "--num_batches_per_epoch", "1"]
    line = train_error(args, tmp_path, capsys)
    assert "--batch_size x --num_batches_per_epoch (1024) must be" in line and "(512)" in line
