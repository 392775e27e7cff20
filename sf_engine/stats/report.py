"""A run's figures out of the aggregated RunStats (sf_engine.stats.run_stats): TensorBoard's scalars, the terminal's
status line and summary.json's fields, and the Reporter that hands them to the observers (sf_engine.stats.observers:
the terminal, TensorBoard, summary.json, W&B and the user's), each of which writes on its own schedule. They read
and aggregate nothing. Runs in the main process (no torch).
"""

from __future__ import annotations

import os
import time

from sf_engine.stats.observers import (
    SUMMARY_EVERY_SEC,
    Bottleneck,
    Figures,
    Observers,
    SummaryFile,
    TensorBoardObserver,
    TerminalObserver,
)
from sf_engine.stats.previous import carry_over, read_summary
from sf_engine.stats.ratings_figures import ratings_scalars, ratings_status, ratings_summary
from sf_engine.stats.run_stats import RunStats

REPORT_EVERY_SEC = 1.0


def scalars(stats: RunStats, cfg, frameskip: int) -> dict:
    """TensorBoard tag -> value of everything known now."""
    out = _run_scalars(stats, cfg, frameskip)
    out.update(_episode_scalars(stats))
    if stats.training:
        out.update(_training_scalars(stats.training))
    out.update(_policy_scalars(stats, cfg))
    out.update(_remote_scalars(stats))
    out.update(stats.replay.scalars())
    out.update(ratings_scalars(stats.ratings))
    if stats.pbt is not None:  # each member's hyperparameters over time, and the exploits so far
        for member, hyper in enumerate(stats.pbt.hyperparameters):
            out.update({f"policy_{member}/pbt/{name}": value for name, value in hyper.items()})
        out.update({"pbt/rounds": stats.pbt.round, "pbt/exploits": len(stats.pbt_exploits)})
    return out


def _run_scalars(stats: RunStats, cfg, frameskip: int) -> dict:
    """The run's throughput, sample books and faults."""
    throughput = stats.throughput
    out = {
        "perf/env_steps_per_sec_10s": throughput.env_steps_rate(10.0),
        "perf/env_steps_per_sec_60s": throughput.env_steps_rate(60.0),
        "perf/learner_samples_per_sec": throughput.samples_rate(10.0),
        "train/samples_dropped_lag": stats.books.dropped_lag,
        "faults/worker_restarts": stats.worker_restarts,
        "faults/policy_worker_restarts": stats.policy_worker_restarts,
        "faults/learner_restarts": stats.learner_restarts,
        "faults/evaluator_restarts": stats.evaluator_restarts,
        "faults/checkpoint_failures": stats.checkpoint_failures,
        "faults/samples_skipped_non_finite": stats.books.skipped_non_finite,
        "faults/updates_skipped_non_finite": stats.skipped_updates,
    }
    out["perf/frames_per_sec_10s"] = out["perf/env_steps_per_sec_10s"] * frameskip
    out["perf/frames_per_sec_60s"] = out["perf/env_steps_per_sec_60s"] * frameskip
    if stats.inference_forwards:
        out["perf/inference_batch_mean"] = stats.inference_samples / stats.inference_forwards
    if stats.env_steps > stats.env_steps_base and not cfg.uses_replay:  # with replay: the replay ratio
        out["perf/sample_reuse"] = (
            stats.books.trained * cfg.learner.num_epochs / (stats.env_steps - stats.env_steps_base)
        )
    return out


def _episode_scalars(stats: RunStats) -> dict:
    """The training episodes' returns, lengths and the env's own stats, then the last evaluation's."""
    out = {}
    if stats.returns:
        out["episode/return"] = stats.return_mean
        out["episode/length"] = sum(stats.lengths) / len(stats.lengths)
    for seat, value in enumerate(stats.seat_return_means or []):  # multi-agent envs: each seat's own
        if value is not None:
            out[f"episode/return_seat_{seat}"] = value
    out.update({f"episode/{name}": value for name, value in stats.extra_means.items()})
    evaluation = stats.evaluation
    if evaluation:
        out.update(
            {
                "eval/return_mean": evaluation.return_mean,
                "eval/return_best": evaluation.best,
                "eval/length_mean": evaluation.length_mean,
            }
        )
        if evaluation.win_rate is not None:
            out.update(
                {
                    "eval/win_rate_vs_random": evaluation.win_rate,
                    "eval/draw_rate_vs_random": evaluation.draw_rate,
                    "eval/loss_rate_vs_random": evaluation.loss_rate,
                }
            )
    return out


