"""Dict observations with Discrete, MultiDiscrete, MultiBinary, text and nested parts: the flat entries they become,
their conversion (one-hot, a bag of tokens), --text_obs drop, and a run that learns from a Discrete part and a text
part and plays from the env's own observations through load_policy."""

import numpy as np
import pytest
from gymnasium import spaces

from sf_engine.envs import probe_env_spec
from sf_engine.envs.observations import observation_layout


def test_the_parts_become_flat_entries_in_the_spaces_order():
    spec = probe_env_spec("toy_envs:MissionEnv", "gymnasium")
    assert spec.obs == (
        ("direction", (4,), "float32"),
        ("image", (5, 5, 3), "uint8"),
        ("mission", (28,), "float32"),  # 27 characters, and one for any other
        ("status/keys", (5,), "float32"),
        ("status/level", (2,), "float32"),
    )
    assert spec.family == "image" and spec.layout is not None
    dropped = probe_env_spec("toy_envs:MissionEnv", "gymnasium", text="drop")
    assert "mission" not in [key for key, _, _ in dropped.obs] and dropped.layout.dropped == ("mission",)


def test_one_hots_and_bags_of_tokens():
    space = spaces.Dict(
        {
            "dir": spaces.Discrete(3, start=-1),
            "dials": spaces.MultiDiscrete([2, 3]),
            "bits": spaces.MultiBinary(2),
            "text": spaces.Text(6, charset="ab "),
        }
    )
    layout = observation_layout("env", space)
    one = layout.one({"dir": 1, "dials": np.array([1, 0]), "bits": np.array([1, 0], np.int8), "text": "ab a"})
    assert one["dir"].tolist() == [0, 0, 1]  # Discrete(3, start=-1): 1 is the third value
    assert one["dials"].tolist() == [0, 1, 1, 0, 0]
    assert one["bits"].tolist() == [1, 0]
    assert one["text"].tolist() == [1, 2, 1, 0]  # ' ', 'a', 'b', and none of other characters
    batch = layout.batch(
        {"dir": np.array([-1, 0]), "dials": np.array([[0, 2], [1, 1]]), "bits": np.zeros((2, 2)), "text": ("b", "cab")}
    )
    assert batch["dir"].tolist() == [[1, 0, 0], [0, 1, 0]]
    assert batch["dials"].tolist() == [[1, 0, 0, 0, 1], [0, 1, 0, 1, 0]]
    assert batch["text"].tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]
    for key, box in layout.space.spaces.items():
        assert box.contains(np.asarray(one[key], box.dtype)), key


def test_a_string_space_that_is_not_text_gets_a_vocabulary_of_its_words():
    class Missions(spaces.Space):
        def __init__(self):
            super().__init__()

        def sample(self, mask=None, probability=None):
            return f"go to the {self.np_random.choice(['red', 'blue'])} {self.np_random.choice(['ball', 'key'])}"

        def contains(self, x):
            return isinstance(x, str)

    layout = observation_layout("env", spaces.Dict({"mission": Missions(), "x": spaces.Box(0, 1, (1,))}))
    (mission,) = [part for part in layout.parts if part.key == "mission"]
    assert mission.tokens == ("ball", "blue", "go", "key", "red", "the", "to")
    assert layout.one({"mission": "Go to the red box", "x": np.zeros(1)})["mission"].tolist() == [
        0,
        0,
        1,
        0,
        1,
        1,
        1,
        1,
    ]


@pytest.mark.e2e
def test_a_run_learns_from_the_discrete_and_text_parts_and_plays_from_the_envs_observations(tmp_path, shm_dir):
    import toy_envs

    import sf_engine

    result = sf_engine.train(
        env="toy_envs:MissionEnv",
        mode="serial",
        train_dir=str(tmp_path),
        experiment="mission",
        shm_dir=shm_dir,
        num_envs_per_worker=32,
        stop_at_return=7.6,
        train_for_env_steps=400_000,
    )
    assert result.summary["episode_return_mean"] >= 7.6, result.summary  # 6 without reading the mission
    policy = sf_engine.load_policy(result.experiment_dir)
    env, total = toy_envs.MissionEnv(), 0.0
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        for _ in range(env.LENGTH):
            batch = {
                "image": obs["image"][None],
                "direction": np.array([obs["direction"]]),
                "mission": [obs["mission"]],
                "status": {key: value[None] for key, value in obs["status"].items()},
            }
            obs, reward, *_ = env.step(policy.act(batch)[0])
            total += reward
    assert total / 10 >= 7.8


def test_minigrid_trains_as_it_comes(tmp_path, shm_dir):
    pytest.importorskip("minigrid")
    from conftest import TINY

    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    spec = probe_env_spec("minigrid:MiniGrid-Empty-5x5-v0", "auto")
    entries = {key: (shape, dtype) for key, shape, dtype in spec.obs}
    assert entries["direction"] == ((4,), "float32") and entries["image"] == ((7, 7, 3), "uint8")
    mission = next(part for part in spec.layout.parts if part.key == "mission")
    assert mission.words and {"get", "to", "the", "green", "goal", "square"} <= set(mission.tokens)
    where = ["--train_dir", str(tmp_path), "--shm_dir", shm_dir, "--experiment", "minigrid"]
    plan = build_plan(["--env", "minigrid:MiniGrid-Empty-5x5-v0", *where, *TINY, "--train_for_env_steps", "600"])
    assert any("observation parts made vectors: direction as one-hot [4], mission as" in note for note in plan.notes)
    assert run(plan) == 0
