"""Observation spaces beyond numeric Boxes, made into the flat entries the engine stores: a Dict's Discrete and
MultiDiscrete parts as one-hot vectors or as indices into a learned embedding table (--discrete_obs), its text parts
(Gymnasium's Text, MiniGrid's mission) as a bag of tokens over a vocabulary built from the space, or left out
(--text_obs), and nested Dicts flattened ('outer/inner').

An env whose observation needs this is wrapped, one env at a time before it is vectorized, by FlatObservation: the
vector env, the shared buffers and the model only ever see a flat Dict of Boxes. `load_policy(...).act` converts a
batch of the env's own observations the same way (ObsLayout.batch). A plain Box or a flat Dict of numeric Boxes
needs none of this and is not wrapped.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from .spec import EnvError

VOCABULARY_SAMPLES = 2000  # missions drawn from a text space that is not Gymnasium's Text, to find its words
_WORD = re.compile(r"[A-Za-z0-9]+")


@dataclass(frozen=True)
class ObsPart:
    """One leaf of the env's observation: where it is (`path` of keys), its kind ('box', 'onehot', 'index' or 'text')
    and what the conversion needs: a box part's Box, the sizes and starts of a one-hot's (or an index's) dimensions,
    a text part's tokens (characters, or words where `words`). An index part's entry holds, per dimension, the row of
    one table of all its dimensions' values (the first dimension's rows first): the model looks them up."""

    path: tuple
    kind: str
    box: object = None  # a box part's Box
    sizes: tuple = ()
    starts: tuple = ()
    tokens: tuple = ()
    words: bool = False

    @property
    def key(self) -> str:
        return "/".join(self.path) if self.path else "obs"

    @property
    def width(self) -> int:
        if self.kind == "index":
            return len(self.sizes)
        return sum(self.sizes) if self.kind == "onehot" else len(self.tokens) + 1  # + 1: tokens not in the vocabulary

    @property
    def table_rows(self) -> int:
        """An index part's embedding table: one row per value of each dimension."""
        return sum(self.sizes)

    def convert(self, values) -> np.ndarray:
        """[B, ...] values of this part (a batch) -> its entry's float32 [B, width] (box parts: as they are)."""
        if self.kind == "box":
            return np.asarray(values)
        if self.kind in ("onehot", "index"):
            columns = np.asarray(values, np.int64).reshape(len(values), -1) - np.asarray(self.starts)
            rows_of_table = np.cumsum((0,) + self.sizes[:-1]) + np.clip(columns, 0, np.asarray(self.sizes) - 1)
            if self.kind == "index":
                return rows_of_table.astype(np.float32)
            out = np.zeros((len(columns), self.width), np.float32)
            out[np.arange(len(columns))[:, None], rows_of_table] = 1.0
            return out
        index = {token: i for i, token in enumerate(self.tokens)}
        out = np.zeros((len(values), self.width), np.float32)
        for row, text in enumerate(values):
            for token in _WORD.findall(str(text).lower()) if self.words else str(text):
                out[row, index.get(token, len(self.tokens))] += 1.0
        return out


@dataclass(frozen=True)
class ObsLayout:
    """How an env's observation becomes the engine's flat entries: its parts in order, and the text parts left out."""

    parts: tuple
    dropped: tuple = ()

    def index_tables(self) -> dict:
        """{entry key: table rows} of its index parts (--discrete_obs embed)."""
        return {part.key: part.table_rows for part in self.parts if part.kind == "index"}

    @property
    def space(self):
        """The flat Dict of Boxes the wrapped env observes."""
        from gymnasium import spaces

        return spaces.Dict(
            {
                part.key: part.box if part.kind == "box" else spaces.Box(0.0, np.inf, (part.width,), np.float32)
                for part in self.parts
            }
        )

    def one(self, obs) -> dict:
        """One env's observation -> its flat entries."""
        return {part.key: self._leaf(part, obs, batch=False) for part in self.parts}

    def batch(self, obs) -> dict:
        """A batch of observations (batch first, as a vector env or a user gives them) -> the flat entries."""
        return {part.key: self._leaf(part, obs, batch=True) for part in self.parts}

    @staticmethod
    def _leaf(part: ObsPart, obs, batch: bool):
        for key in part.path:
            obs = obs[key]
        if part.kind == "box":
            return obs
        values = obs if batch else [obs]
        converted = part.convert(list(values) if part.kind == "text" else np.asarray(values))
        return converted if batch else converted[0]


