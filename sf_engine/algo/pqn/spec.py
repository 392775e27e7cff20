"""What the engine knows of PQN: its spec (sf_engine.config.algorithms); the q group holds its flags."""

from __future__ import annotations

from sf_engine.algo.dqn.spec import INHERITED
from sf_engine.config.algorithms import SLOTS, AlgorithmSpec

SPEC = AlgorithmSpec(
    learner="sf_engine.algo.pqn.learning:PQN",
    description="PQN: Q(lambda) targets on each batch of trajectory slots, layer norm, no replay and no target network",
    data=SLOTS,
    data_parallel=True,
    actions=("discrete",),
    multi_agent=False,
    several_policies=False,
    recurrent="never",
    normalize_input=False,
    defaults={
        # CleanRL's pqn.py and pqn_atari_envpool.py
        **INHERITED,
        "doom": INHERITED["doom"] | {"adam_eps": 1e-6},
        None: {
            "layer_norm": True,
            "activation": "relu",
            "max_grad_norm": 10.0,
            "epsilon_start": 1.0,
            "epsilon_end": 0.05,
            "apex_alpha": 0.0,
            "num_epochs": 4,
            "num_batches_per_epoch": 4,
        },
        "classic": {"hidden_size": 128, "learning_rate": 2.5e-4, "epsilon_decay_env_steps": 250_000},
        "atari": {
            "encoder": "nature_cnn",
            "learning_rate": 2.5e-4,
            "rollout": 32,
            "batch_size": 1024,
            "epsilon_end": 0.01,
            "epsilon_decay_env_steps": 1_000_000,
            "learner_threads": 2,
        },
    },
)
