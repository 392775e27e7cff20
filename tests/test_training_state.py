"""The training state an algorithm declares once (sf_engine.algo.training_state): each built-in algorithm's state has
its checkpoint layout, goes through a checkpoint's bytes into another whole and in place, takes partial states as
before, and PBT's exploit copies everything but the learning rates and counters; the helper alone on a toy module."""

import copy
import io

import pytest
import torch
from test_kept_state import _assert_same as assert_same
from torch import nn

from sf_engine.algo.base import TrainingHooks
from sf_engine.algo.training_state import Holds, TrainingState
from sf_engine.config.algorithms import import_class
from sf_engine.config.groups import Config, LearnerConfig
from sf_engine.model.flat_state import FlatAdam, flatten_state
from sf_engine.run.plan import build_plan

HOOKS = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)

# each algorithm's checkpoint layout: its keys, and those of its optimizers' nest
SAC_KEYS = {"model", "critic", "target", "log_alpha", "optimizers", "num_updates"}
TD3_KEYS = {"model", "actor_target", "critic", "target", "optimizers", "num_updates"}
LAYOUTS = {
    "ppo": ("CartPole-v1", {"model", "optimizer", "hyperparameters"}, None),
    "dqn": ("CartPole-v1", {"model", "optimizer", "target", "num_updates"}, None),
    "pqn": ("CartPole-v1", {"model", "optimizer"}, None),
    "r2d2": ("CartPole-v1", {"model", "optimizer", "target", "num_updates"}, None),
    "sac": ("Pendulum-v1", SAC_KEYS, {"actor", "critic", "alpha"}),
    "td3": ("Pendulum-v1", TD3_KEYS, {"actor", "critic"}),
}


def make(tmp_path, algo: str, seed: int = 0, *flags):
    """The algorithm `algo` of a small serial run, built as the learner builds it (on the CPU), its weights drawn
    from `seed`."""
    env = LAYOUTS[algo][0]
    argv = ["--algo", algo, "--env", env, "--train_dir", str(tmp_path), "--mode", "serial", "--num_workers", "1"]
    plan = build_plan(argv + ["--num_envs_per_worker", "8"] + list(flags))
    torch.manual_seed(seed)
    return import_class(plan.cfg.algorithm.learner)(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)


def optimizers(algorithm) -> list:
    return [getattr(algorithm, name) for name in algorithm.holds.optimizers.values()]


def flat_vectors(algorithm) -> dict:
    """The algorithm's flat weight vectors (`params`, `critic_params`, ...) and its tensors."""
    names = [name for name in vars(algorithm) if name.endswith("params")] + list(algorithm.holds.tensors)
    return {name: getattr(algorithm, name) for name in names}


def trained_state(algorithm, seed: int) -> dict:
    """A state of `algorithm` as training leaves one: every float tensor drawn anew (from `seed`), every optimizer
    with moments and a step count, every counter moved on; loaded into it."""
    for optimizer in optimizers(algorithm):
        optimizer.zero_grad()
        optimizer.step()  # zero gradients: the moments exist, the weights stay
    generator = torch.Generator().manual_seed(seed)

    def drawn(state, key=""):
        if isinstance(state, dict):
            return {k: v if k in ("param_groups", "hyperparameters") else drawn(v, k) for k, v in state.items()}
        if isinstance(state, torch.Tensor):
            if key == "step":
                return state + 1 + seed
            return torch.rand(state.shape, generator=generator) + 0.5 if state.is_floating_point() else state + 1
        return state + 3 + seed if isinstance(state, int) and not isinstance(state, bool) else state

    state = drawn(algorithm.state())
    algorithm.load(state, "the test")
    return state


def through_bytes(state: dict) -> dict:
    saved = io.BytesIO()
    torch.save(state, saved)
    return torch.load(io.BytesIO(saved.getvalue()), weights_only=True)