def _training_scalars(train) -> dict:
    """The learner's latest figures: policy lag, losses, learning rate and version."""
    out = {"policy_lag/min": train.lag_min, "policy_lag/mean": train.lag_mean, "policy_lag/max": train.lag_max}
    out.update(_losses(train, "train/"))
    out.update({"train/learning_rate": train.learning_rate, "train/version": train.version})
    return out


def _losses(train, prefix: str) -> dict:
    """Every loss statistic the policy's algorithm reported for its latest batch (PPO's: policy_loss,
    value_loss, entropy, approx_kl, clip_fraction, grad_norm)."""
    return {f"{prefix}{name}": value for name, value in train.losses.items()}


def _policy_scalars(stats: RunStats, cfg) -> dict:
    """--num_policies > 1: each trained policy's own figures, under policy_N/."""
    out = {}
    for figures in _trained_policies(stats, cfg):
        prefix, train = f"policy_{figures['policy']}/", stats.policy_training.get(figures["policy"])
        out.update(
            {
                prefix + name: figures[key]
                for name, key in (
                    ("episode/return", "episode_return_mean"),
                    ("train/version", "version"),
                    ("policy_lag/mean", "policy_lag_mean"),
                    ("train/learning_rate", "learning_rate"),
                    ("perf/trained_samples_per_sec", "trained_samples_per_sec"),
                    ("perf/learner_share", "learner_share"),
                    ("perf/inference_share", "inference_share"),
                )
                if figures[key] is not None
            }
        )
        if train:
            out.update(_losses(train, f"{prefix}train/"))
    return out


def _remote_scalars(stats: RunStats) -> dict:
    """--num_remote_samplers: each sampler actor's own figures, under remote_N/."""
    out = {}
    for node in stats.remote_figures():
        prefix = f"remote_{node['sampler']}/"
        out.update(
            {
                prefix + "env_steps_per_sec_10s": node["env_steps_per_sec_10s"],
                prefix + "restarts": node["restarts"],
                prefix + "dropped_env_steps": node["dropped"],
                prefix + "fetch_sec": node["fetch_sec"],
            }
        )
        if node["lag_mean"] is not None:
            out[prefix + "policy_lag_mean"] = node["lag_mean"]
    return out


def policy_shares(policies: list) -> str:
    """'policy 0: learner 52%, inference 50% | policy 1: ...' (several policies), or ''."""
    pct = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    return " | ".join(
        f"policy {f['policy']}: learner {pct(f['learner_share'])}, inference {pct(f['inference_share'])}"
        for f in policies
    )


def _trained_policies(stats: RunStats, cfg) -> list:
    """--num_policies > 1: each trained policy's figures (the opponent pool's snapshots are not listed)."""
    if cfg.policies.num_policies < 2:
        return []
    figures = [f for f in stats.policy_figures() if f["policy"] < cfg.policies.num_policies]
    for key, share in (("learner_train_sec", "learner_share"), ("inference_sec", "inference_share")):
        total = sum(f[key] for f in figures)
        for f in figures:  # each trained policy's part of the time the learner and the policy worker gave them
            f[share] = f[key] / total if total > 0 else None
    return figures


def status_line(stats: RunStats, cfg, frameskip: int) -> str:
    elapsed = time.monotonic() - stats.start_time
    rate = stats.throughput.env_steps_rate(10.0)
    ret = f"{stats.return_mean:.1f}" if stats.returns else "-"
    train = stats.training
    lag = f"{train.lag_mean:.1f}/{train.lag_max:.0f}" if train else "-"
    line = (
        f"[{elapsed:6.1f}s] env steps {stats.env_steps:,} | {rate:,.0f} env steps/s "
        f"({rate * frameskip:,.0f} frames/s, 10 s) | return {ret} (last 100 of {stats.episodes:,}) "
        f"| lag mean/max {lag} | version {train.version if train else 0}"
    )
    line += _game_progress(stats) + ratings_status(stats.ratings)
    line += stats.replay.status_text() + _learner_in_progress(stats)
    if stats.books.skipped_non_finite or stats.skipped_updates:  # the env's or the learner's NaNs and infs
        line += f" | non-finite: {stats.books.skipped_non_finite:,} samples, {stats.skipped_updates:,} updates skipped"
    extra = [f"{name} {value:.2f}" for name, value in stats.extra_means.items() if name != "true_objective"][:3]
    if extra:  # the env's own episode stats: frags, deaths, ...
        line += " | " + " ".join(extra)
    policies = _trained_policies(stats, cfg)
    if policies:  # --num_policies > 1: each policy's return and version
        line += " | policies " + " ".join(
            f"{f['policy']}:{'-' if f['episode_return_mean'] is None else format(f['episode_return_mean'], '.1f')}"
            f"@v{f['version']}"
            for f in policies
        )
    nodes = stats.remote_figures()
    if nodes:  # sampler actors: their env steps/s together, lag at arrival, restarts
        lags = [n["lag_mean"] for n in nodes if n["lag_mean"] is not None]
        line += (
            f" | {len(nodes)} sampler actors {sum(n['env_steps_per_sec_10s'] for n in nodes):,.0f} env steps/s, "
            f"lag {max(lags) if lags else 0:.1f}, restarts {sum(n['restarts'] for n in nodes)}"
        )
    return line + f" | ETA {_seconds_left(stats, cfg, elapsed, rate)}"


