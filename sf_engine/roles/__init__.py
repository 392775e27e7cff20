"""One class per process role: rollout worker, policy worker, learner, evaluator (and the learner's population)."""
