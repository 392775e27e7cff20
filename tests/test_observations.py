"""Dict observations with Discrete, MultiDiscrete, MultiBinary, text and nested parts: the flat entries they become,
their conversion (one-hot, rows of a learned table, a bag of tokens), --text_obs drop, --discrete_obs embed, and runs
that learn from a Discrete part and a text part and play from the env's own observations through load_policy."""

import os

import numpy as np
import pytest
from conftest import read_json
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


def test_discrete_parts_as_rows_of_one_table_per_part():
    space = spaces.Dict({"dir": spaces.Discrete(3, start=-1), "dials": spaces.MultiDiscrete([2, 3])})
    layout = observation_layout("env", space, discrete="embed")
    assert layout.index_tables() == {"dir": 3, "dials": 5}
    assert {key: box.shape for key, box in layout.space.spaces.items()} == {"dir": (1,), "dials": (2,)}
    one = layout.one({"dir": 1, "dials": np.array([1, 0])})
    assert one["dir"].tolist() == [2.0] and one["dials"].tolist() == [1.0, 2.0]  # the second dimension's rows: 2..4
    batch = layout.batch({"dir": np.array([-1, 0]), "dials": np.array([[0, 2], [1, 1]])})
    assert batch["dir"].tolist() == [[0.0], [1.0]] and batch["dials"].tolist() == [[0.0, 4.0], [1.0, 3.0]]


def test_a_table_is_the_one_hots_first_layer_looked_up():
    import torch

    from sf_engine.model.features import EmbeddedMLP

    embedded = EmbeddedMLP(rows=5, dims=2, hidden_size=8, layers=2, activation="tanh")
    with torch.no_grad():  # the one-hots' first layer: each dimension's block of the table's rows, no biases
        first = torch.zeros(16, 5)
        first[:8, :2], first[8:, 2:] = embedded.table.weight[:2].T, embedded.table.weight[2:].T
    rows = torch.tensor([[0.0, 4.0], [1.0, 3.0]])
    hots = torch.zeros(2, 5).scatter_(1, rows.long(), 1.0)
    torch.testing.assert_close(embedded(rows), embedded.rest(torch.tanh(hots @ first.T)))
    assert embedded(rows).shape == (2, 8)


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


@pytest.mark.e2e
def test_a_run_learns_from_a_discrete_part_as_rows_of_a_table(tmp_path, shm_dir):
    import toy_envs

    import sf_engine

    run = dict(mode="serial", train_dir=str(tmp_path), experiment="embed", shm_dir=shm_dir, num_envs_per_worker=32)
    obs = dict(discrete_obs="embed", text_obs="drop")
    result = sf_engine.train(env="toy_envs:MissionEnv", stop_at_return=5.6, train_for_env_steps=400_000, **run, **obs)
    assert result.summary["episode_return_mean"] >= 5.6, result.summary  # 4 without reading the direction
    policy = sf_engine.load_policy(result.experiment_dir)
    assert dict((key, shape) for key, shape, _ in policy.spec.obs)["direction"] == (1,)
    env, read = toy_envs.MissionEnv(), []
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        for _ in range(env.LENGTH):
            status = {key: value[None] for key, value in obs["status"].items()}
            batch = {"image": obs["image"][None], "direction": np.array([obs["direction"]]), "status": status}
            action = policy.act(batch)[0]
            read.append(action[0] == obs["direction"] % 2)  # the mission left out: its half is a guess
            obs, *_ = env.step(action)
    assert np.mean(read) >= 0.95


def test_discrete_parts_as_rows_are_said_at_the_start_and_refused_where_networks_take_vectors(tmp_path, capsys):
    from conftest import train_error

    from sf_engine.run.plan import build_plan

    where = ["--train_dir", str(tmp_path), "--experiment", "embed", "--mode", "serial", "--num_workers", "1"]
    embed = ["--env", "toy_envs:TargetDictEnv", "--discrete_obs", "embed"]
    assert build_plan(embed + where).notes[0] == (
        "--env toy_envs:TargetDictEnv: observation parts made vectors: note as a bag of tokens [5], status/dials as "
        "indices into a learned embedding [2], target as indices into a learned embedding [1]"
    )
    line = train_error(embed + ["--algo", "sac"], tmp_path, capsys)
    assert line == (
        "error: --algo sac takes vectors: --discrete_obs embed needs an encoder's embedding tables: use "
        "--discrete_obs onehot, or --algo dqn or --algo ppo or --algo pqn or --algo qrdqn or --algo r2d2"
    )


