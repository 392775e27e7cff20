"""What the engine needs to know of an env: its observation entries, action space, family and frameskip.
Probed once by the main process (registry.probe_env_spec) and handed to every role in the run plan."""

from __future__ import annotations

from dataclasses import dataclass

ACTION_MASK_KEY = "action_mask"  # an observation entry of legal actions (PettingZoo's name): 1 legal, 0 not
TO_MOVE_KEY = "to_move"  # turn-based multi-agent envs: an entry [1], 1.0 where the row's agent is to move


def is_image(shape: tuple, dtype: str) -> bool:
    """An observation entry the model treats as an image: uint8 with 3 dimensions ([H, W, C] or [C, H, W])."""
    return len(shape) == 3 and dtype == "uint8"


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
    mask_from_info: bool = False  # the env gives its action mask in info['action_mask'] (envs.masks)
    agents: tuple = ()  # a PettingZoo env's possible agents: each game is len(agents) rows (envs.multiagent)
    turn_based: bool = False  # a PettingZoo AECEnv: only the agent to move acts

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
