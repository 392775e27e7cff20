"""Several policies in one run (--num_policies): every row is acted by the policy its episode was given,
each trajectory reaches that policy's learner and no other, a fixed agent mapping holds, a population
is saved and resumed whole, and bad mappings are one line."""

import os

import numpy as np
import pytest
import torch
from conftest import SerialRun, read_json, run_train, serial_plan, train_error

from sf_engine.model.actor_critic import obs_tensors
from sf_engine.run.plan import build_plan
from sf_engine.run.runner import run


def _recorded_training(learner) -> list:
    """Wraps each policy's train(): returns the list of (policy, keep mask, batch) it is called with."""
    calls = []
    for policy_learner in learner.policies:
        original = policy_learner.algorithm.train

        def train(batch, _original=original, _policy=policy_learner.policy):
            calls.append((_policy, batch.keep.clone(), batch))
            return _original(batch)

        policy_learner.algorithm.train = train
    return calls


def test_each_trajectory_is_acted_and_trained_by_its_own_policy(tmp_path, shm_dir):
    """Three policies on CartPole: a row's policy changes only where an episode starts (the row after an
    invalid reset step), so the value a truncation bootstraps from is its own policy's; every stored log-prob is that
    of the row's own policy (recomputed with its weights); each policy's learner is handed exactly the valid samples
    it acted, and every policy trains."""
    plan = serial_plan(
        tmp_path, shm_dir, "CartPole-v1", "--num_policies", "3", "--num_envs_per_worker", "16", "--batch_size", "128"
    )
    harness = SerialRun(plan, tmp_path)
    try:
        calls = _recorded_training(harness.learner)
        slots = harness.full_slots(plan.cfg.slots_per_batch)[: plan.cfg.slots_per_batch]
        buf = harness.buffers
        ids = buf.policy_id[slots]  # [S, T+1, E]
        changed = ids[:, 1:] != ids[:, :-1]  # row t+1 (up to the bootstrap row T) against row t
        assert not (changed & buf.valid[slots]).any(), "a policy changed hands inside an episode or at its end"
        assert changed.any()
        assert set(np.unique(ids[:, :-1])) == {0, 1, 2}
        for policy in range(3):
            rows = ids[:, :-1] == policy
            obs = obs_tensors({k: v[slots][:, :-1][rows] for k, v in buf.obs.items()})
            model = harness.policy.models[policy]
            with torch.no_grad():
                params, _ = model(obs)
                log_probs, _ = model.log_prob_entropy(params, torch.from_numpy(buf.actions[slots][rows]))
            np.testing.assert_allclose(log_probs.numpy(), buf.log_probs[slots][rows], rtol=1e-4, atol=1e-5)
        harness.learner.train_on(slots)
        assert sorted(policy for policy, _, _ in calls) == [0, 1, 2]
        covered = torch.zeros_like(calls[0][1])
        for policy, keep, batch in calls:
            assert bool((batch.policy_id[:-1][keep] == policy).all())
            assert not bool((covered & keep).any())
            covered |= keep
        assert bool((covered == calls[0][2].valid).all())
        assert [learner.version for learner in harness.learner.policies] == [1, 1, 1]
    finally:
        harness.close()


def test_a_fixed_agent_mapping_holds_for_every_step(tmp_path, shm_dir):
    pytest.importorskip("pettingzoo")
    plan = serial_plan(
        tmp_path, shm_dir, "toy_multiagent:relay_game", "--num_policies", "2", "--agent_policies", "first=1,second=0"
    )
    harness = SerialRun(plan, tmp_path)
    try:
        slots = harness.full_slots(2)
        ids = harness.buffers.policy_id[slots]
        assert (ids[..., 0::2] == 1).all() and (ids[..., 1::2] == 0).all()
    finally:
        harness.close()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--num_policies", "2", "--agent_policies", "first=0"], ["single-agent env", "unknown first"]),
        (["--num_policies", "2", "--agent_policies", "first"], ["'first' is not AGENT=POLICY"]),
        (["--num_policies", "0"], ["--num_policies must be at least 1"]),
    ],
)
def test_bad_policy_flags_are_one_line(tmp_path, shm_dir, capsys, flags, words):
    line = train_error(["--shm_dir", shm_dir] + flags, tmp_path, capsys)
    assert all(word in line for word in words), line
    assert os.listdir(tmp_path) == []


