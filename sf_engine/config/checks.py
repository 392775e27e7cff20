"""The configuration's checks: `check_flags` rejects bad values before anything is measured,
`check_resolved` bad combinations once every 'auto' is resolved (see sf_engine.run.plan). Each raises
a ConfigError with one line naming the flag and the fix. Runs in the main process."""

from __future__ import annotations

import dataclasses
import math
import re

from sf_engine.config.algorithms import algorithm_spec, built_in_algorithms, check_algorithm_flags, import_class
from sf_engine.config.groups import ROLLOUT_DEFAULT, Config, ConfigError

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def _check_sampler_nodes(cfg: Config) -> None:
    """The remote group's flags, and --num_workers 0 only where sampler nodes sample."""
    try:
        cfg.remote.check(cfg.run.mode, cfg.policies.pbt)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    policies = cfg.policies
    if cfg.remote.num_remote_samplers and (policies.league or policies.opponent_sampling != "uniform"):
        flag = "--league" if policies.league else "--opponent_sampling"
        raise ConfigError(
            f"{flag}: the games of sampler nodes are not counted here, so who plays whom cannot follow them; drop "
            f"{flag} or --num_remote_samplers"
        )
    workers = cfg.sampler.num_workers
    if workers != "auto" and workers < (0 if cfg.remote.num_remote_samplers else 1):
        raise ConfigError(
            f"--num_workers must be at least 1 (got {workers}); 0 only with "
            f"--num_remote_samplers, where sampler nodes do all the sampling"
        )


def check_flags(cfg: Config) -> None:
    """Values that are wrong whatever 'auto' resolves to: a one-line ConfigError naming the flag."""
    algorithm_spec(cfg.learner.algo)  # an --algo that names none
    _check_counts(cfg)
    _check_sampler_nodes(cfg)
    check_learner_ranks(cfg)
    _check_learner_values(cfg)
    _check_rollout(cfg)
    _check_run(cfg)
    _check_value_based(cfg)


def _refuse_first(flag: str, refused: list, fix: str = "") -> None:
    """The first of `refused`, (applies, why) pairs, that applies: a ConfigError of one line, '<flag>: <why><fix>'."""
    why = next((why for applies, why in refused if applies), None)
    if why:
        raise ConfigError(f"{flag}: {why}{fix}")


def _check_policy_workers(cfg: Config) -> None:
    """--num_policy_workers N > 1 (resolved): what several policy workers do not run, the alternative named."""
    workers, run = cfg.parallel.num_policy_workers, cfg.run
    if workers == 1:
        return
    refused = [
        (run.mode == "serial", "--mode serial runs every role in one process: use --mode async or sync"),
        (cfg.env.env_backend == "device", "a device env is sampled by device samplers, without policy workers"),
        (run.deterministic, "--deterministic true: one policy worker takes every split's request in order"),
        (
            workers > cfg.sampler.num_workers,
            f"each serves at least one of the --num_workers {cfg.sampler.num_workers} rollout workers",
        ),
    ]
    _refuse_first(f"--num_policy_workers {workers}", refused, "; use --num_policy_workers 1")


