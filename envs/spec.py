"""What the engine needs to know of an env: its observation entries, action space, family and frameskip.
Probed once by the main process (probe.probe_env_spec) and handed to every role in the run plan; the
Gymnasium spaces it is read from (obs_entries, action_spec), and the check that an env made later has
the same (check_same_spaces)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

ACTION_MASK_KEY = "action_mask"  # an observation entry of legal actions (PettingZoo's name): 1 legal, 0 not
TO_MOVE_KEY = "to_move"  # turn-based multi-agent envs: an entry [1], 1.0 where the row's agent is to move


class EnvError(ValueError):
    """An env that cannot be made or used: the message names the env and what is wrong."""


def is_image(shape: tuple, dtype: str) -> bool:
    """An observation entry the model treats as an image: uint8 with 3 dimensions ([H, W, C] or [C, H, W])."""
    return len(shape) == 3 and dtype == "uint8"


@dataclass(frozen=True)
class ActionSpec:
    """kind: 'discrete' (nvec = (n,)), 'multi_discrete' (nvec = sizes), 'multi_binary' (shape = (bits,)),
    'continuous' (shape, low, high), or 'composite': a Tuple or Dict action space, whose `parts` are the specs
    of its sub-spaces in order (none composite) and `keys` a Dict's keys (empty for a Tuple).
    `start`: the env's first action value per dimension (Gymnasium's Discrete start).
    A composite action is one float32 row: each part's columns side by side (a Discrete part one column)."""

    kind: str
    nvec: tuple = ()
    start: tuple = ()
    shape: tuple = ()
    low: tuple = ()
    high: tuple = ()
    parts: tuple = ()
    keys: tuple = ()

    @property
    def width(self) -> int:
        """Columns of one action in a buffer row (a Discrete action is 1)."""
        if self.kind == "composite":
            return sum(part.width for part in self.parts)
        return {"discrete": 1, "multi_discrete": len(self.nvec)}.get(self.kind, self.shape[0] if self.shape else 0)

    @property
    def part_columns(self) -> list:
        """A composite action's (part, first column, end column) in its buffer row."""
        edges = np.cumsum([0] + [part.width for part in self.parts]).tolist()
        return list(zip(self.parts, edges[:-1], edges[1:]))

    @property
    def buffer_shape(self) -> tuple:
        return () if self.kind == "discrete" else (self.width,)

    @property
    def dtype(self) -> str:
        return "float32" if self.kind in ("continuous", "composite") else "int64"

    @functools.cached_property
    def _to_env(self) -> tuple:
        """(low, high) float32 arrays of continuous actions, or (the start per dimension, or None at 0)."""
        if self.kind == "continuous":
            return np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        return (np.asarray(self.start) if any(self.start) else None,)

    def env_actions(self, actions: np.ndarray):
        """The env's actions of the policy's [B, ...]: continuous ones clipped to the bounds, discrete ones from
        the env's first value (Gymnasium's Discrete start; the policy picks 0..n-1), bits as int8; a composite
        action's parts as a tuple (or a dict) of such batches, as Gymnasium's vector envs take them."""
        if self.kind == "composite":
            batches = [part.env_actions(part.from_columns(actions[:, lo:hi])) for part, lo, hi in self.part_columns]
            return dict(zip(self.keys, batches)) if self.keys else tuple(batches)
        if self.kind == "continuous":
            return np.clip(actions, *self._to_env)
        if self.kind == "multi_binary":
            return actions.astype(np.int8)
        start = self._to_env[0]
        return actions if start is None else actions + start

    def from_columns(self, columns: np.ndarray) -> np.ndarray:
        """A part's actions [B, ...] in its own dtype, from its float32 columns [B, width] of a composite row."""
        if self.kind == "continuous":
            return columns
        return columns.astype(np.int64)[:, 0] if self.kind == "discrete" else columns.astype(np.int64)

    def env_action(self, action: np.ndarray):
        """The env's action of one row's action (a single env's step, as a PettingZoo env takes it)."""
        batch = self.env_actions(np.asarray(action)[None])
        if self.kind == "discrete":
            return int(batch[0])
        if self.kind == "composite":
            parts = [int(b[0]) if part.kind == "discrete" else b[0] for part, b in zip(self.parts, _values(batch))]
            return dict(zip(self.keys, parts)) if self.keys else tuple(parts)
        return batch[0]


