"""Shared-memory trajectory slots and control counters: allocated once by the runner, attached by name.

All arrays of a run live in one file in a tmpfs (`--shm_dir`, /dev/shm by default) named after the
experiment, mapped by every process as numpy views (rollout workers never import torch). The runner
creates and finally unlinks it; a file left by a dead run of the same experiment is removed on start.

Slot field shapes (S = slots, T = rollout, E = envs per split):
  obs.<key>      [S, T+1, E, *shape]      one array per observation key, in the env's dtype (uint8 images
                                          stay uint8); row T is the bootstrap observation
  actions        [S, T, E, *action_shape] int64 (discrete) or float32 (continuous, unclipped sample)
  log_probs      [S, T, E]                float32 behaviour log-probability of the action
  values         [S, T, E]                float32 behaviour value estimate
  policy_version [S, T, E]                int64 version of the policy that acted
  rewards        [S, T, E]                float32
  terminated     [S, T, E]                bool, episode ended by the MDP (no bootstrap)
  truncated      [S, T, E]                bool, episode cut by a time limit (bootstrap from the last obs)
  valid          [S, T, E]                bool, False on the reset step that follows an episode end
With a recurrent core (--rnn gru|lstm; H = rnn_state_size):
  episode_start  [S, T+1, E]              bool, the obs at this row is the first of an episode: the
                                          hidden state is zeroed before acting on it (and in training)
  rnn_states     [S, T+1, E, H]           float32 hidden state the policy acted from at each row (after
                                          that zeroing; row T: the state after the last action, before
                                          row T's zeroing); the learner re-runs the core from it and
                                          bootstraps GAE from row T
  rnn_current    [W, splits, E, H]        float32 hidden state after each env's latest action, carried
                                          by the policy worker from one request to the next
Control arrays: env_steps [num_workers] int64 (each worker writes only its own entry),
param_seq [1] int64 (seqlock of the shared weights: odd while the learner writes), stop [1] int64,
heartbeat [3 + num_workers] float64 (time.monotonic() of each process's latest loop, see
`heartbeat_index`), slot_owner [S] int64 (the rollout worker filling a slot, -1 when none),
slot_rows [S] int64 (env-step rows written into a slot and not trained yet), params_wanted [1] int64
(set by the runner when a restarted policy worker needs the shared weights again).
"""
from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass

import numpy as np

_ALIGN = 64


@dataclass(frozen=True)
class ActionSpec:
    """kind: 'discrete' (nvec = (n,)), 'multi_discrete' (nvec = sizes), 'continuous' (shape, low, high).
    `start`: the env's first action value per dimension (Gymnasium's Discrete start)."""
    kind: str
    nvec: tuple = ()
    start: tuple = ()
    shape: tuple = ()
    low: tuple = ()
    high: tuple = ()

    @property
    def buffer_shape(self) -> tuple:
        return {"discrete": (), "multi_discrete": (len(self.nvec),)}.get(self.kind, self.shape)

    @property
    def dtype(self) -> str:
        return "float32" if self.kind == "continuous" else "int64"


@dataclass(frozen=True)
class EnvSpec:
    """What the buffers and the model need to know of an env (probed once by the runner).
    obs: tuple of (key, shape, dtype); a plain Box observation is the single key 'obs'."""
    obs: tuple
    action: ActionSpec
    family: str = "classic"
    frameskip: int = 1

    @property
    def is_dict(self) -> bool:
        return [key for key, _, _ in self.obs] != ["obs"]


def _has_image(spec: EnvSpec) -> bool:
    return any(len(shape) == 3 and dtype == "uint8" for _, shape, dtype in spec.obs)


def rnn_size(mcfg, spec: EnvSpec) -> int:
    """Units of the recurrent core (--rnn_size, or 256 with images and 64 without when 'auto')."""
    if mcfg.rnn_size != "auto":
        return int(mcfg.rnn_size)
    return 256 if _has_image(spec) and mcfg.encoder != "mlp" else 64


def separate_critic(mcfg, spec: EnvSpec) -> bool:
    """--actor_critic, with 'auto' resolved: separate for feed-forward models of vector observations."""
    if mcfg.actor_critic != "auto":
        return mcfg.actor_critic == "separate"
    return mcfg.rnn == "none" and not _has_image(spec)