@pytest.mark.parametrize("algo", LAYOUTS)
def test_the_checkpoint_layout_of_every_algorithm_is_as_before(tmp_path, algo):
    algorithm = make(tmp_path, algo)
    _, keys, nested = LAYOUTS[algo]
    state = algorithm.state()
    assert set(state) == keys
    assert set(state["model"]) == set(algorithm.model.state_dict())
    optimizer_states = state["optimizers"] if nested else {"optimizer": state["optimizer"]}
    assert set(optimizer_states) == (nested or {"optimizer"})
    assert all(set(saved) == {"state", "param_groups"} for saved in optimizer_states.values())
    if "log_alpha" in keys:  # a copy, not the live tensor
        assert state["log_alpha"].data_ptr() != algorithm.log_alpha.data_ptr()


@pytest.mark.parametrize("algo", LAYOUTS)
def test_a_state_goes_whole_through_a_checkpoint_into_another_in_place(tmp_path, algo):
    trained = make(tmp_path, algo, seed=0)
    state = trained_state(trained, seed=1)
    assert_same(trained.state(), state)
    fresh = make(tmp_path, algo, seed=2)
    vectors = flat_vectors(fresh)
    pointers = {name: vector.data_ptr() for name, vector in vectors.items()}
    assert not torch.equal(fresh.params, trained.params)
    fresh.load(through_bytes(trained.state()), "a checkpoint")
    assert_same(fresh.state(), state)
    for name, vector in flat_vectors(fresh).items():  # the same vectors, the modules' views into them
        assert vector is vectors[name] and vector.data_ptr() == pointers[name], name
        assert torch.equal(vector, getattr(trained, name)), name
    storage = fresh.params.untyped_storage().data_ptr()
    assert all(
        t.untyped_storage().data_ptr() == storage for t in fresh.model.state_dict().values() if t.is_floating_point()
    )
    assert fresh.optimizer.param.data_ptr() == fresh.params.data_ptr()


@pytest.mark.parametrize("algo", LAYOUTS)
def test_an_exploit_copies_weights_tensors_and_moments_and_keeps_the_learning_rate_and_counters(tmp_path, algo):
    member, better = make(tmp_path, algo, seed=0), make(tmp_path, algo, seed=1)
    trained_state(member, seed=2)
    trained_state(better, seed=3)
    member.set_hyperparameters({"learning_rate": 1e-4})
    better.set_hyperparameters({"learning_rate": 2e-3})
    mine = member.state()
    expected = copy.deepcopy(better.state())
    for key, value in mine.items():
        if key in member.holds.counters or key == "hyperparameters":
            expected[key] = value
    nest = member.holds.optimizers_key
    for key in member.holds.optimizers:
        ours, theirs = (mine[nest] if nest else mine)[key], (expected[nest] if nest else expected)[key]
        theirs["param_groups"] = ours["param_groups"]

    assert not torch.equal(member.params, better.params) and member.learning_rate != better.learning_rate
    member.copy_from(better)
    assert_same(member.state(), expected)
    assert member.learning_rate == 1e-4 and better.learning_rate == 2e-3
    for name, vector in flat_vectors(member).items():  # what PBT's exploit copied before: the flat vectors
        assert torch.equal(vector, getattr(better, name)), name
    for ours, theirs in zip(optimizers(member), optimizers(better)):  # copies: the members share no moments
        assert ours.state["exp_avg"].data_ptr() != theirs.state["exp_avg"].data_ptr()
        theirs.state["exp_avg"].add_(1.0)
        assert not torch.equal(ours.state["exp_avg"], theirs.state["exp_avg"])
    better.params.add_(1.0)
    assert not torch.equal(member.params, better.params)


