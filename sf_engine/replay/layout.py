"""The replay buffer's arrays in the run's shared memory (sf_engine.runtime.shared_buffers lays them out beside the
trajectory slots when --algo learns from replay). No torch here: the main process lays out the buffers.

The buffer is a ring of columns (C = columns, T = rollout): one column holds one env's trajectory of one slot,
T steps and its T + 1 observation rows, so each observation is stored once and a transition's next observation
(up to --n_step rows on) is in its own column. Capacity: C x T >= --replay_size transitions. With --num_learners
N, each rank has a buffer of its own (a 1/N share of --replay_size) which it fills with its share of the slots and
samples its minibatches from. Rank r's arrays, named replay.r.* (replay.0.* with one learner):
  .obs.<key> [C, T+1, *shape] (the env's dtype), the raw steps (sf_engine.replay.transform.RAW_ARRAYS):
  .actions [C, T, *action_shape], .rewards [C, T] float32, .terminated, .truncated and .valid [C, T] bool,
  .policy_version [C, T] int64 (the version that acted); what the algorithm's
  replay transform keeps besides (its `arrays`: the n-step returns, a sequence's recurrent states, ...);
  .priorities [tree_size(C x T)] float64 with --prioritized (sf_engine.replay.sum_tree; a sample's
  priority sits at the leaf of its first row); .counters [4] int64: REPLAY_NEXT (the column written next),
  REPLAY_FILLED (columns holding data), REPLAY_INSERTED (env steps inserted, all runs of the experiment),
  REPLAY_SAMPLED (transitions trained on).
"""

from __future__ import annotations

from sf_engine.replay.sum_tree import tree_size
from sf_engine.replay.transform import RAW_ARRAYS, replay_transform

REPLAY_PREFIX = "replay."  # every replay array's name starts with it, then its rank's number and a dot
REPLAY_NEXT, REPLAY_FILLED, REPLAY_INSERTED, REPLAY_SAMPLED = range(4)


def replay_columns(replay_size: int, rollout: int) -> int:
    """Columns of `rollout` transitions that hold at least `replay_size` transitions."""
    return -(-replay_size // rollout)


def replay_prefix(rank: int) -> str:
    """The start of the names of learner rank `rank`'s replay arrays."""
    return f"{REPLAY_PREFIX}{rank}."


def replay_array(name: str) -> tuple[int, str] | None:
    """(rank, name within its buffer) of a replay array's name in the layout ('replay.1.obs.x': (1, 'obs.x')); None
    for any other array's."""
    if not name.startswith(REPLAY_PREFIX):
        return None
    rank, _, own = name.removeprefix(REPLAY_PREFIX).partition(".")
    return int(rank), own


def rank_replay_size(cfg) -> int:
    """The transitions each learner rank's buffer holds at least: its share of --replay_size."""
    return -(-cfg.replay.replay_size // cfg.parallel.num_learners)


def replay_layout(cfg, spec, state: int = 0) -> dict:
    """name -> (shape, dtype) of the replay buffers' arrays, one buffer per learner rank (names start with
    replay_prefix(rank)); {} when the run's algorithm learns on the slots as they come. `state`: floats of recurrent
    state per env (the slots')."""
    if not cfg.uses_replay:
        return {}
    rollout = cfg.sampler.rollout
    columns = replay_columns(rank_replay_size(cfg), rollout)
    one = {f"obs.{key}": ((columns, rollout + 1) + tuple(shape), dtype) for key, shape, dtype in spec.obs}
    for name, (shape, dtype) in RAW_ARRAYS.items():
        if shape is None:  # the action's
            shape, dtype = tuple(spec.action.buffer_shape), spec.action.dtype
        one[name] = ((columns, rollout) + shape, dtype)
    one |= replay_transform(cfg).arrays(columns, rollout, state)
    one["counters"] = ((4,), "int64")
    if cfg.replay.prioritized:
        one["priorities"] = ((tree_size(columns * rollout),), "float64")
    return {
        replay_prefix(rank) + name: shape_dtype
        for rank in range(cfg.parallel.num_learners)
        for name, shape_dtype in one.items()
    }