LONG_STAGE_SEC = 10.0  # the status line says what the learner has been doing for longer than this


def _learner_in_progress(stats: RunStats) -> str:
    """' | learner in train for 42 s' while the learner is in one stage for a long time (a slow first round)."""
    now = stats.learner_now()
    return f" | learner in {now[0]} for {now[1]:,.0f} s" if now is not None and now[1] >= LONG_STAGE_SEC else ""


def _game_progress(stats: RunStats) -> str:
    """What moves in a multi-agent game, where the mean return of a zero-sum game stays 0: each seat's mean
    return, and the latest win rate against a random player (two-player games)."""
    out = ""
    seats = stats.seat_return_means
    if seats and len(seats) > 1:
        out += " | seats " + "/".join("-" if value is None else f"{value:+.2f}" for value in seats)
    evaluation = stats.evaluation
    if evaluation is not None and evaluation.win_rate is not None:
        out += (
            f" | vs random won {evaluation.win_rate:.0%} drew {evaluation.draw_rate:.0%} "
            f"(v{evaluation.version}, {evaluation.episodes} games)"
        )
    return out


def _seconds_left(stats: RunStats, cfg, elapsed: float, rate: float) -> str:
    """Until the first budget that applies is reached (the env-step budget's at the last 10 s's rate; with node
    groups, whose budget counts the env steps of all of them, each taken to step as this one does)."""
    remaining = []
    if cfg.run.train_for_seconds is not None:
        remaining.append(cfg.run.train_for_seconds - elapsed)
    if cfg.run.train_for_env_steps is not None and rate > 0:
        groups = cfg.parallel.dist_world
        remaining.append((cfg.run.train_for_env_steps - groups * stats.env_steps) / (groups * rate))
    return f"{max(0.0, min(remaining)):,.0f}s" if remaining else "-"


def summary(stats: RunStats, cfg, frameskip: int) -> dict:
    """summary.json: the run's figures (the perf/ scripts read it)."""
    steps_per_sec = stats.throughput.env_steps_per_sec()
    diagnosis, train = stats.diagnosis, stats.training
    return {
        "env": cfg.env.env,
        "mode": cfg.run.mode,
        "num_workers": cfg.sampler.num_workers,
        "num_envs_per_worker": cfg.sampler.num_envs_per_worker,
        "rollout": cfg.sampler.rollout,
        "env_steps": stats.env_steps,
        "frames": stats.env_steps * frameskip,
        "wall_sec": round(time.monotonic() - stats.start_time, 2),
        "env_steps_per_sec": round(steps_per_sec, 1),
        "frames_per_sec": round(steps_per_sec * frameskip, 1),
        "episode_return_mean": stats.return_mean,
        "episodes": stats.episodes,
        "episode_return_by_seat": stats.seat_return_means,
        "episode_extra_stats": stats.extra_means,
        "policy_lag_mean": stats.lag_sum / stats.lag_count if stats.lag_count else None,
        "policy_lag_max": stats.lag_max if stats.lag_count else None,
        "learner_version": train.version if train else 0,
        "learner_samples": stats.books.trained + stats.replay_samples,
        "samples_dropped_lag": stats.books.dropped_lag,
        "stage_seconds": stats.stage_sec,
        "role_wall_seconds": {role: stages.wall_sec for role, stages in stats.stages.items()},
        "bottleneck": diagnosis.stage if diagnosis else None,
        "bottleneck_report": diagnosis.message if diagnosis else None,
        "inference_batch_mean": (
            stats.inference_samples / stats.inference_forwards if stats.inference_forwards else None
        ),
        "env_steps_per_sec_windows": [round(r, 1) for r in stats.throughput.window_rates],
        "checkpoint": stats.checkpoint_path,
        **_evaluation_summary(stats.evaluation),
        "worker_restarts": stats.worker_restarts,
        "policy_worker_restarts": stats.policy_worker_restarts,
        "learner_restarts": stats.learner_restarts,
        "learner_recoveries": stats.recoveries,
        "evaluator_restarts": stats.evaluator_restarts,
        "checkpoint_failures": stats.checkpoint_failures,
        "updates_skipped_non_finite": stats.skipped_updates,
        "env_step_books": stats.books.as_dict(stats.env_steps - stats.env_steps_base),
        "policies": _trained_policies(stats, cfg) or None,
        "remote_samplers": stats.remote_figures() or None,
        "remote_weights": None
        if stats.remote is None
        else {"objects_sent": stats.remote.weights_versions_sent, "bytes_per_object": stats.remote.weights_bytes_sent},
        "pbt": _pbt_summary(stats),
        "ratings": ratings_summary(stats.ratings),
        **stats.replay.summary(cfg.learner.algo),
    }