@pytest.mark.parametrize("algo", ["dqn", "r2d2"])
def test_a_state_without_a_target_network_starts_it_from_the_online_weights(tmp_path, algo):
    trained, fresh = make(tmp_path, algo, seed=0), make(tmp_path, algo, seed=1)
    state = trained_state(trained, seed=2)
    assert not torch.equal(trained.target_params, trained.params)
    fresh.num_updates = 4
    fresh.load({key: value for key, value in state.items() if key not in ("target", "num_updates")}, "an old one")
    assert torch.equal(fresh.params, trained.params) and torch.equal(fresh.target_params, trained.params)
    assert fresh.num_updates == 0
    fresh.params.add_(1.0)  # the weights replaced from outside: the target follows
    fresh.weights_replaced()
    assert torch.equal(fresh.target_params, fresh.params)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_state_of_optimizer_states_only_leaves_the_weights_and_an_incomplete_one_is_refused(tmp_path, algo):
    trained, fresh = make(tmp_path, algo, seed=0), make(tmp_path, algo, seed=1)
    state = trained_state(trained, seed=2)
    fresh.num_updates = 5
    before = {name: vector.clone() for name, vector in flat_vectors(fresh).items()}
    fresh.load({"optimizers": state["optimizers"]}, "moments only")
    assert all(torch.equal(vector, before[name]) for name, vector in flat_vectors(fresh).items())
    assert fresh.num_updates == 5
    assert_same(fresh.state()["optimizers"], state["optimizers"])
    with pytest.raises(KeyError, match="critic"):
        fresh.load({key: value for key, value in state.items() if key != "critic"}, "incomplete")


@pytest.mark.parametrize("algo", ["ppo", "pqn", "sac", "td3"])
def test_replaced_weights_leave_the_rest_of_the_state_as_it_is(tmp_path, algo):
    """Nothing of these derives from the published weights: SAC's and TD3's critics and targets are the learner's."""
    algorithm = make(tmp_path, algo)
    trained_state(algorithm, seed=1)
    algorithm.params.add_(1.0)  # what a restarted learner does with its predecessor's last published weights
    before = copy.deepcopy(algorithm.state())
    algorithm.weights_replaced()
    assert_same(algorithm.state(), before)


def test_a_pbt_member_takes_back_its_own_hyperparameters_and_another_run_keeps_its_flags(tmp_path):
    trained = make(tmp_path, "ppo")
    hyper = {"learning_rate": 5e-4, "entropy_coeff": 0.02, "gamma": 0.95, "ppo_clip_ratio": 0.3}
    trained.set_hyperparameters(hyper)
    state = through_bytes(trained.state())
    assert state["hyperparameters"] == hyper
    member = make(tmp_path, "ppo", 1, "--num_policies", "2", "--pbt")
    member.load(state, "a PBT checkpoint")
    assert member.hyperparameters() == hyper and member.learning_rate == 5e-4
    assert (member.coefficients.entropy_coeff, member.coefficients.clip_ratio) == (0.02, 0.3)
    plain = make(tmp_path, "ppo", 1)
    flags = plain.hyperparameters()
    plain.load(state, "a PBT checkpoint")
    assert plain.hyperparameters() == flags != hyper and plain.learning_rate == flags["learning_rate"]


class ToyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.register_buffer("mean", torch.zeros(3))  # a normalizer's statistics: inside the flat vector
        self.register_buffer("spread", torch.ones(3), persistent=False)  # in the flat vector, not in a state_dict

    def forward(self, x):
        return self.linear((x - self.mean) / self.spread)


