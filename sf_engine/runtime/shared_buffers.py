"""Shared-memory trajectory slots and control counters: allocated once by the runner, attached by name.

All arrays of a run live in one file in a tmpfs (`--shm_dir`, /dev/shm by default) with a new random
name per run (see shm_path), mapped by every process as numpy views (rollout workers never import
torch). The main process creates it (exclusively, mode 0600) and finally unlinks it; a file left by a
killed run of the same experiment is removed by the next start (sf_engine.run.experiment).

Slot fields (S = slots, T = rollout, E = envs per split): obs.<key> [S, T+1, E, *shape], one array
per observation key in the env's dtype (uint8 images stay uint8; row T is the bootstrap observation),
and every field of sf_engine.algo.batch.SLOT_FIELDS that the run has: [S, T, E, ...], or [S, T+1, E, ...]
for the fields with a bootstrap row (policy_id: row T is the policy that would act next; rnn_states:
the state after the last action, before row T's zeroing, which GAE's bootstrap starts from).
Beside the slots, with several policies (P = trained policies + pool snapshots): policy_episodes
[W, P, 2] float64, per rollout worker and acting policy, episodes finished and the sum of their
objectives (return, or the env's true_objective), written by that worker only (PBT reads them); in a two-player
game, game_results [W, P, P, 3] float64, per worker the games each acting policy (row) played against each (column)
that it won, drew and lost, every game counted from both sides, and opponent_weights [P] float64, the chance of each
pool snapshot to be drawn as an opponent, written by the learner (sf_engine.selfplay); with --league,
match_chances [num_policies, P] float64, the chance of each acting policy to be the opponent of each trained one in
a game it leads, written by the learner (sf_engine.selfplay.league); with a
recurrent core (H = the model's state_size): rnn_current [W, splits, E, H] float32, the hidden state
after each env's latest action, carried by the policy worker from one request to the next.
Control arrays: env_steps [num_workers + R] int64 (each worker writes only its own entry; entry
num_workers + i: the env steps sampler node i reported, written by the receiver),
param_seq [P] int64 (P = --num_policies: seqlock of each policy's shared weights, see weights.py),
stop [1] int64, heartbeat [4 + num_workers + num_learners - 1 + num_policy_workers - 1] float64 (time.monotonic() of
each process's latest loop, see wiring.heartbeat_index), slot_owner [S] int64 (the rollout worker filling a slot,
WRITING for the receiver, NO_OWNER when none; see slot_pool), slot_filler [S] int64 (worker x splits + split: the
split that filled a slot last, written as it hands the slot over; --deterministic orders a round's slots by it),
slot_rows [S] int64 (env-step rows written into a slot and not trained yet), params_wanted [P, readers] int64 (set
by the supervisor when a restarted reader needs a policy's shared weights again), weights_generation [P] int64
(bumped each time a learner makes a policy's shared vector, or by the supervisor when the learner died: a reader
holding an older one takes the new one),
published_copy [P] int64 (the version + 1 whose weights the file below holds, 0: none), run_started [1]
float64 (time.monotonic() when this run started: the same clock in every process), learner_stage [2] float64
(the learner's stage now, as its position in LearnerStage or -1, and since when: see stats.stages.StageTimer),
node_groups [1] int64 (--dist_init: why the node groups' learner ranks stopped, GROUP_* below, read by the runner).
Beside the file, `<file>.weights` (created empty with it, sized by the learner, which knows the model):
last_published [P, F] float32, each policy's weights as published last (F = the model's flat state size),
so that they outlive a learner that dies (see weights.py).
With --num_remote_samplers R > 0: remote_books [R, 3] int64, per sampler node the env steps it
reported stepped, those placed in local slots, and those dropped with a lost node (the receiver's).
With a replay buffer (--algo dqn): its arrays, named replay.<rank>.* (sf_engine.replay.layout; one buffer per
learner rank), in `replay` (one dict per rank); and replay_books [6 x ranks + 1] int64, the env steps each rank
inserted (trainable, not trainable, skipped for a non-finite value), those of each reported in a Training message,
and the number of the last report, so that a restarted learner reports what a dead one inserted, once
(sf_engine.roles.replay_source.InsertBooks).
"""

from __future__ import annotations

import mmap
import os
import secrets
import time

import numpy as np

from sf_engine.algo.batch import ALWAYS, BOOTSTRAP, RECURRENT, SEVERAL_POLICIES, SLOT_FIELDS, TURN_BASED
from sf_engine.envs.spec import EnvSpec
from sf_engine.replay.layout import replay_array, replay_layout