def test_a_population_is_saved_and_resumed_whole(tmp_path, shm_dir):
    """Two policies: the checkpoint holds both (weights, optimizer state, version); the same command
    again resumes each where it was; another --num_policies is refused."""
    args = [
        "--train_dir",
        str(tmp_path),
        "--shm_dir",
        shm_dir,
        "--experiment",
        "pop",
        "--num_policies",
        "2",
        "--mode",
        "serial",
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--rollout",
        "16",
        "--batch_size",
        "64",
        "--num_batches_per_epoch",
        "2",
    ]
    assert run(build_plan(args + ["--train_for_env_steps", "3000"])) == 0
    first = read_json(tmp_path / "pop" / "summary.json")
    versions = [p["version"] for p in first["policies"]]
    assert min(versions) > 0
    plan = build_plan(args + ["--train_for_env_steps", "6000"])
    assert plan.resume_from is not None
    harness = SerialRun(plan, tmp_path)
    try:
        assert [learner.version for learner in harness.learner.policies] == versions
        state = torch.load(plan.resume_from, weights_only=True)
        for learner, saved in zip(harness.learner.policies, state["policies"]):
            for name, tensor in learner.algorithm.model.state_dict().items():
                assert torch.equal(tensor, saved["model"][name])
            assert learner.algorithm.optimizer.state_dict()["state"].keys() == saved["optimizer"]["state"].keys()
    finally:
        harness.close()
    with pytest.raises(Exception, match="--num_policies"):
        build_plan(args + ["--num_policies", "3", "--train_for_env_steps", "6000"])