def _evaluation_summary(evaluation) -> dict:
    """The latest evaluation's figures (None each before the first): its return, the best so far, the
    version evaluated and, in two-player games, the rates against a random player."""
    return {
        "eval_return_mean": evaluation.return_mean if evaluation else None,
        "eval_return_best": evaluation.best if evaluation else None,
        "eval_win_rate_vs_random": evaluation.win_rate if evaluation else None,
        "eval_draw_rate_vs_random": evaluation.draw_rate if evaluation else None,
        "eval_loss_rate_vs_random": evaluation.loss_rate if evaluation else None,
        "eval_version": evaluation.version if evaluation else None,
    }


def _pbt_summary(stats: RunStats):
    """--pbt: the rounds, each member's hyperparameters and objective, and every exploit; None otherwise."""
    if stats.pbt is None:
        return None
    return {
        "rounds": stats.pbt.round,
        "hyperparameters": stats.pbt.hyperparameters,
        "objectives": stats.pbt.objectives,
        "exploits": [
            {"round": r, "replaced": t, "copied": s, "objective_replaced": a, "objective_copied": b}
            for r, t, s, a, b in stats.pbt_exploits
        ],
    }


class Reporter:
    """Hands the figures of `stats` to the observers (sf_engine.stats.observers): a report every second (or
    every --status_every_sec if shorter), each checkpoint and evaluation as it arrives, the bottleneck report
    every 30 s after warm-up. The built-in observers come first: the terminal, TensorBoard, summary.json and
    `tracker` (W&B, or None); then `observers`, the user's. `resumed`: the run continues the experiment's
    previous one, whose summary.json gives the figures this run has none of yet (carry_over)."""

    def __init__(
        self, stats: RunStats, cfg, frameskip: int, experiment_dir: str, tracker=None, resumed=False, observers=()
    ):
        self.stats, self.cfg, self.frameskip = stats, cfg, frameskip
        self.previous = read_summary(os.path.join(experiment_dir, "summary.json")) if resumed else {}
        status_sec = cfg.run.status_every_sec
        built_in = [
            TerminalObserver(status_sec),
            TensorBoardObserver(experiment_dir),
            SummaryFile(experiment_dir, min(SUMMARY_EVERY_SEC, status_sec)),
        ]
        self.observers = Observers(built_in + ([tracker] if tracker is not None else []), observers)
        self.report_every_sec = min(REPORT_EVERY_SEC, status_sec)
        self.last_report = time.monotonic()

    @property
    def stop_reason(self) -> str | None:
        """Why an observer asked the run to stop (it returned True, or it raised), or None."""
        return self.observers.stop_reason

    def figures(self, final: bool = False) -> Figures:
        return Figures(
            carry_over(summary(self.stats, self.cfg, self.frameskip), self.previous),
            scalars(self.stats, self.cfg, self.frameskip),
            status_line(self.stats, self.cfg, self.frameskip),
            final,
        )

    def tick(self) -> None:
        self.stats.sample()
        self._notify_arrivals()
        now = time.monotonic()
        if now - self.last_report >= self.report_every_sec:
            self.observers.notify("on_report", self.figures())
            self.last_report = now
        if self.stats.bottleneck_due():
            self.report_bottleneck()

    def _notify_arrivals(self) -> None:
        """The checkpoints written and the evaluations ended since the last tick, in their order."""
        for method, value in self.stats.take_arrivals():
            self.observers.notify(method, value)

    def report_bottleneck(self) -> None:
        """The binding stage over the last window, to every observer."""
        window_sec = self.stats.diagnose_window()
        diagnosis = self.stats.diagnosis
        shares = policy_shares(_trained_policies(self.stats, self.cfg))
        report = Bottleneck(diagnosis.message, dict(diagnosis.fractions), window_sec, shares, self.stats.env_steps)
        self.observers.notify("on_bottleneck", report)

    def close(self) -> dict:
        """The final figures, after the run stopped, to every observer; returns the summary."""
        self.stats.finish()
        self._notify_arrivals()
        figures = self.figures(final=True)
        self.observers.notify("on_report", figures)
        self.observers.close()
        return dict(figures)
