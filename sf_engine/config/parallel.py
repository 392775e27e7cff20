"""The `parallel` group of the configuration: several learner processes (ranks) of one policy, data-parallel
(sf_engine.runtime.ranks; sf_engine.config.groups imports it into its GROUPS like every group)."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.algorithms import built_in_algorithms
from sf_engine.config.fields import flag_field as _f
from sf_engine.config.fields import int_or_auto


@dataclass(frozen=True)
class ParallelConfig:
    num_learners: int | str = _f(
        1,
        "Learner processes (ranks) training the one policy, data-parallel: each takes its share of every training "
        "batch (its trajectory slots; with a replay buffer, a buffer of its own holding 1/N of --replay_size, filled "
        "with its share of the slots) and trains on minibatches of --batch_size / N samples (--batch_per_learner: "
        "--batch_size each); the ranks' gradients are averaged before every optimizer step (torch.distributed: NCCL "
        "between GPUs, gloo on the CPU), so that the run learns as with one learner and every rank holds the same "
        "weights (compared at every publication). Rank 0 publishes the weights, writes the checkpoints and reports; "
        "with --device cuda rank r learns on GPU r. For the algorithms built for it ("
        + ", ".join(name for name, spec in built_in_algorithms().items() if spec.data_parallel)
        + ", or a user's whose spec says data_parallel) in --mode async or sync. A rank that dies restarts them all "
        "from the training state kept. 1: one learner; 'auto': one per visible GPU with --device cuda (or auto "
        "finding GPUs) where the run can have several ranks, else 1.",
        type=int_or_auto,
    )
    batch_per_learner: bool = _f(
        False,
        "With --num_learners N: --batch_size is each rank's minibatch, so the run's minibatch (and training batch) is "
        "N times as large and each optimizer step averages N times the samples (fewer steps per env step: raise "
        "--learning_rate yourself if you want the linear scaling rule). false: --batch_size is the run's minibatch, "
        "each rank takes 1/N of it, and the run learns as with one learner.",
    )
    num_policy_workers: int | str = _f(
        "auto",
        "Policy-worker processes, each batching the forward passes of its share of the rollout workers (worker w "
        "is served by policy worker w mod N); with --device cuda policy worker k acts on GPU k, so that inference "
        "scales with the GPUs. 'auto': one per visible GPU with --device cuda (at most one per rollout worker), "
        "else 1.",
        type=int_or_auto,
    )
    collective_timeout_sec: float = _f(
        30.0,
        "With --num_learners > 1, the longest a rank waits for the others in one collective (their joining at the "
        "start included): a rank that died or hangs ends the wait with one line naming the operation, and the "
        "ranks are restarted. Keep it below --stuck_timeout_sec: a rank waiting in a collective does not beat.",
    )

    def check(self) -> None:
        """Bad values: ValueError with one line naming the flag and the fix."""
        if self.num_learners != "auto" and self.num_learners < 1:
            raise ValueError(f"--num_learners must be at least 1 (got {self.num_learners})")
        if self.num_policy_workers != "auto" and self.num_policy_workers < 1:
            raise ValueError(f"--num_policy_workers must be at least 1 (got {self.num_policy_workers})")
        if not self.collective_timeout_sec > 0:
            raise ValueError(f"--collective_timeout_sec must be > 0 seconds (got {self.collective_timeout_sec})")