_ALIGN = 64
HEARTBEAT_ROLES = 4  # learner, policy worker, evaluator, receiver; then the rollout workers (wiring.heartbeat_index)
WEIGHT_READERS = ("policy_worker", "evaluator", "receiver", "device_sampler")  # the roles that read shared weights
SLOT_FIELD_NAMES = frozenset(field.name for field in SLOT_FIELDS)
NO_OWNER = -1  # slot_owner of a slot nobody is writing (free, full, or being trained on)
WRITING = -2  # slot_owner of a slot the receiver is writing (freed by the supervisor if it dies meanwhile)
LEARNING = -3  # slot_owner of a slot the learner took (freed by the supervisor if it dies meanwhile)
# node_groups[0], why the node groups' learner ranks stopped: not, the env-step budget of all of them, another's stop
GROUP_RUNNING, GROUP_BUDGET, OTHER_GROUP_STOPPED = 0, 1, 2


def buffer_layout(cfg, spec: EnvSpec, state: int) -> dict:
    """name -> (shape, dtype) of every shared array of a run whose config `cfg` is resolved (no 'auto');
    `state`: floats of recurrent state per env (0 without a core, see sf_engine.model.shape.state_size)."""
    slots, rollout, envs, workers = (
        cfg.num_slots,
        cfg.sampler.rollout,
        cfg.sampler.envs_per_split,
        cfg.sampler.num_workers,
    )
    policies = cfg.policies.num_acting  # the trained ones, then the opponent pool's snapshots
    p = cfg.parallel
    present = {
        ALWAYS,
        *([TURN_BASED] if spec.turn_based else []),
        *([SEVERAL_POLICIES] if policies > 1 else []),
        *([RECURRENT] if state else []),
    }
    layout = {f"obs.{key}": ((slots, rollout + 1, envs) + tuple(shape), dtype) for key, shape, dtype in spec.obs}
    for field in SLOT_FIELDS:
        if field.present in present:
            rows = rollout + 1 if field.rows == BOOTSTRAP else rollout
            extra = (
                spec.action.buffer_shape if field.name == "actions" else (state,) if field.name == "rnn_states" else ()
            )
            layout[field.name] = ((slots, rows, envs) + tuple(extra), field.dtype or spec.action.dtype)
    if state:
        layout["rnn_current"] = ((workers, cfg.sampler.worker_num_splits, envs, state), "float32")
    if policies > 1:  # per worker and policy: episodes finished and the sum of their objectives (PBT's figure)
        layout["policy_episodes"] = ((workers, policies, 2), "float64")
    if cfg.policies.counts_games(spec.agents):  # per worker: games of each acting policy against each (selfplay)
        layout["game_results"] = ((workers, policies, policies, 3), "float64")
        layout["opponent_weights"] = ((policies,), "float64")
        if cfg.policies.league:  # per trained policy: the chance of each acting policy to be its opponent
            layout["match_chances"] = ((cfg.policies.num_policies, policies), "float64")
    remote = cfg.remote.num_remote_samplers
    if remote:  # per sampler node: env steps it reported stepped, placed in local slots, dropped with it
        layout["remote_books"] = ((remote, 3), "int64")
    if cfg.uses_replay:  # the replay buffer (sf_engine.replay.layout), and the books of what went into it
        books = 6 * p.num_learners + 1
        layout |= replay_layout(cfg, spec, state) | {"replay_books": ((books,), "int64")}
    return layout | {
        "env_steps": ((workers + remote,), "int64"),
        "param_seq": ((policies,), "int64"),
        "stop": ((1,), "int64"),
        "heartbeat": ((HEARTBEAT_ROLES + workers + p.num_learners - 1 + p.num_policy_workers - 1,), "float64"),
        "slot_owner": ((slots,), "int64"),
        "slot_filler": ((slots,), "int64"),
        "slot_rows": ((slots,), "int64"),
        "params_wanted": ((policies, len(WEIGHT_READERS)), "int64"),
        "weights_generation": ((policies,), "int64"),
        "published_copy": ((policies,), "int64"),
        "run_started": ((1,), "float64"),
        "learner_stage": ((2,), "float64"),
        "node_groups": ((1,), "int64"),
    }


def slot_fields(layout: dict) -> tuple:
    """Names (as in `layout`) of the arrays that hold one slot's trajectory, in layout order."""
    return tuple(name for name in layout if name.startswith("obs.") or name in SLOT_FIELD_NAMES)


def _offsets(layout: dict) -> tuple[dict, int]:
    offsets, total = {}, 0
    for name, (shape, dtype) in layout.items():
        offsets[name] = total
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        total += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, max(total, _ALIGN)


def required_bytes(layout: dict) -> int:
    return _offsets(layout)[1]


