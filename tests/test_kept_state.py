"""A learner keeps its whole training state beside the run's shared memory (at most every second), so that a
learner restarted after it dies goes on with every tensor it had: the weights, the critics and targets, the
temperature, every optimizer's moments and step counts, the normalizers. The kept file is replaced atomically: a
reader finds the one before or the new one, never a half-written one."""

import os

import pytest
import torch

from sf_engine.roles.learner import KEEP_EVERY_SEC, Learner
from sf_engine.run.plan import build_plan
from sf_engine.runtime.role import RoleContext
from sf_engine.runtime.shared_buffers import TRAINING_STATE_SUFFIX, SharedBuffers
from sf_engine.runtime.weights import SharedWeights
from sf_engine.runtime.wiring import make_queues

ALGORITHMS = [
    ("ppo", "CartPole-v1"),
    ("dqn", "CartPole-v1"),
    ("pqn", "CartPole-v1"),
    ("r2d2", "CartPole-v1"),
    ("sac", "Pendulum-v1"),
    ("td3", "Pendulum-v1"),
    ("qrdqn", "CartPole-v1"),
    ("crossq", "Pendulum-v1"),
]


class Run:
    """A run's plan and shared memory, and its learners built in this process as the learner process builds them
    (`generation` > 0: one restarted after its predecessor died)."""

    def __init__(self, tmp_path, shm_dir, algo: str, env: str):
        flags = ["--algo", algo, "--env", env, "--train_dir", str(tmp_path), "--shm_dir", shm_dir]
        self.plan = build_plan(flags + ["--num_workers", "1", "--num_envs_per_worker", "8", "--mode", "async"])
        self.buffers = SharedBuffers.create(self.plan.paths.shm_path, self.plan.layout)
        self.queues = make_queues(1, None, None, self.plan.cfg.policies.num_acting)

    def learner(self, generation: int = 0) -> Learner:
        if generation:  # what the supervisor does once a learner died
            SharedWeights(self.buffers, self.queues.weights).retire()
        return Learner(RoleContext(self.plan, "learner", 0, self.buffers, self.queues, generation))

    def release(self) -> None:
        self.buffers.release()


def _scrambled(state, key: str = ""):
    """`state` (an algorithm's, nested) with every float tensor drawn anew and every count moved on; the optimizers'
    settings (their param_groups: this run's learning rates) as they are."""
    if isinstance(state, dict):
        return {k: v if k == "param_groups" else _scrambled(v, k) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return torch.randn_like(state) if state.is_floating_point() else state + 3
    if isinstance(state, int) and not isinstance(state, bool):
        return state + 3
    return state


def _assert_same(got, expected, where: str = "state") -> None:
    if isinstance(expected, dict):
        assert set(got) == set(expected), where
        for key in expected:
            _assert_same(got[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, torch.Tensor):
        assert torch.equal(got.cpu(), expected.cpu()), where
    else:
        assert got == expected, where


def _keep_now(learner: Learner) -> None:
    learner.last_keep_time -= KEEP_EVERY_SEC
    learner._keep_when_due()


@pytest.mark.parametrize("algo, env", ALGORITHMS)
def test_a_restarted_learner_has_every_tensor_of_the_state_its_predecessor_kept(tmp_path, shm_dir, algo, env):
    run = Run(tmp_path, shm_dir, algo, env)
    first = run.learner()
    algorithm = first.policies[0].algorithm
    trained = _scrambled(algorithm.state())
    algorithm.load(trained, "the test")
    _assert_same(algorithm.state(), trained)  # what the algorithm's state() holds, load() takes back whole
    assert first.policies[0].publish()  # version 1
    _keep_now(first)
    assert first.policies[0].publish()  # version 2: published after the state was kept, then the learner dies
    second = run.learner(generation=1)
    _assert_same(second.policies[0].algorithm.state(), trained)
    assert torch.equal(second.policies[0].params, first.policies[0].params)
    assert second.version == 2  # versions only go up: its first publication is version 3
    assert "policy 0 version 2 with the training state of version 1" in second.recovered, second.recovered
    assert "kept" in second.recovered and "new optimizer state" not in second.recovered
    run.release()
    assert os.listdir(shm_dir) == []  # the kept state goes with the run's shared memory


def test_a_half_written_state_is_never_read_and_a_damaged_one_falls_back_to_the_published_weights(
    tmp_path, shm_dir, caplog
):
    """A learner that died while writing leaves a temporary file beside the kept one: the restarted learner reads
    the kept one. A kept file that does not match its checksum is not used (a warning says so): the restarted learner
    goes on from the weights published last, as it would without a kept state."""
    run = Run(tmp_path, shm_dir, "dqn", "CartPole-v1")
    first = run.learner()
    algorithm = first.policies[0].algorithm
    trained = _scrambled(algorithm.state())
    algorithm.load(trained, "the test")
    assert first.policies[0].publish()
    _keep_now(first)
    kept = run.buffers.path + TRAINING_STATE_SUFFIX
    with open(kept + ".tmp", "wb") as f:  # the next keep, cut short by the learner's death
        f.write(open(kept, "rb").read()[:1000])
    second = run.learner(generation=1)
    _assert_same(second.policies[0].algorithm.state(), trained)
    with open(kept, "r+b") as f:  # never made by the engine (it renames whole files): a damaged file
        f.seek(200)
        f.write(b"\0" * 64)
    third = run.learner(generation=2)
    assert "the training state the learner kept is not used" in caplog.text
    assert "policy 0 version 1 from its last published weights, a new optimizer state" in third.recovered
    assert torch.equal(third.policies[0].params, first.policies[0].params)
    run.release()
    assert os.listdir(shm_dir) == []


def test_a_serial_run_keeps_no_state(tmp_path, shm_dir):
    """Nothing outlives a serial run's learner but the run itself: it keeps no state (and pays nothing for it)."""
    flags = ["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--shm_dir", shm_dir, "--mode", "serial"]
    plan = build_plan(flags + ["--num_workers", "1", "--num_envs_per_worker", "8"])
    buffers = SharedBuffers.create(plan.paths.shm_path, plan.layout)
    learner = Learner(RoleContext(plan, "learner", 0, buffers, make_queues(1, None, None, 1)))
    _keep_now(learner)
    assert not os.path.exists(buffers.path + TRAINING_STATE_SUFFIX)
    buffers.release()
