"""The typed configuration: one frozen dataclass per group of flags, each field with its --help text, and
the Config that holds them. The command line is built from these groups (sf_engine.config.cli) and
checked (sf_engine.config.checks) in the main process; the run plan carries the resolved Config to
every role, and each role reads only its own group (`cfg.sampler`, `cfg.learner`, ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from sf_engine.config.algorithms import AlgorithmSpec, algorithm_names, algorithm_spec, built_in_algorithms
from sf_engine.config.env import EnvConfig
from sf_engine.config.fields import ConfigError, current_name, int_or_auto
from sf_engine.config.fields import flag_field as _f
from sf_engine.config.parallel import ParallelConfig
from sf_engine.config.policies import PolicyConfig
from sf_engine.config.remote import RemoteConfig
from sf_engine.config.run import DEFAULT_ENV_STEPS, DEFAULT_SECONDS, RunConfig
from sf_engine.config.tracking import TrackingConfig
from sf_engine.config.value import QConfig, ReplayConfig

ROLLOUT_DEFAULT, ROLLOUT_SHORT = 32, 16  # --rollout auto (sf_engine.run.autosize.choose_rollout)

__all__ = ["DEFAULT_ENV_STEPS", "DEFAULT_SECONDS", "ConfigError", "RunConfig"]  # importable from here too


@dataclass(frozen=True)
class SamplerConfig:
    num_workers: int | str = _f(
        "auto",
        "Rollout-worker processes, each stepping its own batch of envs on one CPU core; 'auto': sized at start from "
        "the cores and a short measurement of env step, inference and training costs (the choice is printed).",
        type=int_or_auto,
    )
    num_envs_per_worker: int | str = _f(
        "auto",
        "Envs owned by each rollout worker (stepped as one batch per split); 'auto': enough that one split's step "
        "amortizes the round trip to the policy worker, at least the env family's default.",
        type=int_or_auto,
    )
    worker_num_splits: int = _f(
        2,
        "Groups each worker splits its envs into: it steps one group while the "
        "other waits for actions (2 = double-buffered sampling).",
    )
    rollout: int | str = _f(
        "auto",
        "Env steps per trajectory slot (the unit handed to the learner); 'auto': 32, or "
        "16 for a feed-forward policy on an env so cheap to step that even the widest "
        "split whole slots per training batch allow at 32 steps in under a quarter of "
        "auto sizing's target: splits twice as wide halve the policy worker's costs "
        "per sample (with --num_envs_per_worker auto).",
        type=int_or_auto,
    )

    @property
    def envs_per_split(self) -> int:
        return self.num_envs_per_worker // self.worker_num_splits

    @property
    def total_splits(self) -> int:
        return self.num_workers * self.worker_num_splits


@dataclass(frozen=True)
class ModelConfig:
    encoder: str = _f(
        "auto",
        "Observations to features, before the cores and heads: 'nature_cnn', 'impala_cnn', 'convnet_simple' (CNNs "
        "for images; an MLP for vectors), 'mlp' (images too), 'auto' (Nature CNN); yours: MODULE:CALLABLE or a "
        "register_encoder name, factory(observation_space) -> torch.nn.Module, a batch (tensor or dict) -> [B, F].",
    )
    hidden_size: int = _f(64, "Width of the MLP layers for vector observations (the CNNs end in 512 units).")
    mlp_layers: int = _f(2, "Hidden layers of the MLP for vector observations.")
    activation: str = _f("tanh", "Nonlinearity of the MLP layers.", choices=("tanh", "relu"))
    weight_init: str = _f(
        "scaled",
        "Orthogonal weight init: 'scaled' (gain sqrt(2) in hidden layers, 0.01 on the policy head, 1 on the value "
        "head; its former name 'ppo' is read as it) or 'unit' (gain 1 everywhere, Sample Factory's).",
        choices=("scaled", "unit"),
        renamed={"ppo": "scaled"},
    )
    actor_critic: str = _f(
        "auto",
        "'shared': one encoder (and core) feeds the policy and value heads; 'separate': the actor and the critic each "
        "have their own; 'auto': shared with --rnn or image observations, separate otherwise.",
        choices=("auto", "shared", "separate"),
    )
    normalize_input: bool = _f(
        False,
        "Normalize observations by running mean/std (kept by the learner, used by "
        "the policy worker, saved in checkpoints): vectors per entry, images per pixel "
        "and channel after scaling to [0, 1] (without it, images are only scaled).",
    )
    normalize_returns: bool = _f(False, "Scale value targets by running return statistics (value normalization).")
    rnn: str = _f(
        "none",
        "Recurrent core after the encoder: 'gru', 'lstm', or 'none' (feed-forward). Its hidden "
        "state lives in shared memory per env and is reset at episode boundaries.",
        choices=("none", "gru", "lstm"),
    )
    rnn_size: int | str = _f(
        "auto", "Units of the recurrent core; 'auto': 256 with image observations, 64 otherwise.", type=int_or_auto
    )
    model: Optional[str] = _f(
        None,
        "Your whole network in place of the encoder and heads (PPO): MODULE:CLASS, found like --env MODULE:Class; "
        "Class(observation_space, action_space) -> torch.nn.Module, forward(obs) -> (distribution parameters "
        "[B, P], values [B]); feed-forward (docs/api.md, your own network).",
    )

    def __post_init__(self):
        """A choice by its former name (a saved config.json's, a checkpoint's) is read as the name it has now."""
        for fld in dataclasses.fields(self):
            object.__setattr__(self, fld.name, current_name(fld, getattr(self, fld.name)))


@dataclass(frozen=True)
class LearnerConfig:
    algo: str = _f(
        "ppo",
        "Learning algorithm of the learner: "
        + "; ".join(f"'{name}' ({spec.description})" for name, spec in built_in_algorithms().items())
        + "; or a name given to sf_engine.register_algorithm, or MODULE:SPEC (an AlgorithmSpec in your module, "
        "found like --env MODULE:Class).",
    )
    batch_size: int = _f(1024, "Samples per minibatch (one optimizer step).")
    num_batches_per_epoch: int = _f(
        4,
        "Minibatches per training iteration; the learner trains on "
        "batch_size x num_batches_per_epoch samples at a time.",
    )
    num_epochs: int = _f(2, "Passes over each training batch (sample reuse).")
    learning_rate: float = _f(3e-3, "Adam learning rate.")
    adam_eps: float = _f(
        1e-5,
        "Adam's epsilon (added to the root of the second moment): smaller lets parameters "
        "with small gradients (a CNN's large linear layer) move faster.",
    )
    lr_schedule: str = _f(
        "constant",
        "'constant', or 'linear' decay to 0 over the run's budgets: by the larger part used of those that apply "
        "(env steps of --train_for_env_steps, seconds of this run of --train_for_seconds), so the rate reaches "
        "0 at the first budget reached; with only a time budget a resumed run decays anew over its own time.",
        choices=("constant", "linear"),
    )
    lr_end: float = _f(
        0.0,
        "--lr_schedule linear: the learning rate it decays to (by --lr_decay_env_steps, or at the first budget "
        "reached), then keeps.",
    )
    lr_decay_env_steps: int = _f(
        0,
        "--lr_schedule linear: env steps over which the rate decays from --learning_rate to --lr_end; 0: over the "
        "run's budgets (see --lr_schedule).",
    )
    gamma: float = _f(0.99, "Discount factor.")
    max_grad_norm: float = _f(0.5, "Gradient-norm clipping (0 disables it).")
    max_policy_lag: int = _f(
        100,
        "Drop samples more than this many policy versions older than the learner "
        "(they are counted in train/samples_dropped_lag); not with a replay buffer (--algo dqn), whose "
        "transitions are meant to be reused long after they were acted (their age is reported instead).",
    )
    max_bad_updates: int = _f(
        100,
        "Stop the run once this many optimizer updates in a row had a non-finite loss or gradient (each is "
        "skipped: no step) or left weights with a non-finite value (undone: such weights are never published "
        "or saved). Training has diverged then: NaN or inf in the env's observations or rewards, or too high "
        "a --learning_rate, are the usual causes.",
    )
    learner_threads: int = _f(1, "Torch threads in the learner (keep threads x busy processes <= cores).")
    recurrence: int | str = _f(
        "auto",
        "With --rnn: length of the sequences trained with truncated BPTT (the core is "
        "re-run from the stored state at each sequence start); must divide "
        "--rollout; 'auto': the rollout length.",
        type=int_or_auto,
    )


# the groups of every run; an algorithm's own group (its spec's `config`: SAC's, TD3's, a user's) is a run's only
# where that algorithm learns (Config.algo_group, read as cfg.<its name>)
GROUPS = {
    "env": EnvConfig,
    "sampler": SamplerConfig,
    "model": ModelConfig,
    "learner": LearnerConfig,
    "run": RunConfig,
    "tracking": TrackingConfig,
    "policies": PolicyConfig,
    "remote": RemoteConfig,
    "parallel": ParallelConfig,
    "replay": ReplayConfig,
    "q": QConfig,
}


def flag_groups(algo: str | None = None) -> dict:
    """name -> group class of every flag a command line with `--algo algo` takes: every run's (GROUPS), `algo`'s
    own (a ConfigError of one line where `algo` names none), then each other built-in algorithm's (so that --help
    lists them all, and a flag of another algorithm's group is named as such). Two algorithms' groups may share a
    flag name (--policy_delay: TD3's and CrossQ's); an algorithm's group may not redefine a flag of every run."""
    own = algorithm_spec(algo).config if algo else ()
    if own and set(_fields(own[1])) & {name for cls in GROUPS.values() for name in _fields(cls)}:
        clash = sorted(set(_fields(own[1])) & {name for cls in GROUPS.values() for name in _fields(cls)})
        raise ConfigError(f"--algo {algo}: its group {own[0]} redefines --{clash[0]}, a flag of every run: rename it")
    others = {spec.config[0]: spec.config[1] for spec in built_in_algorithms().values() if spec.config}
    return GROUPS | dict([own] if own else []) | {name: cls for name, cls in others.items() if name not in GROUPS}