def _values(batch) -> list:
    return list(batch.values()) if isinstance(batch, dict) else list(batch)


@dataclass(frozen=True)
class EnvSpec:
    """What the buffers and the model need to know of an env (probed once by the runner).
    obs: tuple of (key, shape, dtype); a plain Box observation is the single key 'obs'."""

    obs: tuple
    action: ActionSpec
    family: str = "classic"
    frameskip: int = 1
    mask_from_info: bool = False  # the env gives its action mask in info['action_mask'] (envs.masks)
    agents: tuple = ()  # a PettingZoo env's possible agents: each game is len(agents) rows (envs.multiagent)
    turn_based: bool = False  # a PettingZoo AECEnv: only the agent to move acts
    layout: object = None  # an envs.observations.ObsLayout where the env's observations are made flat entries
    device: bool = False  # a device env (envs.device): sampled in device mode, on the run's --device

    @property
    def num_agents(self) -> int:
        """Rows per game: 1 for a single-agent env."""
        return max(1, len(self.agents))

    @property
    def is_dict(self) -> bool:
        return [key for key, _, _ in self.obs] != ["obs"]

    @property
    def action_mask(self) -> bool:
        """Whether an observation entry ACTION_MASK_KEY [sum(nvec)] says which actions are legal."""
        return any(key == ACTION_MASK_KEY for key, _, _ in self.obs)

    @property
    def has_image(self) -> bool:
        """Whether some observation entry is an image (see is_image)."""
        return any(is_image(shape, dtype) for _, shape, dtype in self.obs)


def obs_entries(env_id: str, space) -> tuple:
    """(key, shape, dtype) of each entry of an observation space (a plain Box is the entry 'obs')."""
    from gymnasium import spaces

    items = space.spaces.items() if isinstance(space, spaces.Dict) else [("obs", space)]
    entries = []
    for key, sub in items:
        if not isinstance(sub, spaces.Box) or not np.issubdtype(sub.dtype, np.number):
            raise EnvError(
                f"--env {env_id}: observation {key!r} is {sub}; supported are numeric Box spaces (vectors, uint8 "
                f"images) and a Dict of them that may also hold Discrete, MultiDiscrete, MultiBinary, text and Dict "
                f"parts (a lone {type(sub).__name__}: make it a part of a Dict)"
            )
        # a 3-D grid of small integers (a PettingZoo board's 0/1 planes) is stored as uint8, exactly, and
        # seen as an image: a convolution sees a line of four where an MLP sees 84 unrelated numbers
        grid = (
            len(sub.shape) == 3
            and np.issubdtype(sub.dtype, np.integer)
            and np.all(sub.low >= 0)
            and np.all(sub.high <= 255)
        )
        dtype = "uint8" if sub.dtype == np.uint8 or grid else "float32"
        entries.append((str(key), tuple(int(d) for d in sub.shape), dtype))
    return tuple(entries)


def observation_space(obs: tuple):
    """The Gymnasium space of observation entries `obs` ((key, shape, dtype), as obs_entries reads them), the
    action mask left out: a Dict of Boxes, or the Box alone for a plain Box observation. The bounds are the
    dtype's (uint8: [0, 255]; float32: unbounded), not the env's: an entry holds no more. What a user's encoder
    factory is given, in any process (sf_engine.model.encoders)."""
    from gymnasium import spaces

    boxes = {
        key: spaces.Box(0, 255, shape, np.uint8) if dtype == "uint8" else spaces.Box(-np.inf, np.inf, shape, np.float32)
        for key, shape, dtype in obs
        if key != ACTION_MASK_KEY
    }
    return spaces.Dict(boxes) if [key for key, _, _ in obs] != ["obs"] else boxes["obs"]


