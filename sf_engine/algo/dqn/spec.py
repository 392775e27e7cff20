"""What the engine knows of DQN: its spec (sf_engine.config.algorithms); the replay and q groups hold its flags."""

from __future__ import annotations

from sf_engine.config.algorithms import TRANSITIONS, AlgorithmSpec

# the settings the value-based algorithms train the image, Box2D and Doom families and CartPoleNoVel-v1 with, as they
# were when those families' defaults were PPO's (untuned for them: a family's own facts lie under them)
INHERITED = {
    "image": {"learning_rate": 2.5e-4, "rollout": 128, "learner_threads": 2},
    "box2d": {"learning_rate": 3e-4, "rollout": 64},
    "doom": {"learning_rate": 1e-4, "rollout": 32, "weight_init": "unit", "learner_threads": 2},
    "CartPoleNoVel-v1": {"gamma": 0.98},
}


def bootstrap_forwards(cfg) -> int:
    """The targets' forwards per trained sample: the target network, and the online one with double Q."""
    return 1 + cfg.q.double_q


SPEC = AlgorithmSpec(
    learner="sf_engine.algo.dqn.learning:DQN",
    description="the DQN family on a shared-memory replay buffer: double Q, dueling heads, n-step returns, "
    "prioritized replay, Ape-X exploration; see the replay and q groups",
    data=TRANSITIONS,
    data_parallel=True,
    actions=("discrete",),
    multi_agent=False,
    several_policies=False,
    recurrent="never",
    normalize_input=False,
    bootstrap_forwards=bootstrap_forwards,
    defaults={
        **INHERITED,
        None: {"max_grad_norm": 10.0, "adam_eps": 1e-5},
        # tuned for CartPole's greedy 475 from launch (docs/value-based.md#figures): a small network makes about
        # twice the updates per second of a 256-wide one; with layer norm, a 2e-3 step and a target copied every
        # 100 updates 17 of 20 runs got there within 12 s (11 by the first evaluation, 5 s into training), against
        # 1 of 5 with 256 units, 1e-3 and 250. The step then decays to 1e-4 by 500,000 env steps: a solved CartPole
        # stays solved in 78% of the evaluations of the next 3 minutes, against 40% at a constant 2e-3; with a Huber
        # threshold of 10 (the squared error for CartPole's TD errors, a pole's fall included) in 86%, and with
        # prioritized replay (the rare transitions near a fall sampled by their TD errors) in 93%
        # (docs/value-based.md#holding-what-it-reached)
        "classic": {
            "hidden_size": 64,
            "activation": "relu",
            "learning_rate": 2e-3,
            "lr_schedule": "linear",
            "lr_end": 1e-4,
            "lr_decay_env_steps": 500_000,
            "batch_size": 128,
            "replay_size": 100_000,
            "learning_starts": 1_000,
            "replay_ratio": 8.0,
            "target_update_period": 100,
            "num_envs_per_worker": 16,
            "rollout": 16,
            "layer_norm": True,
            "huber_delta": 10.0,
            "prioritized": True,
        },
        # Ape-X on Atari: Nature DQN's network and step sizes, and a replay ratio in Ape-X's regime (its actors
        # outpace its learner: far fewer samples trained per env step than Nature DQN's 8); --replay_ratio 8 is
        # Nature DQN's, at an eighth of the env steps per second where learning is the slower side (a CPU learner)
        "atari": {
            "encoder": "nature_cnn",
            "learning_rate": 1e-4,
            "adam_eps": 1.5e-4,
            "batch_size": 32,
            "replay_size": 200_000,
            "learning_starts": 20_000,
            "replay_ratio": 1.0,
            "target_update_period": 2_000,
            "num_envs_per_worker": 16,
            "rollout": 32,
            "learner_threads": 2,
        },
    },
)
