"""A sampler node (sf_engine.scaleout.sampler_node) feeding another run's learner through packed slots, with no
rollout worker of the learner's own in the loop: the learner's weights reach the node whole and in
version order, every step it samples carries the version it was acted with, and CartPole learns from
those slots alone."""

import numpy as np
import pytest
from conftest import SerialRun, receive, serial_plan

from sf_engine.scaleout.sampler_node import SamplerNode
from sf_engine.stats.messages import Episodes


def test_cartpole_learns_from_a_sampler_nodes_slots_alone(tmp_path, shm_dir):
    head = SerialRun(serial_plan(tmp_path, shm_dir, "CartPole-v1", "--seed", "3"), tmp_path)
    node = SamplerNode(head.plan, str(tmp_path / "node_segment"))
    try:
        learner, count = head.learner.policies[0], head.cfg.slots_per_batch
        with pytest.raises(RuntimeError, match="set_weights"):
            node.collect(1)
        node.set_weights(0, learner.params.numpy(), learner.version)
        returns, published = [], [learner.version]
        for _ in range(1000):
            payloads, messages = node.collect(count)
            versions = np.concatenate([p["policy_version"].ravel() for p in payloads])
            assert set(versions.tolist()) <= set(published[-2:]), "a step tagged with a version never sent"
            head.learner.train_on(receive(head, payloads[:count]))
            node.set_weights(0, learner.params.numpy(), learner.version)
            published.append(learner.version)
            assert np.array_equal(node.weights[0].shared.numpy(), learner.params.numpy())
            returns += [r for m in messages if isinstance(m, Episodes) for r in m.returns]
            if len(returns) > 20 and np.mean(returns[-20:]) > 150:
                break
        assert published == list(range(published[-1] + 1))
        assert np.mean(returns[-20:]) > 150, f"no learning from the node's slots: {np.mean(returns[-20:]):.1f}"
        assert np.mean(returns[:20]) < 60
        with pytest.raises(ValueError, match="another model"):
            node.set_weights(0, np.zeros(3, np.float32), published[-1] + 1)
    finally:
        node.close()
        head.close()
    assert not (tmp_path / "node_segment").exists()
