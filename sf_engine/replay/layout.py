"""The replay buffer's arrays in the run's shared memory (sf_engine.runtime.shared_buffers lays them out beside the
trajectory slots when --algo learns from replay). No torch here: the main process lays out the buffers.

The buffer is a ring of columns (C = columns, T = rollout): one column holds one env's trajectory of one slot,
T steps and its T + 1 observation rows, so each observation is stored once and a transition's next observation
(up to --n_step rows on) is in its own column. Capacity: C x T >= --replay_size transitions.
  replay.obs.<key> [C, T+1, *shape] (the env's dtype), the raw steps (sf_engine.replay.transform.RAW_ARRAYS):
  replay.actions [C, T, *action_shape], replay.rewards [C, T] float32, replay.terminated, replay.truncated and
  replay.valid [C, T] bool, replay.policy_version [C, T] int64 (the version that acted); what the algorithm's
  replay transform keeps besides (its `arrays`: the n-step returns, a sequence's recurrent states, ...);
  replay.priorities [tree_size(C x T)] float64 with --prioritized (sf_engine.replay.sum_tree; a sample's
  priority sits at the leaf of its first row); replay.counters [4] int64: REPLAY_NEXT (the column written next),
  REPLAY_FILLED (columns holding data), REPLAY_INSERTED (env steps inserted, all runs of the experiment),
  REPLAY_SAMPLED (transitions trained on).
"""

from __future__ import annotations

from sf_engine.replay.sum_tree import tree_size
from sf_engine.replay.transform import RAW_ARRAYS, replay_transform

REPLAY_PREFIX = "replay."
REPLAY_NEXT, REPLAY_FILLED, REPLAY_INSERTED, REPLAY_SAMPLED = range(4)


def replay_columns(replay_size: int, rollout: int) -> int:
    """Columns of `rollout` transitions that hold at least `replay_size` transitions."""
    return -(-replay_size // rollout)


def replay_layout(cfg, spec, state: int = 0) -> dict:
    """name -> (shape, dtype) of the replay buffer's arrays (names start with REPLAY_PREFIX); {} when the run's
    algorithm learns on the slots as they come. `state`: floats of recurrent state per env (the slots')."""
    if not cfg.uses_replay:
        return {}
    rollout = cfg.sampler.rollout
    columns = replay_columns(cfg.replay.replay_size, rollout)
    layout = {
        f"{REPLAY_PREFIX}obs.{key}": ((columns, rollout + 1) + tuple(shape), dtype) for key, shape, dtype in spec.obs
    }
    for name, (shape, dtype) in RAW_ARRAYS.items():
        if shape is None:  # the action's
            shape, dtype = tuple(spec.action.buffer_shape), spec.action.dtype
        layout[f"{REPLAY_PREFIX}{name}"] = ((columns, rollout) + shape, dtype)
    own = replay_transform(cfg).arrays(columns, rollout, state)
    layout |= {f"{REPLAY_PREFIX}{name}": shape_dtype for name, shape_dtype in own.items()}
    layout[f"{REPLAY_PREFIX}counters"] = ((4,), "int64")
    if cfg.replay.prioritized:
        layout[f"{REPLAY_PREFIX}priorities"] = ((tree_size(columns * rollout),), "float64")
    return layout
