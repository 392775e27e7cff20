"""The replay buffer's arrays in the run's shared memory (sf_engine.runtime.shared_buffers lays them out beside the
trajectory slots when --algo learns from replay). No torch here: the main process lays out the buffers.

The buffer is a ring of columns (C = columns, T = rollout): one column holds one env's trajectory of one slot,
T steps and its T + 1 observation rows, so each observation is stored once and a transition's next observation
(up to --n_step rows on) is in its own column. Capacity: C x T >= --replay_size transitions.
  replay.obs.<key> [C, T+1, *shape] (the env's dtype), replay.actions [C, T, *action_shape],
  replay.returns [C, T] float32 (the n-step discounted rewards), replay.steps [C, T] int16 (n: the next
  observation is row t + n), replay.discounts [C, T] float32 (gamma ** n, 0 after a terminated step),
  replay.trainable [C, T] bool, replay.policy_version [C, T] int64 (the version that acted);
  replay.priorities [tree_size(C x T)] float64 with --prioritized (sf_engine.replay.sum_tree; with --algo r2d2
  a sequence's priority sits at its start's leaf, sf_engine.replay.sequences);
  --algo r2d2 (sequences): replay.rnn_states [C, T+1, H] float32 (the recurrent state each row was acted from,
  as the slot holds it) and replay.episode_start [C, T+1] bool (the state is zeroed before that row);
  replay.counters [4] int64: REPLAY_NEXT (the column written next), REPLAY_FILLED (columns holding data),
  REPLAY_INSERTED (env steps inserted, all runs of the experiment), REPLAY_SAMPLED (transitions trained on).
"""

from __future__ import annotations

from sf_engine.config.algorithms import SEQUENCES
from sf_engine.replay.sum_tree import tree_size

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
    steps = (columns, rollout)
    layout |= {
        f"{REPLAY_PREFIX}actions": (steps + tuple(spec.action.buffer_shape), spec.action.dtype),
        f"{REPLAY_PREFIX}returns": (steps, "float32"),
        f"{REPLAY_PREFIX}steps": (steps, "int16"),
        f"{REPLAY_PREFIX}discounts": (steps, "float32"),
        f"{REPLAY_PREFIX}trainable": (steps, "bool"),
        f"{REPLAY_PREFIX}policy_version": (steps, "int64"),
        f"{REPLAY_PREFIX}counters": ((4,), "int64"),
    }
    if cfg.algorithm.data == SEQUENCES:  # sequences replayed from the state they were acted from
        layout[f"{REPLAY_PREFIX}rnn_states"] = ((columns, rollout + 1, state), "float32")
        layout[f"{REPLAY_PREFIX}episode_start"] = ((columns, rollout + 1), "bool")
    if cfg.replay.prioritized:
        layout[f"{REPLAY_PREFIX}priorities"] = ((tree_size(columns * rollout),), "float64")
    return layout