class Toy(TrainingState):
    """A network, a shadow that follows it, Adam, a plain tensor and a counter."""

    holds = Holds(
        modules=("net", "shadow"),
        optimizers={"adam": "optimizer"},
        optimizers_key="nest",
        tensors=("scale",),
        counters=("steps",),
        follows={"shadow": "net"},
    )

    def __init__(self, seed: int, lr: float = 1e-2):
        torch.manual_seed(seed)
        self.cfg = Config(learner=LearnerConfig(learning_rate=lr))  # PBT's hyperparameters: PPO's (its spec's)
        self.lcfg = self.cfg.learner
        self.net, self.shadow = ToyNet(), ToyNet()
        self.params, self.shadow_params = flatten_state(self.net), flatten_state(self.shadow)
        self.optimizer = FlatAdam(self.net, self.params, lr=lr, eps=1e-8)
        self.scale = torch.ones(2)
        self.steps = 0

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def train(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.optimizer.zero_grad()
        self.net(torch.randn(8, 3, generator=generator)).square().mean().backward()
        self.optimizer.step()
        self.net.mean.add_(torch.rand(3, generator=generator))
        self.net.spread.add_(torch.rand(3, generator=generator))
        self.shadow_params.lerp_(self.params, 0.5)
        self.scale.mul_(1.5)
        self.steps += 1


def test_the_helper_round_trips_a_toy_in_place_and_copies_all_but_the_learning_rate_and_counter():
    toy = Toy(seed=0)
    for seed in range(3):
        toy.train(seed)
    state = through_bytes(toy.state())
    assert set(state) == {"net", "shadow", "scale", "nest", "steps"} and set(state["nest"]) == {"adam"}
    assert set(state["net"]) == {"linear.weight", "linear.bias", "mean"} and state["steps"] == 3

    other = Toy(seed=1, lr=1e-3)
    params, shadow_params = other.params, other.shadow_params
    other.load(state, "the test")
    assert other.params is params and other.shadow_params is shadow_params
    assert_same(other.net.state_dict(), toy.net.state_dict())
    assert_same(other.shadow.state_dict(), toy.shadow.state_dict())
    assert torch.equal(other.net.mean, toy.net.mean)
    assert other.net.mean.untyped_storage().data_ptr() == other.params.untyped_storage().data_ptr()
    assert torch.equal(other.scale, toy.scale) and other.steps == 3
    assert torch.equal(other.optimizer.state["exp_avg"], toy.optimizer.state["exp_avg"])
    assert other.learning_rate == 1e-3  # a loaded state's settings are never taken
    toy.train(3)
    other.train(3)
    assert not torch.equal(other.params, toy.params)  # the same moments, another learning rate

    copied = Toy(seed=2, lr=1e-4)
    copied.steps = 7
    copied.copy_from(toy)
    assert torch.equal(copied.params, toy.params) and torch.equal(copied.shadow_params, toy.shadow_params)
    assert torch.equal(copied.net.spread, toy.net.spread)  # PBT copies the whole flat state
    assert torch.equal(copied.scale, toy.scale) and copied.steps == 7 and copied.learning_rate == 1e-4
    assert torch.equal(copied.optimizer.state["step"], toy.optimizer.state["step"])
    assert copied.optimizer.state["exp_avg"] is not toy.optimizer.state["exp_avg"]

    shadowless = Toy(seed=3)
    shadowless.load({key: value for key, value in state.items() if key != "shadow"}, "the test")
    assert not torch.equal(state["shadow"]["linear.weight"], state["net"]["linear.weight"])
    assert_same(shadowless.net.state_dict(), state["net"])
    assert_same(shadowless.shadow.state_dict(), state["net"])
    assert torch.equal(shadowless.shadow_params, shadowless.params)
    with pytest.raises(KeyError):
        shadowless.load({key: value for key, value in state.items() if key != "net"}, "the test")

    shadowless.set_hyperparameters({"learning_rate": 3e-3, "entropy_coeff": 0.02})
    assert shadowless.hyperparameters() == {
        "learning_rate": 3e-3,
        "entropy_coeff": 0.02,
        "gamma": 0.99,
        "ppo_clip_ratio": 0.2,
    }
    assert shadowless.learning_rate == 3e-3 and shadowless.cfg.ppo.entropy_coeff == 0.02  # each in its group


def test_holds_refuses_a_follower_that_is_not_a_module():
    with pytest.raises(ValueError, match="target"):
        Holds(modules=("model",), optimizers={"optimizer": "optimizer"}, follows={"target": "model"})
    with pytest.raises(ValueError, match="at least one module"):
        Holds(modules=(), optimizers={"optimizer": "optimizer"})