def check_learner_ranks(cfg: Config) -> None:
    """--num_learners: its value, and what several ranks of one policy's learner do not run (the alternative named)."""
    try:
        cfg.parallel.check()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    ranks, run, groups = cfg.parallel.num_learners, cfg.run, cfg.parallel.dist_world
    if ranks == "auto" or ranks * groups == 1:  # auto: resolved where the GPUs are known (run.per_gpu), checked there
        return
    flag = f"--num_learners {ranks}" if ranks > 1 else f"--dist_world {groups}"
    if not cfg.algorithm.data_parallel:
        built = ", ".join(sorted(name for name, spec in built_in_algorithms().items() if spec.data_parallel))
        raise ConfigError(
            f"{flag}: --algo {cfg.learner.algo} does not average its gradients over learner ranks (data-parallel "
            f"learning is built for {built}); use --num_learners 1"
        )
    learner = cfg.algorithm.learner
    if not hasattr(import_class(learner), "join_ranks"):
        raise ConfigError(
            f"{flag}: {learner} has no join_ranks(group), where a data-parallel algorithm averages its gradients over "
            f"the ranks (docs/api.md); use --num_learners 1"
        )
    refused = [
        (run.mode == "serial", "--mode serial runs every role in one process: use --mode async or sync"),
        (run.sampling_only, "--sampling_only true trains nothing: drop --num_learners"),
        (run.deterministic, "--deterministic true: the ranks take their slots as they come; drop one of them"),
        (cfg.policies.num_policies > 1, "--num_policies > 1: the ranks train one policy; use --num_learners 1"),
        (cfg.policies.pbt, "--pbt: the ranks train one policy; use --num_learners 1"),
        (
            cfg.uses_replay and cfg.replay.save_replay,
            "--save_replay: each rank's replay buffer is its own and is not saved; drop --save_replay",
        ),
        (
            cfg.policies.pool_every_versions > 0,
            "--pool_every_versions: the opponent pool is not built for ranks; use --num_learners 1",
        ),
    ]
    _refuse_first(flag, refused)
    timeout, stuck = cfg.parallel.collective_timeout_sec, run.stuck_timeout_sec
    if timeout >= stuck:
        raise ConfigError(
            f"{flag}: --collective_timeout_sec ({timeout:g}) must be below --stuck_timeout_sec ({stuck:g}): a rank "
            f"waiting in a collective does not beat"
        )