@pytest.mark.e2e
def test_several_policies_train_in_processes(tmp_path, shm_dir):
    """--num_policies 2 on CartPole in processes: both policies train and report (with each one's part
    of the learner's and the policy worker's time), the processes exit and the shared memory is released."""
    result = run_train(
        ["--num_policies", "2", "--experiment", "two", "--shm_dir", shm_dir, "--train_for_env_steps", "400000"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_json(tmp_path / "two" / "summary.json")
    policies = summary["policies"]
    assert [p["policy"] for p in policies] == [0, 1]
    assert all(p["version"] > 2 and p["episodes"] > 0 for p in policies), policies
    for key in ("learner_train_sec", "inference_sec"):  # each policy took its part of both processes' time
        assert all(p[key] > 0 for p in policies), policies
    for key in ("learner_share", "inference_share"):
        assert sum(p[key] for p in policies) == pytest.approx(1.0) and all(0.1 < p[key] < 0.9 for p in policies)
    from sf_engine.play.loading import load_experiment, load_policy
    from sf_engine.runtime.checkpoint import load_checkpoint

    cfg, spec, _ = load_experiment(str(tmp_path), "two")  # enjoy.py --policy 1 of the population's checkpoint
    path = sorted((tmp_path / "two" / "checkpoints").glob("*.pt"))[-1]
    saved = load_checkpoint(str(path), "cpu")["policies"][1]["model"]
    loaded = load_policy(cfg, spec, str(path), "cpu", policy=1).state_dict()
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)
    assert os.listdir(shm_dir) == []


def test_an_exploit_copies_weights_and_optimizer_state_and_explores_within_bounds(tmp_path, shm_dir):
    """A PBT round with three members whose objectives are set by hand: the worst takes the best's weights
    (normalizer statistics included) and optimizer state, its hyperparameters are the best's mutated
    within their ranges, and what it acted with its old weights is no longer trained on."""
    from sf_engine.algo.pbt import hyperparameters

    plan = serial_plan(
        tmp_path,
        shm_dir,
        "CartPole-v1",
        "--num_policies",
        "3",
        "--pbt",
        "--normalize_input",
        "true",
        "--pbt_mutation_rate",
        "1.0",
        "--pbt_replace_fraction",
        "0.34",
        "--num_envs_per_worker",
        "16",
        "--batch_size",
        "128",
    )
    harness = SerialRun(plan, tmp_path)
    try:
        learner = harness.learner
        for _ in range(3):
            learner.train_on(harness.full_slots(plan.cfg.slots_per_batch)[: plan.cfg.slots_per_batch])
        members = learner.policies
        assert not torch.equal(members[0].params, members[2].params)
        counts = harness.buffers.policy_episodes
        counts[0, :3] += np.array([[10, 100.0], [10, 500.0], [10, 2000.0]])  # objectives 10, 50, 200
        version = members[0].version
        learner.population._round()
        assert torch.equal(members[0].params, members[2].params)
        ours = members[0].algorithm.optimizer.state_dict()["state"][0]
        theirs = members[2].algorithm.optimizer.state_dict()["state"][0]
        assert torch.equal(ours["exp_avg"], theirs["exp_avg"]) and ours["exp_avg"] is not theirs["exp_avg"]
        ranges = plan.cfg.algorithm.pbt  # PPO's: its spec's, over the learner group's fields and its own
        hyper = hyperparameters(members[0].algorithm.cfg)
        assert set(hyper) == set(ranges) == {"learning_rate", "entropy_coeff", "gamma", "ppo_clip_ratio"}
        assert hyper != hyperparameters(members[2].algorithm.cfg)
        assert all(ranges[name].low <= value <= ranges[name].high for name, value in hyper.items()), hyper
        assert members[0].algorithm.cfg.ppo.entropy_coeff == hyper["entropy_coeff"]
        assert members[0].algorithm.optimizer.param_groups[0]["lr"] == hyper["learning_rate"]
        assert members[0].version == version + 1 and members[0].min_version == version + 1
        assert members[1].version == version  # the middle member is kept
        assert harness.buffers.param_seq[0] == 2 * (version + 1)  # the new weights are published
    finally:
        harness.close()


def test_the_opponent_pools_snapshots_are_frozen_and_never_trained(tmp_path, shm_dir):
    """Self-play on RelayGame with a pool snapshot every version (2 slots): each snapshot holds policy 0's
    weights of the version it was taken at, acts (the policy worker serves it) but is never handed to a
    learner, and no game is played by snapshots alone."""
    pytest.importorskip("pettingzoo")
    plan = serial_plan(
        tmp_path,
        shm_dir,
        "toy_multiagent:relay_game",
        "--pool_every_versions",
        "1",
        "--pool_size",
        "2",
        "--pool_share",
        "0.9",
        "--num_envs_per_worker",
        "16",
        "--batch_size",
        "128",
    )
    harness = SerialRun(plan, tmp_path)
    try:
        learner, population = harness.learner, harness.learner.population
        calls = _recorded_training(learner)
        taken = {}
        for _ in range(4):
            slots = harness.full_slots(plan.cfg.slots_per_batch)[: plan.cfg.slots_per_batch]
            ids = harness.buffers.policy_id[slots]
            games = ids.reshape(*ids.shape[:2], -1, 2)
            assert not (games >= 1).all(-1).any(), "a game played by snapshots alone"
            learner.train_on(slots)
            taken[learner.version] = learner.policies[0].params.clone()
        assert sorted(policy for policy, _, _ in calls) == [0] * 4
        assert (ids >= 1).any(), "no seat went to the pool"
        for slot, version in enumerate(population.snapshot_versions):
            assert torch.equal(population.snapshot_params[slot], taken[version])
            served = int(harness.policy.versions[1 + slot])  # the snapshot the policy worker acted with last
            if served > 0:
                assert torch.equal(harness.policy.params[1 + slot], taken[served])
    finally:
        harness.close()


def test_a_resumed_population_keeps_its_hyperparameters(tmp_path, shm_dir):
    args = [
        "--train_dir",
        str(tmp_path),
        "--shm_dir",
        shm_dir,
        "--experiment",
        "pbt",
        "--num_policies",
        "2",
        "--pbt",
        "--mode",
        "serial",
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--rollout",
        "16",
        "--batch_size",
        "64",
        "--num_batches_per_epoch",
        "2",
    ]
    assert run(build_plan(args + ["--train_for_env_steps", "2000"])) == 0
    saved = read_json(tmp_path / "pbt" / "summary.json")["pbt"]["hyperparameters"]
    assert saved[0] != saved[1]
    harness = SerialRun(build_plan(args + ["--train_for_env_steps", "4000"]), tmp_path)
    try:
        assert [m.algorithm.hyperparameters() for m in harness.learner.policies] == saved
    finally:
        harness.close()


def test_pbt_counts_the_true_objective_where_an_env_gives_one(tmp_path, shm_dir):
    """An env that reports a true_objective (10 x its return) at each episode's end: the rollout worker
    books that, not the return, for the policy that played the episode (PBT's ranking figure)."""
    plan = serial_plan(
        tmp_path,
        shm_dir,
        "toy_envs:ObjectiveChoiceEnv",
        "--num_policies",
        "2",
        "--pbt",
        "--num_envs_per_worker",
        "16",
        "--batch_size",
        "128",
    )
    harness = SerialRun(plan, tmp_path)
    try:
        harness.full_slots(4)
        books = harness.buffers.policy_episodes[0]
        returns = harness.worker.finished_returns
        assert books[:, 0].sum() == len(returns) > 0
        assert books[:, 1].sum() == pytest.approx(10.0 * sum(returns))
        by_policy = [sum(r for r, p in zip(returns, harness.worker.finished_policies) if p == q) for q in (0, 1)]
        assert books[:2, 1].tolist() == pytest.approx([10.0 * x for x in by_policy])
    finally:
        harness.close()


def test_several_recurrent_policies_each_train_on_their_own_sequences(tmp_path, shm_dir):
    """Two GRU policies: each re-runs its core over the sequences holding its own samples only, and both
    train."""
    plan = serial_plan(
        tmp_path,
        shm_dir,
        "CartPole-v1",
        "--num_policies",
        "2",
        "--rnn",
        "gru",
        "--rnn_size",
        "8",
        "--num_envs_per_worker",
        "16",
        "--batch_size",
        "128",
    )
    harness = SerialRun(plan, tmp_path)
    try:
        seen = []
        for learner in harness.learner.policies:
            original = learner.algorithm._ppo_epochs_recurrent

            def epochs(seq, _original=original, _policy=learner.policy):
                seen.append((_policy, seq.keep.shape[1], bool(seq.keep.any(0).all())))
                return _original(seq)

            learner.algorithm._ppo_epochs_recurrent = epochs
        harness.learner.train_on(harness.full_slots(plan.cfg.slots_per_batch)[: plan.cfg.slots_per_batch])
        assert [policy for policy, _, _ in seen] == [0, 1] and all(every for _, _, every in seen)
        assert [learner.version for learner in harness.learner.policies] == [1, 1]
    finally:
        harness.close()