def action_space(action: ActionSpec):
    """The Gymnasium space of `action` (Discrete with its start, MultiDiscrete, MultiBinary, a Box of float32, or a
    Tuple or Dict of them): what a user's whole network (sf_engine.model.user_model) is given, in any process."""
    from gymnasium import spaces

    if action.kind == "composite":
        parts = [action_space(part) for part in action.parts]
        return spaces.Dict(dict(zip(action.keys, parts))) if action.keys else spaces.Tuple(parts)
    if action.kind == "discrete":
        return spaces.Discrete(action.nvec[0], start=action.start[0] if action.start else 0)
    if action.kind == "multi_discrete":
        return spaces.MultiDiscrete(list(action.nvec), start=list(action.start) if action.start else None)
    if action.kind == "multi_binary":
        return spaces.MultiBinary(action.shape[0])
    return spaces.Box(np.asarray(action.low, np.float32), np.asarray(action.high, np.float32), dtype=np.float32)


SUPPORTED_ACTIONS = "Discrete, MultiDiscrete, MultiBinary, a 1-D float Box, or a Tuple or Dict of them"


def action_spec(env_id: str, space, within: str = "") -> ActionSpec:
    """The ActionSpec of a Gymnasium action space, or EnvError naming what is not supported. `within`: the
    place of a sub-space in a Tuple or Dict (for the message)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return ActionSpec("discrete", nvec=(int(space.n),), start=(int(space.start),))
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return ActionSpec(
            "multi_discrete", nvec=tuple(int(n) for n in space.nvec), start=tuple(int(x) for x in space.start)
        )
    if isinstance(space, spaces.MultiBinary) and len(space.shape) == 1:
        return ActionSpec("multi_binary", shape=tuple(space.shape))
    if isinstance(space, spaces.Box) and len(space.shape) == 1 and np.issubdtype(space.dtype, np.floating):
        return ActionSpec(
            "continuous",
            shape=tuple(space.shape),
            low=tuple(float(x) for x in space.low),
            high=tuple(float(x) for x in space.high),
        )
    if isinstance(space, (spaces.Tuple, spaces.Dict)) and not within and len(space.spaces):
        named = space.spaces.items() if isinstance(space, spaces.Dict) else enumerate(space.spaces)
        parts = tuple(action_spec(env_id, sub, f" (its part {key!r})") for key, sub in named)
        return ActionSpec("composite", parts=parts, keys=tuple(space.spaces) if isinstance(space, spaces.Dict) else ())
    raise EnvError(f"--env {env_id}: action space {space}{within} is not supported ({SUPPORTED_ACTIONS} are)")


def _describe(obs: tuple, action: ActionSpec) -> str:
    entries = ", ".join(f"{key} {dtype}{list(shape)}" for key, shape, dtype in obs)
    size = list(action.nvec or action.shape or action.keys or [part.kind for part in action.parts])
    bounds = f" in [{min(action.low):g}, {max(action.high):g}]" if action.kind == "continuous" else ""
    return f"observation {entries}, {action.kind} actions {size}{bounds}"


def check_same_spaces(env_id: str, planned: tuple, obs_space, action_space, now: str, then: str) -> None:
    """EnvError unless `obs_space` and `action_space` (of the env `now` names) read as `planned`, the
    (observation entries, action spec) of the env `then` names: the shared buffers and the model are
    laid out once, from the env probed at the start."""
    seen = (obs_entries(env_id, obs_space), action_spec(env_id, action_space))
    if seen != tuple(planned):
        raise EnvError(
            f"--env {env_id}: {now} has {_describe(*seen)} where {then} had {_describe(*planned)}: the "
            f"observation and action spaces must be the same in every env made, at every reset"
        )
