"""The `replay` and `q` groups of the configuration: the replay buffer, its rate limiter and how acting starts
(--algo dqn, r2d2, sac and td3), the value-based family's network, targets and exploration (--algo dqn, pqn and
r2d2; the target networks' pace: every algorithm with one). sf_engine.config.groups imports them into its GROUPS; the
command line and config.json read them like every group."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.fields import flag_field as _f


@dataclass(frozen=True)
class ReplayConfig:
    replay_size: int = _f(
        100_000,
        "Transitions the replay buffer holds (--algo dqn, r2d2, sac): allocated in shared memory at start, checked "
        "against the machine's memory; the oldest give way to the newest.",
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
    replay_sequence_length: int = _f(
        80,
        "--algo r2d2: steps of each replayed sequence (R2D2's 80); a trajectory slot's env column holds sequences "
        "from row --burn_in to the slot's end, starting at most L/2 rows apart (--burn_in, --burn_in + L/2, ... "
        "when that ends at the slot's end, else spread evenly): --rollout must be at least --burn_in + L.",
    )
    burn_in: int = _f(
        40,
        "--algo r2d2: steps before each sequence that only warm up the recurrent state from the one stored when "
        "they were acted (R2D2's 40), without gradient. The first --burn_in steps of each trajectory slot serve "
        "only as burn-in: a fraction burn_in / rollout of the env steps is never a training step.",
    )
    priority_eta: float = _f(
        0.9,
        "--algo r2d2 with --prioritized: a sequence's priority mixes its TD errors, eta x max + (1 - eta) x mean "
        "(R2D2's 0.9).",
    )
    random_before_learning: bool = _f(
        True,
        "--algo sac and td3: act uniformly at random within the action bounds until the learner publishes its first "
        "update (the first --learning_starts env steps), as Stable-Baselines3, RL Zoo and CleanRL do; false: the "
        "untrained actor's samples. A resumed run acts with its checkpoint's actor.",
    )


@dataclass(frozen=True)
class QConfig:
    double_q: bool = _f(
        True, "Double Q-learning: the online network picks the next action, the target network values it."
    )
    dueling: bool = _f(False, "Dueling heads: Q = V + A - mean(A), a value stream and an advantage stream.")
    layer_norm: bool = _f(
        False,
        "Layer normalization after each hidden layer of the Q-network: each convolution and linear layer of a "
        "built-in encoder, before its nonlinearity (a user's --encoder is used as it is). PQN's: what lets it learn "
        "without a target network; on by default with --algo pqn, and with --algo dqn on classic control, where it "
        "solves CartPole sooner and more steadily.",
    )
    huber_delta: float = _f(
        1.0,
        "--algo dqn, r2d2: the Huber loss is quadratic for TD errors below this and linear above (its gradient clipped "
        "at it): 1 where rewards are clipped (Atari); a large one is the squared error.",
    )
    target_update_period: int = _f(
        500,
        "--algo dqn, r2d2, sac: learner updates between target-network updates (a copy, or a Polyak step with "
        "--target_tau < 1; SAC's target critics).",
    )
    target_tau: float = _f(
        1.0, "--algo dqn, r2d2, sac: the target network moves this far to the online one at each target update."
    )
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
    value_rescale: bool = _f(
        False,
        "--algo r2d2 (on by default there): learn h(Q) with R2D2's value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) "
        "+ 0.001 x, the targets h(R + gamma^n h^-1(Q')), so that large returns keep a small scale.",
    )