SHM_PREFIX = "sf_engine_"
WEIGHTS_SUFFIX = ".weights"  # the file of the last published weights, beside the run's
TRAINING_STATE_SUFFIX = ".training"  # the learner's whole training state, kept every second (roles.learner)
# the files beside the run's own: removed with it (and the kept state's half-written one)
RENDEZVOUS_SUFFIX = ".ranks"  # the learner ranks' rendezvous file (--num_learners), removed before they start
SIDE_SUFFIXES = (WEIGHTS_SUFFIX, TRAINING_STATE_SUFFIX, TRAINING_STATE_SUFFIX + ".tmp", RENDEZVOUS_SUFFIX)


def shm_path(shm_dir: str, experiment_dir: str) -> str:
    """A new, unpredictable name per run (the experiment's name, then 16 random hex digits): nobody can
    prepare a file or link under it. processes.json records it, so the next start of the experiment
    removes what a killed run left."""
    key = os.path.basename(os.path.abspath(experiment_dir))[:64]
    return os.path.join(shm_dir, f"{SHM_PREFIX}{key}_{secrets.token_hex(8)}")


class SharedBuffers:
    """Numpy views of every shared array of a run; `create` in the runner, `attach` in children."""

    def __init__(self, path: str, layout: dict, create: bool):
        self.path, self.layout = path, layout
        offsets, total = _offsets(layout)
        # created exclusively, never through a link: a file that is already there is not ours
        flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, total)
            self._mmap = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        if create:  # the file of the last published weights, empty until the learner sizes it
            os.close(os.open(path + WEIGHTS_SUFFIX, flags, 0o600))
        self.owner = create
        self.obs = {}
        for field in SLOT_FIELDS:  # the slot fields a run lacks (see SlotField.present) stay None
            setattr(self, field.name, None)
        self.rnn_current = None  # recurrent runs only
        self.policy_episodes = None  # runs of several policies only
        self.game_results = self.opponent_weights = None  # two-player games of several acting policies only
        self.match_chances = None  # --league only
        self.remote_books = None  # runs with sampler nodes only
        self.replay_books = None  # runs with a replay buffer only
        self._last_published = None  # mapped on first use (last_published)
        # each learner rank's replay buffer: its arrays by name within it ('obs.<key>', 'returns', ...)
        self.replay: list[dict] = []
        for name, (shape, dtype) in layout.items():
            count = int(np.prod(shape))
            array = np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offsets[name]).reshape(shape)
            if (replay := replay_array(name)) is not None:
                rank, own = replay
                self.replay += [{} for _ in range(rank + 1 - len(self.replay))]
                self.replay[rank][own] = array
            elif name.startswith("obs."):
                self.obs[name[4:]] = array
            else:
                setattr(self, name, array)

    @classmethod
    def create(cls, path: str, layout: dict) -> "SharedBuffers":
        buffers = cls(path, layout, create=True)
        buffers.slot_owner[:] = NO_OWNER
        if "run_started" in layout:  # a run's layout (buffer_layout) has it
            buffers.run_started[0] = time.monotonic()
        return buffers

    def take_rows(self, slots) -> int:
        """The env steps held in `slots` (rows written x envs per split), which leave the books of steps
        not trained yet: their row counts are reset."""
        steps = int(self.slot_rows[slots].sum()) * self.log_probs.shape[2]
        self.slot_rows[slots] = 0
        return steps

    @classmethod
    def attach(cls, path: str, layout: dict) -> "SharedBuffers":
        return cls(path, layout, create=False)

    def last_published(self, floats: int, allocate: bool):
        """[P, floats] float32: each policy's weights as the learner published them last, in the file beside
        this one; sized on first use by the learner that knows the model's flat state size (`allocate`),
        None for a reader where it never was."""
        policies = self.param_seq.shape[0]
        if self._last_published is None:
            fd = os.open(self.path + WEIGHTS_SUFFIX, os.O_RDWR | os.O_NOFOLLOW)
            try:
                size = policies * floats * 4
                if os.fstat(fd).st_size < size:
                    if not allocate:
                        return None
                    os.posix_fallocate(fd, 0, size)  # ENOSPC now, not SIGBUS at a write into a full tmpfs
                mapped = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._last_published = np.frombuffer(mapped, np.float32, policies * floats).reshape(policies, floats)
        return self._last_published

    def release(self) -> None:
        """Unlink the backing files (creator only). Views stay valid until the process exits."""
        if self.owner:
            for path in [self.path] + [self.path + suffix for suffix in SIDE_SUFFIXES]:
                if os.path.exists(path):
                    os.unlink(path)
            self.owner = False