def observation_notes(env_id: str, spec) -> list:
    """The lines that say what became of the env's observation parts that are not numeric Boxes (EnvSpec `spec`)."""
    layout = spec.layout
    if layout is None:
        return []
    kinds = {"onehot": "one-hot", "index": "indices into a learned embedding", "text": "a bag of tokens"}
    made = [f"{part.key} as {kinds[part.kind]} [{part.width}]" for part in layout.parts if part.kind != "box"]
    lines = [f"--env {env_id}: observation parts made vectors: {', '.join(made)}"] if made else []
    if layout.dropped:
        lines.append(f"--env {env_id}: text observation {', '.join(layout.dropped)} left out (--text_obs drop)")
    return lines


def observation_layout(env_id: str, space, text: str = "bag", discrete: str = "onehot") -> ObsLayout | None:
    """The ObsLayout of `space`, or None where the engine takes it as it is (a numeric Box, a flat Dict of them).
    `text`: 'bag' (a bag of tokens) or 'drop' (left out); `discrete`: 'onehot' or 'embed' (indices into a learned
    table). EnvError names a part that cannot be converted."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict) and all(_numeric_box(sub) for sub in space.spaces.values()):
        return None
    if not isinstance(space, spaces.Dict):
        return None  # a single space: a Box, or one obs_entries refuses in one line
    parts, dropped = [], []
    for path, sub in _leaves(space.spaces, ()):
        part = _part(env_id, path, sub, text, "index" if discrete == "embed" else "onehot")
        (dropped if part is None else parts).append("/".join(path) if part is None else part)
    if not parts:
        raise EnvError(f"--env {env_id}: nothing is left of the observation once its text is left out (--text_obs)")
    return ObsLayout(tuple(parts), tuple(dropped))


def _numeric_box(space) -> bool:
    from gymnasium import spaces

    return isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.number)


def _leaves(items: dict, path: tuple):
    """(path, space) of every leaf of nested Dicts, in order."""
    from gymnasium import spaces

    for key, sub in items.items():
        if isinstance(sub, spaces.Dict):
            yield from _leaves(sub.spaces, path + (str(key),))
        else:
            yield path + (str(key),), sub


def _part(env_id: str, path: tuple, sub, text: str, discrete: str) -> ObsPart | None:
    from gymnasium import spaces

    if _numeric_box(sub):
        return ObsPart(path, "box", box=sub)
    if isinstance(sub, spaces.Discrete):
        return ObsPart(path, discrete, sizes=(int(sub.n),), starts=(int(sub.start),))
    if isinstance(sub, spaces.MultiDiscrete) and sub.nvec.ndim == 1:
        return ObsPart(path, discrete, sizes=tuple(int(n) for n in sub.nvec), starts=tuple(int(s) for s in sub.start))
    if isinstance(sub, spaces.MultiBinary) and len(sub.shape) == 1:
        return ObsPart(path, "box", box=spaces.Box(0, 1, sub.shape, np.int8))
    if isinstance(sub, spaces.Text) or _is_string_space(sub):
        if text == "drop":
            return None
        if isinstance(sub, spaces.Text):
            return ObsPart(path, "text", tokens=tuple(sorted(sub.character_set)))
        return ObsPart(path, "text", tokens=_words(sub), words=True)
    raise EnvError(
        f"--env {env_id}: observation {'/'.join(path)!r} is {sub}; supported are Box, Discrete, MultiDiscrete, "
        f"MultiBinary and text parts of a Dict (nested Dicts too)"
    )


def _is_string_space(space) -> bool:
    """A space of strings that is not Gymnasium's Text (MiniGrid's MissionSpace): its sample is a str."""
    try:
        return isinstance(space.sample(), str)
    except Exception:  # a space that cannot sample: not one of strings
        return False


def _words(space) -> tuple:
    """The words of a string space's missions, from VOCABULARY_SAMPLES of them (seeded: the same in every process)."""
    space.seed(0)
    words = set()
    for _ in range(VOCABULARY_SAMPLES):
        words.update(_WORD.findall(space.sample().lower()))
    return tuple(sorted(words))


class FlatObservationFactory:
    """Picklable factory of `factory()`'s env with its observations converted by `layout` (FlatObservation)."""

    def __init__(self, factory, layout: ObsLayout):
        self.factory, self.layout = factory, layout

    def __call__(self, **kwargs):
        return _wrapper_class()(self.factory(**kwargs), self.layout)


@functools.cache
def _wrapper_class():
    import gymnasium as gym

    class FlatObservation(gym.ObservationWrapper):
        """An env whose observations are its ObsLayout's flat entries."""

        def __init__(self, env, layout: ObsLayout):
            super().__init__(env)
            self.layout, self.observation_space = layout, layout.space

        def observation(self, observation):
            return self.layout.one(observation)

    return FlatObservation
