"""The `run` group of the configuration: how and where a run runs (its mode, device, budgets, checkpoints,
evaluations, processes); sf_engine.config.groups imports it into its GROUPS like every group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sf_engine.config.fields import flag_field as _f

DEFAULT_ENV_STEPS, DEFAULT_SECONDS = 10_000_000, 3600.0  # the budgets of a run given neither


@dataclass(frozen=True)
class RunConfig:
    config: Optional[str] = _f(
        None,
        "Start from a saved config.json (of an earlier run, say): its values replace "
        "the defaults, the flags given here win; --restart, --experiment, --train_dir "
        "and --shm_dir are never taken from it.",
        type=str,
    )
    experiment: str = _f("default", "Experiment name: results go to <train_dir>/<experiment>/.")
    train_dir: str = _f("train_dir", "Root directory of all experiments.")
    mode: str = _f(
        "async",
        "'async': sampling and learning overlap; 'sync': workers wait for each new policy "
        "(lag 0); 'serial': every role in this one process (debugging, tests).",
        choices=("async", "sync", "serial"),
    )
    device: str = _f(
        "auto",
        "Device of the policy worker and learner: 'auto' (CUDA when present), 'cpu', 'cuda'.",
        choices=("auto", "cpu", "cuda"),
    )
    bf16: bool = _f(
        False,
        "Run the encoders (CNN / MLP) in bfloat16 where the hardware has native bf16 (a CPU "
        "with avx512_bf16 or AMX, or a GPU): the learner's under autocast (its recurrent core, "
        "heads, losses and optimizer stay float32), the policy worker's, on images, from "
        "bfloat16 copies of the image encoders' and recurrent core's weights. About 2x on CNN training on such CPUs.",
    )
    compile: bool = _f(
        False,
        "Compile the hot paths: the policy worker's forward at a few fixed batch sizes (each batch padded to "
        "the next; CUDA graphs on a GPU, torch.compile on the CPU), PPO's feed-forward learner forward "
        "(torch.compile), SAC's and TD3's losses and CrossQ's critic loss (torch.compile; with CUDA graphs on a "
        "GPU). Compiling takes seconds to a minute at the start. Needs a C++ compiler. Off by default but for "
        "--algo crossq: on an H100 a learner-bound CartPole run was 4% slower with it, on the CPU SAC's and TD3's "
        "updates 4-16% slower, CrossQ's about 1.45x faster.",
    )
    deterministic: bool = _f(
        False,
        "Reproducible runs (--mode serial or sync): two runs of the same flags and --seed give the same figures "
        "and bit-identical weights on the CPU (torch's deterministic algorithms; episodes counted in the order "
        "they ended; in sync mode each forward waits for every env group, and a training batch is one round of "
        "them). Budget such runs in env steps (sync mode stops at the end of the round that reaches it): a time "
        "budget, and the times of evaluations and checkpoints, follow the clock. Refused in async mode, whose "
        "policy lag follows the clock (docs/api.md).",
    )
    train_for_env_steps: int | None = _f(
        None,
        "Env-step budget: stop after this many env steps in total (resumed runs included; a re-run of an "
        "experiment that reached it exits at once). Each budget applies when given, the first reached "
        f"stops the run; with neither given, {DEFAULT_ENV_STEPS:,} env steps and {DEFAULT_SECONDS:g} s apply.",
        type=int,
    )
    train_for_seconds: float | None = _f(
        None,
        "Time budget: stop after this many seconds of this run (each run, resumed or not, has its own). "
        "Applies when given, or by default with --train_for_env_steps not given either (see there).",
        type=float,
    )
    stop_at_return: Optional[float] = _f(
        None, "Stop once the mean return of the last 100 episodes reaches this.", type=float
    )
    stop_at_eval_return: Optional[float] = _f(
        None,
        "Stop once a greedy evaluation's mean return reaches this (with --eval_every_sec: the return that counts "
        "when training episodes explore, as with --algo dqn).",
        type=float,
    )
    save_every_sec: float = _f(120.0, "Checkpoint period in seconds (a checkpoint is also written at exit).")
    keep_checkpoints: int = _f(3, "How many recent checkpoints to keep.")
    restart: bool = _f(False, "Start over: delete the experiment's previous checkpoints and logs.")
    status_every_sec: float = _f(5.0, "Period of the one-line terminal status.")
    eval_every_sec: float = _f(
        0.0,
        "Evaluate every this many seconds (0: never): --eval_episodes greedy episodes on "
        "separate envs, logged as eval/return_mean; the best weights go to "
        "checkpoints/best.pt.",
    )
    eval_episodes: int = _f(10, "Episodes per evaluation (played in parallel, one per evaluation env).")
    eval_max_steps: int = _f(100_000, "Upper bound on the env steps of one evaluation.")
    sampling_only: bool = _f(
        False,
        "Measure the sampler alone: the learner hands slots straight back without "
        "training (the policy stays at its initial or resumed weights).",
    )
    cpu_affinity: str = _f(
        "auto",
        "Pin processes to cores. 'learner': a learner that trains on the CPU gets "
        "--learner_threads cores of its own (each of --num_learners ranks) and every other process the rest, so "
        "sampling never preempts it; 'off': the OS places every process; 'auto': "
        "'learner' when training on the CPU with cores to spare, else 'off'.",
        choices=("auto", "learner", "off"),
    )
    shm_dir: str = _f("/dev/shm", "Directory (a tmpfs) backing the shared trajectory buffers.")
    stuck_timeout_sec: float = _f(
        60.0,
        "A process whose heartbeat stops this long is stuck (a hung env, say): it is killed and restarted "
        "like one that died (the learner too, from the weights it published last).",
    )
    max_worker_restarts: int = _f(
        10,
        "Stop the run (cleanly, with a checkpoint) once its processes (rollout workers, the policy worker, the "
        "learner, the receiver) have been restarted more than this many times within 5 minutes.",
    )

    def __post_init__(self):
        """A run given neither budget gets both defaults; one given alone is the only budget (the other None)."""
        if self.train_for_env_steps is None and self.train_for_seconds is None:
            object.__setattr__(self, "train_for_env_steps", DEFAULT_ENV_STEPS)
            object.__setattr__(self, "train_for_seconds", DEFAULT_SECONDS)

    def budget_used(self, env_steps: int, elapsed_sec: float) -> float:
        """How far a run is through its budgets, 0 to 1: the larger part used of those that apply (the run
        stops at the first one reached). `elapsed_sec`: this run's seconds so far."""
        used = [env_steps / self.train_for_env_steps] if self.train_for_env_steps is not None else []
        used += [elapsed_sec / self.train_for_seconds] if self.train_for_seconds is not None else []
        return min(1.0, max(used))
