"""The seam between the learner role and a learning algorithm.

The learner role (sf_engine.roles.learner) takes its data from a source (sf_engine.roles.sources: whole
trajectory slots, or minibatches of a replay buffer) and hands each batch to a policy's algorithm through one
method, `train(batch) -> TrainResult`: a TrajectoryBatch marks the samples the policy may train on (`keep`:
its own, valid, within the lag bound); a replay minibatch is all trainable and its result carries the new
priorities. The algorithm trains its model; the role then publishes the algorithm's `params` (the model's
whole state as one flat vector) as the policy's next version and writes checkpoints of `state()`. Version
tags, lag, shared weights, checkpoints on disk and PBT's rounds stay with the role: an algorithm is the maths
and its training state.

An algorithm is a class built as `cls(cfg, spec, device, hooks)` (the resolved Config, the EnvSpec, a
torch.device, TrainingHooks), named by its spec (sf_engine.config.algorithms.AlgorithmSpec), which --algo picks.
PPO (sf_engine.algo.ppo) is the first; docs/internals.md says how to add one. The state methods (`state`, `load`,
`copy_from`, `weights_replaced`, the hyperparameters) derive from what an algorithm holds, named once
(sf_engine.algo.training_state).
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from sf_engine.algo.batch import ReplayBatch, SequenceBatch, TrajectoryBatch


@dataclass(frozen=True)
class TrainingHooks:
    """What an algorithm may ask of the process that hosts it: the run's env steps so far and its seconds
    (schedules: a learner restarted mid-run goes on where the run is), a sign of life between minibatches
    (the supervisor restarts a silent process), whether the run is stopping (skip the rest of an update)."""

    env_steps: Callable[[], int]
    beat: Callable[[], None]
    stopping: Callable[[], bool]
    elapsed_sec: Callable[[], float]


@dataclass
class TrainResult:
    """What one call of an algorithm's `train` did: samples trained, the mean of each loss statistic over its
    optimizer steps (policy_loss, value_loss, entropy, approx_kl, clip_fraction, grad_norm for PPO; none
    without a step), the optimizer steps taken (`updates`) and those skipped for a non-finite loss or
    gradient (`skipped_updates`: the weights stay as they were; the role counts them, and stops the run
    after --max_bad_updates in a row). On a replay minibatch, `priorities` [B]: the new priority of each of
    its samples (|TD error|; zeros after a skipped step)."""

    samples: int
    losses: dict = field(default_factory=dict)
    updates: int = 0
    skipped_updates: int = 0
    priorities: Tensor | None = None

    @staticmethod
    def total(results: list[TrainResult]) -> TrainResult:
        """The results of one round's calls as one: counts summed, each loss statistic averaged over the calls
        that report it, weighted by their optimizer steps (one result stays as it is)."""
        if len(results) == 1:
            return results[0]
        total, sums, weights = TrainResult(0), {}, {}
        for result in results:
            total.samples += result.samples
            total.updates += result.updates
            total.skipped_updates += result.skipped_updates
            for name, value in result.losses.items():
                weight = max(result.updates, 1)
                sums[name] = sums.get(name, 0.0) + value * weight
                weights[name] = weights.get(name, 0) + weight
        total.losses = {name: value / weights[name] for name, value in sums.items()}
        return total


@contextlib.contextmanager
def keep_beating(beat: Callable[[], None], every_sec: float = 5.0):
    """Heartbeats from a thread while the body runs: a call that may take longer than --stuck_timeout_sec
    without being stuck (--compile's first calls, which compile)."""
    done = threading.Event()

    def loop():
        while not done.wait(every_sec):
            beat()

    thread = threading.Thread(target=loop, name="keep_beating", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class CompiledLosses:
    """--compile for a replay learner's losses (SAC's, TD3's): `compiled(fn)` is `fn` through torch.compile (on a
    GPU with CUDA graphs, mode reduce-overhead: a whole forward, and its backward, in one launch each), or `fn` as it
    is without --compile; `fn` takes and returns tensors of fixed shapes (a minibatch's). Each update runs in
    `step()`: heartbeats meanwhile for the first two, which compile (seconds to a minute; TD3's actor loss may first
    come in the second), and on a GPU a new CUDA-graph step, from which the last one's outputs may be overwritten
    (what an update returns is a copy)."""

    def __init__(self, cfg, device, beat: Callable[[], None]):
        self.on, self.cuda, self.beat, self.compiling = cfg.run.compile, device.type == "cuda", beat, 2

    def compiled(self, fn: Callable) -> Callable:
        import torch

        return torch.compile(fn, mode="reduce-overhead" if self.cuda else None, dynamic=False) if self.on else fn

    @contextlib.contextmanager
    def step(self):
        if not self.on:
            yield
            return
        import torch

        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        with keep_beating(self.beat) if self.compiling else contextlib.nullcontext():
            yield
        self.compiling = max(0, self.compiling - 1)


def all_finite(values: Tensor) -> bool:
    """Whether every value of the float tensor is finite (no NaN, no inf). A few values on the CPU (an
    update's loss stats) are read as Python floats (0.4 us); more by x . x over the flat values, finite
    unless one is not or the sum overflows (then the exact check decides): a tenth of the time of
    torch.isfinite(values).all() on a CPU (CartPole's 9,155 weights: 8 against 39 us; Pong's 1.7M: 0.2
    against 2.4 ms)."""
    import torch

    flat = values.reshape(-1)  # any shape
    if flat.numel() <= 64 and flat.device.type == "cpu":
        return all(map(math.isfinite, flat.tolist()))
    return bool(torch.isfinite(torch.dot(flat, flat))) or bool(torch.isfinite(flat).all())


def set_learning_rate(optimizer, lr: float) -> None:
    """`lr` in every parameter group of `optimizer` (a torch optimizer or FlatAdam)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def schedule_learning_rate(optimizer, cfg, lcfg, hooks: TrainingHooks) -> None:
    """--lr_schedule linear: `lcfg`'s learning rate decayed to --lr_end over --lr_decay_env_steps (over the run's
    budgets where that is 0: the larger part used of those that apply), set in `optimizer`; 'constant' leaves it
    as it is."""
    if lcfg.lr_schedule == "linear":
        if lcfg.lr_decay_env_steps:
            used = min(1.0, hooks.env_steps() / lcfg.lr_decay_env_steps)
        else:
            used = cfg.run.budget_used(hooks.env_steps(), hooks.elapsed_sec())
        set_learning_rate(optimizer, lcfg.learning_rate + used * (lcfg.lr_end - lcfg.learning_rate))


class Algorithm(Protocol):
    """One policy's learning algorithm, hosted by the learner role."""

    # The acting side (policy worker, evaluator, enjoy.py, load_policy, export) builds the network of
    # `acting_network` and loads the published vector into it: an algorithm trains that model, and `params` is its
    # flatten_state.
    params: Tensor  # the model's whole state as one flat float32 vector: what the role publishes
    model: object  # the network whose state `params` is

    @staticmethod
    def acting_network(spec, cfg, bf16: bool = False):
        """The network it publishes, as every acting site builds it (sf_engine.algo.acting.build_policy)."""

    def train(self, batch: TrajectoryBatch | ReplayBatch | SequenceBatch) -> TrainResult:
        """Train on `batch`, the data its spec learns from (sf_engine.roles.sources hands it over): a
        TrajectoryBatch of whole slots, its samples to train on marked by `batch.keep` [T, N]; a ReplayBatch of
        transitions or a SequenceBatch of sequences, one minibatch (the result carries their `priorities`).
        `params` holds the new weights after. An update whose loss or gradient is not finite is skipped (no
        step) and counted in the result."""

    @property
    def learning_rate(self) -> float:
        """The learning rate in force (reported with each batch)."""

    def state(self) -> dict:
        """Tensors and plain data to checkpoint (the role adds the version)."""

    def load(self, state: dict, source: str) -> None:
        """Take back a checkpoint's state of this policy (`source`: where it came from, for the log)."""

    def hyperparameters(self) -> dict:
        """The hyperparameters PBT explores (its spec's `pbt`, within sf_engine.algo.pbt.RANGES: fields of the
        learner's config group), as in force."""

    def set_hyperparameters(self, hyper: dict) -> None:
        """PBT's explore: this member's own hyperparameters from now on."""

    def copy_from(self, other: Algorithm) -> None:
        """PBT's exploit: `other`'s weights and optimizer state (this one's learning rate kept)."""

    def weights_replaced(self) -> None:
        """`params` were overwritten from outside (a restarted learner's last published weights): state derived
        from the weights (DQN's target network) follows them."""

    # Optional, looked up by name: an algorithm on a replay buffer may define
    #   observe(obs: dict) -> None
    # and is then handed, as each slot goes into the buffer, the observations of its trainable steps (key ->
    # [steps, *shape]): SAC's input normalizer learns from each observation once, not from every replay of it.