FAST = ["--mode", "serial", "--num_workers", "1", "--num_envs_per_worker", "8", "--device", "cpu"]
REPLAY = ["--learning_starts", "300", "--batch_size", "64"]
RUNS = {  # algo: (env, flags); the Q family's runs take the Discrete parts as rows of a table
    "ppo": ("TargetChoiceEnv", ["--rollout", "16", "--batch_size", "64"]),
    "dqn": ("TargetChoiceEnv", REPLAY + ["--discrete_obs", "embed"]),
    "pqn": ("TargetChoiceEnv", ["--rollout", "16", "--batch_size", "64", "--discrete_obs", "embed"]),
    "r2d2": ("TargetChoiceEnv", REPLAY + ["--rnn", "gru", "--burn_in", "4", "--replay_sequence_length", "8"]),
    "sac": ("TargetDictEnv", REPLAY + ["--replay_ratio", "4"]),
    "td3": ("TargetDictEnv", REPLAY + ["--replay_ratio", "4"]),
}


@pytest.mark.e2e
@pytest.mark.parametrize("algo", RUNS)
def test_a_dict_of_every_part_trains_and_acts_under_every_algorithm(tmp_path, shm_dir, algo):
    import toy_envs

    import sf_engine
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    env_name, flags = RUNS[algo]
    where = ["--train_dir", str(tmp_path), "--experiment", algo, "--shm_dir", shm_dir, "--algo", algo]
    flags = ["--env", f"toy_envs:{env_name}", *FAST, *flags, "--train_for_env_steps", "1000", *where]
    assert run(build_plan(flags)) == 0
    assert read_json(tmp_path / algo / "summary.json")["learner_version"] > 0
    policy, env = sf_engine.load_policy(tmp_path / algo), getattr(toy_envs, env_name)()
    obs, _ = env.reset(seed=0)
    for _ in range(3):  # the env's own observations, a batch of one
        status = {key: value[None] for key, value in obs["status"].items()}
        action = policy.act({"target": np.array([obs["target"]]), "note": [obs["note"]], "status": status})[0]
        assert env.action_space.contains(np.asarray(action, env.action_space.dtype).reshape(env.action_space.shape))
        obs, *_ = env.step(action)
    assert os.listdir(shm_dir) == []


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


def test_envpools_minigrid_ids_become_the_same_flat_entries_and_train(tmp_path, shm_dir):
    """A MiniGrid id as it is (EnvPool's C++ MiniGrid): its Discrete direction one-hot, its image as it is, its mission
    EnvPool's bytes; the whole batch's observations made so as they come, and a short run trains on them."""
    from conftest import TINY

    from sf_engine.envs import make_batch_env
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    spec = probe_env_spec("MiniGrid-Empty-5x5-v0", "auto")
    assert spec.obs == (
        ("direction", (4,), "float32"),
        ("image", (7, 7, 3), "uint8"),
        ("mission", (96,), "uint8"),
    )
    env = make_batch_env("MiniGrid-Empty-5x5-v0", "auto", 3, 0, spec)
    try:
        for obs in (env.reset(), env.step(np.array([0, 1, 2])).obs):  # turn left, turn right, forward
            assert {key: (value.shape, value.dtype) for key, value in obs.items()} == {
                "direction": ((3, 4), np.float32),
                "image": ((3, 7, 7, 3), np.uint8),
                "mission": ((3, 96), np.uint8),
            }
            assert (obs["direction"].sum(1) == 1).all() and bytes(obs["mission"][0]).startswith(b"get to the green")
    finally:
        env.close()
    where = ["--train_dir", str(tmp_path), "--shm_dir", shm_dir, "--experiment", "envpool_minigrid"]
    plan = build_plan(["--env", "MiniGrid-Empty-5x5-v0", *where, *TINY, "--train_for_env_steps", "600"])
    assert any("observation parts made vectors: direction as one-hot [4]" in note for note in plan.notes)
    assert run(plan) == 0 and read_json(tmp_path / "envpool_minigrid" / "summary.json")["learner_version"] > 0
    assert os.listdir(shm_dir) == []