def _check_counts(cfg: Config) -> None:
    """Finite floats everywhere; counts of at least 1."""
    s, lrn, run, model = cfg.sampler, cfg.learner, cfg.run, cfg.model
    positive = {
        "--worker_num_splits": s.worker_num_splits,
        "--batch_size": lrn.batch_size,
        "--num_batches_per_epoch": lrn.num_batches_per_epoch,
        "--num_epochs": lrn.num_epochs,
        "--max_bad_updates": lrn.max_bad_updates,
        "--keep_checkpoints": run.keep_checkpoints,
        "--learner_threads": lrn.learner_threads,
        "--hidden_size": model.hidden_size,
        "--mlp_layers": model.mlp_layers,
        "--eval_episodes": run.eval_episodes,
        "--eval_max_steps": run.eval_max_steps,
        "--num_envs_per_worker": s.num_envs_per_worker,
        "--rnn_size": model.rnn_size,
        "--recurrence": lrn.recurrence,
        "--num_policies": cfg.policies.num_policies,
        "--replay_size": cfg.replay.replay_size,
        "--n_step": cfg.replay.n_step,
        "--replay_sequence_length": cfg.replay.replay_sequence_length,
        "--target_update_period": cfg.q.target_update_period,
        "--epsilon_decay_env_steps": cfg.q.epsilon_decay_env_steps,
    }
    for group in cfg.groups().values():  # the algorithm's own group too
        for fld in dataclasses.fields(group):
            value = getattr(group, fld.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{fld.name} must be a finite number (got {value})")
    for flag, value in positive.items():
        if value != "auto" and value < 1:
            raise ConfigError(f"{flag} must be at least 1 (got {value})")


def _check_learner_values(cfg: Config) -> None:
    """Rates, ratios and periods that must be positive, weights that must not be negative."""
    lrn, run = cfg.learner, cfg.run
    for flag, value in {
        "--save_every_sec": run.save_every_sec,
        "--learning_rate": lrn.learning_rate,
        "--adam_eps": lrn.adam_eps,
        "--status_every_sec": run.status_every_sec,
        "--replay_ratio": cfg.replay.replay_ratio,
        "--huber_delta": cfg.q.huber_delta,
    }.items():
        if value <= 0:
            raise ConfigError(f"{flag} must be positive (got {value})")
    for flag, value in {
        "--max_grad_norm": lrn.max_grad_norm,
        "--learning_starts": cfg.replay.learning_starts,
        "--per_alpha": cfg.replay.per_alpha,
        "--burn_in": cfg.replay.burn_in,
        "--lr_end": lrn.lr_end,
        "--lr_decay_env_steps": lrn.lr_decay_env_steps,
    }.items():
        if value < 0:
            raise ConfigError(f"{flag} must be >= 0 (got {value})")


def _check_rollout(cfg: Config) -> None:
    """The rollout and BPTT lengths against the training batch (with a replay buffer, any batch)."""
    s, lrn = cfg.sampler, cfg.learner
    train_batch = cfg.train_batch
    if s.rollout != "auto":
        if s.rollout < 2:
            raise ConfigError(f"--rollout must be at least 2 (got {s.rollout}): use e.g. --rollout 32")
        if cfg.uses_replay:
            return
        if train_batch % s.rollout:
            raise ConfigError(
                f"--batch_size x --num_batches_per_epoch ({train_batch}) must be a multiple of --rollout ({s.rollout})"
            )
    rollout = ROLLOUT_DEFAULT if s.rollout == "auto" else s.rollout  # with --recurrence, auto is 32
    if lrn.recurrence != "auto" and rollout % lrn.recurrence:
        raise ConfigError(
            f"--recurrence ({lrn.recurrence}) must divide --rollout ({rollout}): use e.g. --recurrence {rollout}"
        )
    if s.rollout == "auto" and train_batch % ROLLOUT_DEFAULT and not cfg.uses_replay:
        raise ConfigError(
            f"--batch_size x --num_batches_per_epoch ({train_batch}) must be a multiple of "
            f"--rollout ({ROLLOUT_DEFAULT} with auto): give --rollout"
        )


def _check_run(cfg: Config) -> None:
    """Discounts and other values within [0, 1], budgets, timeouts and the experiment's name."""
    lrn, run = cfg.learner, cfg.run
    unit = {
        "--gamma": lrn.gamma,
        "--per_beta": cfg.replay.per_beta,
        "--epsilon_start": cfg.q.epsilon_start,
        "--epsilon_end": cfg.q.epsilon_end,
        "--q_lambda": cfg.q.q_lambda,
        "--priority_eta": cfg.replay.priority_eta,
    }
    for flag, value in unit.items():
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{flag} must be within [0, 1] (got {value})")
    if run.deterministic and run.mode not in ("serial", "sync"):
        raise ConfigError(
            f"--deterministic true needs --mode serial or sync: a --mode {run.mode} run's policy lag follows the clock "
            f"(docs/api.md, reproducible runs); use --mode sync or drop --deterministic"
        )
    if run.stop_at_eval_return is not None and not run.eval_every_sec:
        raise ConfigError("--stop_at_eval_return needs evaluations: give --eval_every_sec too (e.g. 5)")
    if run.eval_every_sec < 0:
        raise ConfigError(f"--eval_every_sec must be >= 0 (got {run.eval_every_sec}); 0 turns evaluation off")
    for flag, budget in {
        "--train_for_env_steps": run.train_for_env_steps,
        "--train_for_seconds": run.train_for_seconds,
    }.items():
        if budget is not None and budget <= 0:
            raise ConfigError(f"{flag} must be positive (got {budget:g})")
    if run.stuck_timeout_sec <= 0:
        raise ConfigError(f"--stuck_timeout_sec must be positive (got {run.stuck_timeout_sec})")
    if run.max_worker_restarts < 0:
        raise ConfigError(
            f"--max_worker_restarts must be >= 0 (got {run.max_worker_restarts}); "
            f"0 stops the run at the first worker failure"
        )
    if lrn.max_policy_lag < 0:
        raise ConfigError(f"--max_policy_lag must be >= 0 (got {lrn.max_policy_lag})")
    if not _PLAIN_NAME.fullmatch(run.experiment):
        raise ConfigError(
            f"--experiment must be a plain name: letters, digits, '.', '_', '-', not starting with "
            f"'.' or '-', at most 128 characters (got {run.experiment!r})"
        )


def check_resolved(cfg: Config) -> None:
    """Combinations of resolved values (no 'auto' left) that cannot run: a one-line ConfigError."""
    s = cfg.sampler
    train_batch = cfg.train_batch
    if s.num_envs_per_worker % s.worker_num_splits:
        raise ConfigError(
            f"--num_envs_per_worker ({s.num_envs_per_worker}) must be a multiple of "
            f"--worker_num_splits ({s.worker_num_splits})"
        )
    if train_batch % cfg.samples_per_slot and not cfg.uses_replay:
        raise ConfigError(
            f"--batch_size x --num_batches_per_epoch ({train_batch}) must be a multiple of one trajectory "
            f"slot, --rollout x envs per split ({s.rollout} x {s.envs_per_split} = {cfg.samples_per_slot}): "
            f"change --batch_size or --num_envs_per_worker"
        )
    ranks = cfg.parallel.num_learners
    if cfg.uses_replay and cfg.replay.replay_size < cfg.samples_per_slot * ranks:
        each = f" for each of --num_learners {ranks}" if ranks > 1 else ""
        raise ConfigError(
            f"--replay_size ({cfg.replay.replay_size}) must hold at least one trajectory slot{each}, --rollout x envs "
            f"per split ({s.rollout} x {s.envs_per_split} = {cfg.samples_per_slot}): raise --replay_size"
        )
    _check_device_mode(cfg)
    if ranks > 1 and (cfg.slots_per_batch % ranks or cfg.minibatch % ranks):
        raise ConfigError(
            f"--num_learners {ranks}: each rank trains on an equal share of every batch, so the batch's trajectory "
            f"slots ({cfg.slots_per_batch}) and --batch_size ({cfg.minibatch}) must be multiples of it: change "
            f"--batch_size{' or --num_workers' if cfg.uses_replay else ''} or --num_learners"
        )
    _check_policy_workers(cfg)
    if cfg.run.deterministic and cfg.run.mode == "sync" and cfg.slots_per_batch != s.total_splits:
        raise ConfigError(
            f"--deterministic true in --mode sync trains on one round of every env group: --batch_size x "
            f"--num_batches_per_epoch ({train_batch}) must be --num_workers x --num_envs_per_worker x --rollout "
            f"({s.total_splits * cfg.samples_per_slot})"
        )
    if cfg.run.mode == "sync" and cfg.slots_per_batch > 4 * s.total_splits:
        raise ConfigError(
            f"in --mode sync the training batch ({train_batch} samples) would take {cfg.slots_per_batch} "
            f"rounds of every worker; lower --batch_size or raise --num_envs_per_worker"
        )


def _check_device_mode(cfg: Config) -> None:
    """What device mode (a device env's sampler: sf_engine.roles.device_sampler) does not run, one line each."""
    if cfg.env.env_backend != "device":
        return
    device_env = f"--env {cfg.env.env} is a device env"
    if cfg.model.rnn != "none":
        raise ConfigError(f"--rnn {cfg.model.rnn}: {device_env}, whose sampler acts with feed-forward policies only")
    if cfg.remote.num_remote_samplers:
        raise ConfigError(
            f"--num_remote_samplers: {device_env}, sampled on this machine's device: drop --num_remote_samplers"
        )
    if cfg.policies.num_policies > 1:
        raise ConfigError(f"--num_policies {cfg.policies.num_policies}: {device_env}, which trains one policy")
    if cfg.parallel.num_learners > 1:
        raise ConfigError(
            f"--num_learners {cfg.parallel.num_learners}: {device_env}, sampled by its one learner's device: use "
            f"--num_learners 1"
        )
    if cfg.run.deterministic:
        raise ConfigError(f"--deterministic true: {device_env}, whose runs are not made repeatable yet: drop it")
    s = cfg.sampler
    if cfg.run.mode == "sync" and cfg.slots_per_batch % s.total_splits:  # a sampler fills all its slots at once
        raise ConfigError(
            f"--mode sync with {device_env} trains on whole rollouts: --batch_size x --num_batches_per_epoch "
            f"({cfg.train_batch}) must be a multiple of --num_workers x "
            f"--num_envs_per_worker x --rollout ({s.total_splits * cfg.samples_per_slot})"
        )


def _check_value_based(cfg: Config) -> None:
    """The replay and q groups' values, then what the algorithm takes (its spec: check_algorithm_flags)."""
    r, q = cfg.replay, cfg.q  # counts, rates and [0, 1] values: with the others above
    if not 0.0 < q.target_tau <= 1.0:
        raise ConfigError(f"--target_tau must be within (0, 1] (got {q.target_tau}): 1 copies the online network")
    if q.apex_alpha < 0:
        raise ConfigError(f"--apex_alpha must be >= 0 (got {q.apex_alpha}); 0: every env row at the base epsilon")
    if cfg.uses_replay and cfg.minibatch > r.replay_size:
        raise ConfigError(f"--batch_size ({cfg.minibatch}) must not exceed --replay_size ({r.replay_size})")
    check_algorithm_flags(cfg)
