"""Sampler nodes as Ray actors on a local Ray instance (the `[ray]` extra; skipped without Ray): CartPole
learns from two actors' slots alone, each version's weights go out as one object that every actor
fetches, the actors hold the versions in order, and nothing is left running or in shared memory."""

import glob
import os

import numpy as np
import pytest
from conftest import SerialRun, receive, serial_plan

from sf_engine.stats.messages import Episodes

ray = pytest.importorskip("ray")


@pytest.mark.e2e  # starts a Ray instance (its processes) and trains to a return
def test_cartpole_learns_from_two_ray_sampler_actors(tmp_path, shm_dir):
    from sf_engine.scaleout.ray_samplers import publish_weights, remote_sampler_class

    head = SerialRun(serial_plan(tmp_path, shm_dir, "CartPole-v1", "--seed", "3"), tmp_path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        learner, count = head.learner.policies[0], head.cfg.slots_per_batch
        actors = [remote_sampler_class(num_cpus=1).remote(head.plan, i, "test", shm_dir) for i in range(2)]
        weights = publish_weights([(0, learner.params.numpy(), learner.version)])
        assert ray.get([actor.set_weights.remote(weights) for actor in actors]) == [0, 0]
        returns, held, seeds = [], [], []
        for _ in range(500):
            results = ray.get([actor.collect.remote(count // 2) for actor in actors])
            seeds.append([r["payloads"][0]["obs.obs"][0].tobytes() for r in results])
            for result in results:
                head.learner.train_on(receive(head, result["payloads"][:count]))
                returns += [r for m in result["messages"] if isinstance(m, Episodes) for r in m.returns]
            weights = publish_weights([(0, learner.params.numpy(), learner.version)])  # one object for both
            held.append(ray.get([actor.set_weights.remote(weights) for actor in actors]))
            if len(returns) > 20 and np.mean(returns[-20:]) > 150:
                break
        assert seeds[0][0] != seeds[0][1], "two actors stepped the same envs (same seeds)"
        assert all(h == [learner_version] * 2 for h, learner_version in zip(held, range(2, 2 * len(held) + 1, 2)))
        assert np.mean(returns[-20:]) > 150, f"no learning from the actors' slots: {np.mean(returns[-20:]):.1f}"
        ray.get([actor.close.remote() for actor in actors])
    finally:
        ray.shutdown()
        head.close()
    assert not glob.glob(os.path.join(shm_dir, "*sampler_node*")), "a node's shared memory was left behind"
