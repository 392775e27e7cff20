"""The `parallel` group of the configuration: several learner processes (ranks) of one policy, data-parallel
(sf_engine.runtime.ranks; sf_engine.config.groups imports it into its GROUPS like every group)."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.fields import flag_field as _f


@dataclass(frozen=True)
class ParallelConfig:
    num_learners: int = _f(
        1,
        "Learner processes (ranks) training the one policy, data-parallel: each takes its share of every training "
        "batch (--batch_size x --num_batches_per_epoch stays the whole batch, so a rank's minibatches are "
        "--batch_size / N samples) and the ranks' gradients are averaged before every optimizer step "
        "(torch.distributed: NCCL between GPUs, gloo on the CPU), so that the run learns as with one learner and "
        "every rank holds the same weights (compared at every publication). Rank 0 publishes the weights, writes "
        "the checkpoints and reports; with --device cuda rank r learns on GPU r. For algorithms that learn from "
        "trajectory slots (ppo) in --mode async or sync. A rank that dies restarts them all from the training "
        "state kept. 1: one learner.",
    )
    collective_timeout_sec: float = _f(
        30.0,
        "With --num_learners > 1, the longest a rank waits for the others in one collective (their joining at the "
        "start included): a rank that died or hangs ends the wait with one line naming the operation, and the "
        "ranks are restarted. Keep it below --stuck_timeout_sec: a rank waiting in a collective does not beat.",
    )

    def check(self) -> None:
        """Bad values: ValueError with one line naming the flag and the fix."""
        if self.num_learners < 1:
            raise ValueError(f"--num_learners must be at least 1 (got {self.num_learners})")
        if not self.collective_timeout_sec > 0:
            raise ValueError(f"--collective_timeout_sec must be > 0 seconds (got {self.collective_timeout_sec})")