def _fields(cls) -> list:
    return [fld.name for fld in dataclasses.fields(cls)]


def flag_owners(flag: str) -> list:
    """The algorithms (built in or registered) whose own group has the flag `flag`."""
    return [name for name in algorithm_names() if (own := algorithm_spec(name).config) and flag in _fields(own[1])]


def algorithm_group_owners(group_name: str) -> list:
    """The algorithms (built in or registered) whose own group is `group_name`."""
    return [name for name in algorithm_names() if algorithm_spec(name).config[:1] == (group_name,)]


class _ConfigMethods:
    """What Config computes from its groups (Config, below, has one field per group of GROUPS, and `algo_group`:
    the algorithm's own group of flags, the instance of its spec's `config` class, or None)."""

    def __post_init__(self):
        """The algorithm's own group: its defaults where none is given; one of another class is refused."""
        own = self.algorithm.config
        if not own and self.algo_group is not None:
            raise ConfigError(f"--algo {self.learner.algo} has no group of its own flags; got {self.algo_group!r}")
        if own and self.algo_group is None:
            object.__setattr__(self, "algo_group", own[1]())
        elif own and not isinstance(self.algo_group, own[1]):
            raise ConfigError(f"--algo {self.learner.algo}'s flags are a {own[1].__name__}, not {self.algo_group!r}")

    def __getattr__(self, name: str):
        """cfg.<name> of the algorithm's own group (cfg.sac with --algo sac); only names that are no field get here."""
        fields = self.__dict__
        if not name.startswith("__") and "learner" in fields and fields.get("algo_group") is not None:
            if self.algorithm.config[0] == name:
                return fields["algo_group"]
        raise AttributeError(
            f"the config of --algo {fields['learner'].algo if 'learner' in fields else '?'} has no group {name!r}"
        )

    def groups(self) -> dict:
        """name -> group instance of every group of this run: GROUPS', then the algorithm's own."""
        own = self.algorithm.config
        return {name: getattr(self, name) for name in GROUPS} | ({own[0]: self.algo_group} if own else {})

    @property
    def algorithm(self) -> AlgorithmSpec:
        """The spec of --algo (sf_engine.config.algorithms): all the engine knows of the learning algorithm."""
        return algorithm_spec(self.learner.algo)

    @property
    def uses_replay(self) -> bool:
        """The learner trains from the replay buffer (sf_engine.replay), not on the slots as they come."""
        return self.algorithm.uses_replay

    @property
    def samples_per_slot(self) -> int:
        return self.sampler.rollout * self.sampler.envs_per_split

    @property
    def slots_per_batch(self) -> int:
        """Slots the learner takes at a time: a training batch's, or with a replay buffer one round of every
        split in sync mode (the learner inserts them, trains, then frees them) and one at a time otherwise (one for
        each of --num_learners ranks: every rank takes its share)."""
        if self.uses_replay:
            return self.sampler.total_splits if self.run.mode == "sync" else self.parallel.num_learners
        return self.train_batch // self.samples_per_slot

    @property
    def minibatch(self) -> int:
        """Samples of one optimizer step over every learner rank: --batch_size, or with --batch_per_learner each
        rank's (--num_learners times as many; --num_learners auto, until resolved: as one)."""
        p = self.parallel
        ranks = p.num_learners if p.batch_per_learner and p.num_learners != "auto" else 1
        return self.learner.batch_size * ranks

    @property
    def train_batch(self) -> int:
        """Samples the learner (every rank together) trains on at a time: minibatch x --num_batches_per_epoch."""
        return self.minibatch * self.learner.num_batches_per_epoch

    @property
    def num_slots(self) -> int:
        """Trajectory slots in the pool. Sync: exactly one batch, so no slot is filled by a stale policy.
        Async: every split fills one (a sampler actor's splits: one each for the slots it sends) while
        the learner trains on one batch and the next one queues."""
        if self.run.mode == "sync":
            return self.slots_per_batch
        remote = self.remote.num_remote_samplers
        remote_splits = remote * self.remote.remote_num_workers * self.sampler.worker_num_splits if remote else 0
        return self.sampler.total_splits + remote_splits + 2 * self.slots_per_batch

    def to_dict(self) -> dict:
        """{group name: {field: value}} of every group of this run (config.json's settings)."""
        return {name: dataclasses.asdict(group) for name, group in self.groups().items()}

    @classmethod
    def from_dict(cls, data: dict):
        """From to_dict()'s shape (config.json: other top-level keys, such as the command line, are ignored, and so
        are the groups of algorithms other than its --algo's, which configs of earlier versions hold)."""
        groups = {name: GROUPS[name](**data.get(name, {})) for name in GROUPS}
        own = algorithm_spec(groups["learner"].algo).config
        return cls(**groups, algo_group=own[1](**data.get(own[0], {})) if own else None)


Config = dataclasses.make_dataclass(
    "Config",
    [(name, group, field(default_factory=group)) for name, group in GROUPS.items()]
    + [("algo_group", Optional[object], field(default=None))],
    bases=(_ConfigMethods,),
    frozen=True,
)
Config.__module__ = __name__  # pickled by name: the plan travels to the children
Config.__doc__ = """The whole configuration: one field per group of GROUPS (cfg.env, ..., cfg.q), and the algorithm's
own group (`algo_group`, read as cfg.sac with --algo sac)."""
