"""The `replay` and `q` groups of the configuration: the replay buffer and its rate limiter (--algo dqn), and the
value-based family's network, targets and exploration (--algo dqn and --algo pqn). sf_engine.config.groups
imports them into its GROUPS; the command line and config.json read them like every group."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.fields import flag_field as _f

REPLAY_ALGORITHMS = frozenset({"dqn"})  # learn from a replay buffer (sf_engine.replay) rather than from slots
Q_ALGORITHMS = frozenset({"dqn", "pqn"})  # act epsilon-greedy on Q-values (sf_engine.model.q_network)


@dataclass(frozen=True)
class ReplayConfig:
    replay_size: int = _f(
        100_000,
        "Transitions the replay buffer holds (--algo dqn): allocated in shared memory at start, checked against "
        "the machine's memory; the oldest give way to the newest.",
    )
    replay_ratio: float = _f(
        8.0,
        "Samples trained per env step inserted into the replay buffer, held by a rate limiter: when learning "
        "runs ahead it waits for data, when sampling runs ahead the rollout workers wait for the learner "
        "(the status line and the bottleneck report say which). 8 = a batch of 32 every 4 env steps (Nature "
        "DQN's).",
    )
    learning_starts: int = _f(10_000, "Env steps inserted into the replay buffer before the first update.")
    n_step: int = _f(
        3,
        "Steps of the n-step returns of each transition (Ape-X's 3): the rewards of up to n steps, then the "
        "discounted value of the observation after them; a window stops at an episode's end and at its "
        "trajectory slot's end (then fewer steps).",
    )
    prioritized: bool = _f(
        False,
        "Prioritized replay (proportional, Schaul et al. 2016): transitions sampled in proportion to their last "
        "TD error ** --per_alpha, new ones at the running maximum priority, importance weights ** --per_beta.",
    )
    per_alpha: float = _f(0.6, "Prioritized replay: how much the TD error shapes sampling (0: uniform).")
    per_beta: float = _f(
        0.4,
        "Prioritized replay: the importance-weight exponent at the start, annealed linearly to 1 over the run's "
        "budget (1 corrects the sampling bias fully).",
    )
    save_replay: bool = _f(
        False,
        "Write the replay buffer beside each checkpoint (atomically; as large as the buffer's memory) so that a "
        "resumed run refills from it; without it a resumed run refills from scratch (--learning_starts env "
        "steps before it trains again).",
    )


@dataclass(frozen=True)
class QConfig:
    double_q: bool = _f(
        True, "Double Q-learning: the online network picks the next action, the target network values it."
    )
    dueling: bool = _f(False, "Dueling heads: Q = V + A - mean(A), a value stream and an advantage stream.")
    layer_norm: bool = _f(
        False,
        "Layer normalization after each hidden layer of the Q-network (PQN's: what lets it learn without a "
        "target network; on by default with --algo pqn).",
    )
    huber_delta: float = _f(
        1.0,
        "--algo dqn: the Huber loss is quadratic for TD errors below this and linear above (its gradient clipped "
        "at it): 1 where rewards are clipped (Atari); a large one is the squared error.",
    )
    target_update_period: int = _f(
        500,
        "--algo dqn: learner updates between target-network updates (a copy, or a Polyak step with --target_tau < 1).",
    )
    target_tau: float = _f(1.0, "--algo dqn: the target network moves this far to the online one at each update.")
    epsilon_start: float = _f(
        0.4,
        "Epsilon-greedy exploration: the base epsilon at the start, decayed linearly to --epsilon_end over "
        "--epsilon_decay_env_steps; env row i of the run's N acts with base ** (1 + --apex_alpha * i / (N - 1)).",
    )
    epsilon_end: float = _f(0.4, "The base epsilon after --epsilon_decay_env_steps.")
    epsilon_decay_env_steps: int = _f(1_000_000, "Env steps over which the base epsilon decays.")
    apex_alpha: float = _f(
        7.0,
        "Ape-X exploration: each env row acts with its own epsilon, base ** (1 + alpha * i / (N - 1)), so some "
        "rows explore and some exploit (Ape-X: base 0.4, alpha 7); 0: every row at the base epsilon.",
    )
    q_lambda: float = _f(0.65, "--algo pqn: the lambda of its Q(lambda) targets over each trajectory slot.")