def rnn_state_size(mcfg, spec: EnvSpec) -> int:
    """Floats of hidden state per env: 0 without --rnn; LSTMs keep (h, c); 'separate' actor-critics
    have a core each."""
    if mcfg.rnn == "none":
        return 0
    return rnn_size(mcfg, spec) * (2 if mcfg.rnn == "lstm" else 1) * (2 if separate_critic(mcfg, spec) else 1)


def buffer_layout(cfg, spec: EnvSpec) -> dict:
    """name -> (shape, dtype) of every shared array of a run."""
    slots, rollout, envs = cfg.num_slots, cfg.sampler.rollout, cfg.sampler.envs_per_split
    step = (slots, rollout, envs)
    layout = {f"obs.{key}": ((slots, rollout + 1, envs) + tuple(shape), dtype) for key, shape, dtype in spec.obs}
    state = rnn_state_size(cfg.model, spec)
    if state:
        layout |= {"episode_start": ((slots, rollout + 1, envs), "bool"),
                   "rnn_states": ((slots, rollout + 1, envs, state), "float32"),
                   "rnn_current": ((cfg.sampler.num_workers, cfg.sampler.worker_num_splits, envs, state), "float32")}
    return layout | {
        "actions": (step + spec.action.buffer_shape, spec.action.dtype),
        "log_probs": (step, "float32"),
        "values": (step, "float32"),
        "policy_version": (step, "int64"),
        "rewards": (step, "float32"),
        "terminated": (step, "bool"),
        "truncated": (step, "bool"),
        "valid": (step, "bool"),
        "env_steps": ((cfg.sampler.num_workers,), "int64"),
        "param_seq": ((1,), "int64"),
        "stop": ((1,), "int64"),
        "heartbeat": ((3 + cfg.sampler.num_workers,), "float64"),
        "slot_owner": ((slots,), "int64"),
        "slot_rows": ((slots,), "int64"),
        "params_wanted": ((1,), "int64"),
    }


def heartbeat_index(role: str, index: int = 0) -> int:
    """Entry of `role` in the heartbeat array."""
    return {"learner": 0, "policy_worker": 1, "evaluator": 2}.get(role, 3 + index)


def _offsets(layout: dict) -> tuple[dict, int]:
    offsets, total = {}, 0
    for name, (shape, dtype) in layout.items():
        offsets[name] = total
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        total += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, max(total, _ALIGN)


def required_bytes(layout: dict) -> int:
    return _offsets(layout)[1]


def shm_path(shm_dir: str, experiment_dir: str) -> str:
    """One file per experiment: a leftover of a killed run is found and replaced by the next start."""
    key = os.path.abspath(experiment_dir).strip(os.sep).replace(os.sep, "_")
    return os.path.join(shm_dir, f"sf_engine_{key}"[:240])


class SharedBuffers:
    """Numpy views of every shared array of a run; `create` in the runner, `attach` in children."""

    def __init__(self, path: str, layout: dict, create: bool):
        self.path, self.layout = path, layout
        offsets, total = _offsets(layout)
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, total)
            self._mmap = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        self.owner = create
        self.obs = {}
        self.episode_start = self.rnn_states = self.rnn_current = None  # recurrent runs only
        for name, (shape, dtype) in layout.items():
            count = int(np.prod(shape))
            array = np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offsets[name]).reshape(shape)
            if name.startswith("obs."):
                self.obs[name[4:]] = array
            else:
                setattr(self, name, array)

    @classmethod
    def create(cls, path: str, layout: dict) -> "SharedBuffers":
        if os.path.exists(path):
            os.unlink(path)  # leftover of a dead run of this experiment
        buffers = cls(path, layout, create=True)
        buffers.slot_owner[:] = -1
        return buffers

    def take_rows(self, slots) -> int:
        """The env steps held in `slots` (rows written x envs per split), which leave the books of steps
        not trained yet: their row counts are reset."""
        steps = int(self.slot_rows[slots].sum()) * self.log_probs.shape[2]
        self.slot_rows[slots] = 0
        return steps

    def beat(self, role: str, index: int = 0) -> None:
        """A process's sign of life (the runner restarts one whose heartbeat stops)."""
        self.heartbeat[heartbeat_index(role, index)] = time.monotonic()

    @classmethod
    def attach(cls, path: str, layout: dict) -> "SharedBuffers":
        return cls(path, layout, create=False)

    def release(self) -> None:
        """Unlink the backing file (creator only). Views stay valid until the process exits."""
        if self.owner and os.path.exists(self.path):
            os.unlink(self.path)
            self.owner = False
