"""Stable-Baselines3-contrib on this machine, for side-by-side figures with our --algo qrdqn and --algo crossq: trains
ALGO (qrdqn, crossq) on ENV with RL Baselines3 Zoo's tuned hyperparameters for that env (the numbers of the zoo's
hyperparams/qrdqn.yml and crossq.yml, 2.9 era, written out below; the library's defaults for what an entry leaves
out) and prints one JSON line last. Run it through perf/sb3_contrib.sh, which makes its venv:

  perf/sb3_contrib.sh --algo qrdqn --env CartPole-v1 --seconds 120 --eval_every_sec 10 [--stop_at_return 475]
  perf/sb3_contrib.sh --algo qrdqn --env BreakoutNoFrameskip-v4 --seconds 3600 --eval_every_sec 300 --buffer_size 100000
  perf/sb3_contrib.sh --algo crossq --env Pendulum-v1 --seconds 60 --eval_every_sec 10
  perf/sb3_contrib.sh --algo crossq --env HalfCheetah-v5 --seconds 900 --eval_every_sec 60

The zoo's env-step budget (n_timesteps) is the total given to learn(): its schedules (exploration, a linear learning
rate) are fractions of it, as in the zoo. The run ends at the first of: that budget, --env_steps, --seconds of
training, --stop_at_return (mean of the last 100 episodes) or --stop_at_eval_return (a greedy evaluation).

Atari (an id whose entry point is ALE's AtariEnv; BreakoutNoFrameskip-v4 is the zoo's): the zoo's `atari` entry, its
wrapper AtariWrapper (30 no-ops, 4-frame skip with max-pooling, 84x84 grey, fire on reset, episode end on life loss,
rewards clipped to their sign) and 4 frames stacked. The Monitor sits below AtariWrapper, so every episode return
reported (training's and evaluation's) is a whole game's unclipped score, over all its lives. A v5 id
(ALE/Breakout-v5) is made with frameskip=1 so that the wrapper's skip is the only one (its sticky actions stay). The
zoo's 1M replay entries of 4x84x84 frames take about 56 GB (observations and next observations); where that cannot be
allocated the run stops with one line: --buffer_size lowers it, and the JSON's settings say so. CrossQ's MuJoCo entry
is the zoo's *-v4 one (&mujoco-defaults), used for -v4 and -v5.

The JSON line: system, algo, env, seed, budget_env_steps, env_steps, wall_sec (from the start of this script, imports
included), env_steps_per_sec (training only), env_steps_per_sec_learning (from learning_starts on, the updates' rate;
null before), episode_return_mean (last 100 episodes), episodes, seconds_to_threshold / env_steps_to_threshold (first
time the mean of the last 100 episodes reached --stop_at_return; null if never), with --eval_every_sec: evals
[[seconds, env_steps, greedy return], ...] (mean of --eval_episodes greedy episodes; with --final_eval the final
policy's last) and seconds_to_eval_threshold, gradient_steps, replay_ratio (samples trained per env step), a coarse
curve [[seconds, env_steps, return_mean], ...] every 5 s, and settings (the hyperparameters used, the zoo entry they
came from, what this run overrode). Evaluation time is excluded from every clock (eval_seconds_excluded).
"""

import argparse
import copy
import json
import time

T0 = time.time()

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import sb3_contrib  # noqa: E402
import stable_baselines3  # noqa: E402
import torch  # noqa: E402
from sb3_contrib import QRDQN, CrossQ  # noqa: E402
from stable_baselines3.common.atari_wrappers import AtariWrapper  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage  # noqa: E402

try:
    import ale_py

    gym.register_envs(ale_py)
except ImportError:
    ale_py = None

# rl-baselines3-zoo hyperparams/qrdqn.yml and crossq.yml: the tuned entries, the `atari` entry and `default`
MUJOCO = dict(
    buffer_size=1_000_000,
    learning_rate=1e-3,
    learning_starts=5000,
    n_timesteps=5_000_000,
    policy="MlpPolicy",
    policy_delay=3,
    policy_kwargs=dict(net_arch=dict(pi=[256, 256], qf=[2048, 2048])),
)
ZOO = {
    "qrdqn": {
        "default": dict(n_timesteps=1_000_000, policy="MlpPolicy"),
        "atari": dict(
            env_wrapper="AtariWrapper",
            frame_stack=4,
            policy="CnnPolicy",
            n_timesteps=10_000_000,
            learning_starts=50_000,
            exploration_fraction=0.025,
            optimize_memory_usage=False,
        ),
        "CartPole-v1": dict(
            n_timesteps=50_000,
            policy="MlpPolicy",
            learning_rate=2.3e-3,
            batch_size=64,
            buffer_size=100_000,
            learning_starts=1000,
            gamma=0.99,
            target_update_interval=10,
            train_freq=256,
            gradient_steps=128,
            exploration_fraction=0.16,
            exploration_final_eps=0.04,
            policy_kwargs=dict(net_arch=[256, 256], n_quantiles=10),
        ),
        "MountainCar-v0": dict(
            n_timesteps=120_000,
            policy="MlpPolicy",
            learning_rate=4e-3,
            batch_size=128,
            buffer_size=10_000,
            learning_starts=1000,
            gamma=0.98,
            target_update_interval=600,
            train_freq=16,
            gradient_steps=8,
            exploration_fraction=0.2,
            exploration_final_eps=0.07,
            policy_kwargs=dict(net_arch=[256, 256], n_quantiles=25),
        ),
        "LunarLander-v3": dict(
            n_timesteps=100_000,
            policy="MlpPolicy",
            learning_rate="lin_1.5e-3",
            batch_size=128,
            buffer_size=100_000,
            learning_starts=10_000,
            gamma=0.995,
            target_update_interval=1,
            train_freq=256,
            gradient_steps=-1,
            exploration_fraction=0.24,
            exploration_final_eps=0.18,
            policy_kwargs=dict(net_arch=[256, 256], n_quantiles=170),
        ),
        "Acrobot-v1": dict(
            n_timesteps=100_000,
            policy="MlpPolicy",
            learning_rate=6.3e-4,
            batch_size=128,
            buffer_size=50_000,
            learning_starts=0,
            gamma=0.99,
            target_update_interval=250,
            train_freq=4,
            gradient_steps=-1,
            exploration_fraction=0.12,
            exploration_final_eps=0.1,
            policy_kwargs=dict(net_arch=[256, 256], n_quantiles=25),
        ),
    },
    "crossq": {
        "default": dict(n_timesteps=1_000_000, policy="MlpPolicy"),
        "MountainCarContinuous-v0": dict(
            n_timesteps=50_000,
            policy="MlpPolicy",
            learning_rate=7e-4,
            buffer_size=50_000,
            train_freq=32,
            gradient_steps=32,
            gamma=0.9999,
            learning_starts=100,
            use_sde=True,
            policy_delay=2,
            policy_kwargs=dict(use_expln=True, log_std_init=-1, net_arch=[64, 64]),
        ),
        "Pendulum-v1": dict(
            n_timesteps=20_000, policy="MlpPolicy", policy_delay=2, policy_kwargs=dict(net_arch=[256, 256])
        ),
        "LunarLanderContinuous-v3": dict(
            n_timesteps=200_000, policy="MlpPolicy", buffer_size=1_000_000, learning_starts=10_000
        ),
        "BipedalWalker-v3": dict(
            n_timesteps=200_000,
            policy="MlpPolicy",
            buffer_size=300_000,
            gamma=0.98,
            learning_starts=10_000,
            policy_kwargs=dict(net_arch=dict(pi=[256, 256], qf=[1024, 1024])),
        ),
        "HalfCheetah-v4": MUJOCO,
        "Ant-v4": MUJOCO,
        "Hopper-v4": MUJOCO,
        "Walker2d-v4": MUJOCO,
        "Humanoid-v4": MUJOCO,
        "HumanoidStandup-v4": MUJOCO,
        "Swimmer-v4": dict(MUJOCO, gamma=0.999),
    },
}
CLASSES = {"qrdqn": QRDQN, "crossq": CrossQ}


def is_atari(env_id: str) -> bool:
    return ale_py is not None and "AtariEnv" in str(gym.spec(env_id).entry_point)


def zoo_entry(algo: str, env_id: str) -> tuple[dict, str]:
    """The zoo's hyperparameters for (algo, env) as its ExperimentManager picks them, and the entry's name."""
    table = ZOO[algo]
    name = env_id
    if name.endswith("-v5") and name[:-1] + "4" in table:  # the zoo's MuJoCo entries are v4's
        name = name[:-1] + "4"
    if name not in table:
        name = "atari" if is_atari(env_id) and "atari" in table else "default"
    return copy.deepcopy(table[name]), f"rl-baselines3-zoo hyperparams/{algo}.yml, entry {name!r}"


def linear(value):
    """The zoo's "lin_X": linear from X at the start to 0 at the end of its n_timesteps."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value


def env_kwargs(env_id: str, atari: bool):
    """ALE's v5 ids skip frames themselves: made with frameskip=1, AtariWrapper's skip is the only one."""
    return {"frameskip": 1} if atari and gym.spec(env_id).kwargs.get("frameskip", 1) != 1 else None


def make_env(env_id: str, n_envs: int, seed: int, atari: bool, frame_stack):
    """The zoo's env stack: Monitor, then AtariWrapper for Atari (the Monitor below it), then frame stacking."""
    env = make_vec_env(
        env_id,
        n_envs=n_envs,
        seed=seed,
        wrapper_class=AtariWrapper if atari else None,
        env_kwargs=env_kwargs(env_id, atari),
    )
    if frame_stack:
        env = VecFrameStack(env, frame_stack)
    if atari:
        env = VecTransposeImage(env)
    return env


class Track(BaseCallback):
    """Episode returns from the Monitor's infos, the stops, the curve, and greedy evaluations whose time is paused."""

    def __init__(self, args, eval_env):
        super().__init__()
        self.a, self.eval_env = args, eval_env
        self.returns, self.curve, self.evals = [], [], []
        self.hit = self.eval_hit = None
        self.start, self.paused, self.last_mark, self.next_eval = 0.0, 0.0, 0.0, args.eval_every_sec
        self.learning = None  # (training seconds, env steps) when the updates began

    def clock(self) -> float:
        return time.time() - T0 - self.paused

    def evaluate(self) -> float:
        """Mean return of greedy episodes, each a whole episode as the Monitor counts it (for Atari: a game)."""
        env, totals = self.eval_env, []
        env.seed(10_000 + self.a.seed * 100)
        obs = env.reset()
        while len(totals) < self.a.eval_episodes:
            action, _ = self.model.predict(obs, deterministic=True)
            obs, _, _, infos = env.step(action)
            if "episode" in infos[0]:
                totals.append(float(infos[0]["episode"]["r"]))
        return float(np.mean(totals))

    def _on_training_start(self):
        self.start = time.time()

    def _on_step(self) -> bool:
        if self.learning is None and self.num_timesteps > self.model.learning_starts:
            self.learning = (time.time() - self.start - self.paused, self.num_timesteps)
        for info in self.locals.get("infos", []):
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
        mean = float(np.mean(self.returns[-100:])) if self.returns else None
        trained = time.time() - self.start - self.paused
        if self.a.eval_every_sec and trained >= self.next_eval:
            began = time.time()
            value = self.evaluate()
            self.paused += time.time() - began
            self.next_eval += self.a.eval_every_sec
            self.evals.append([round(self.clock(), 1), self.num_timesteps, round(value, 2)])
            if self.a.stop_at_eval_return is not None and value >= self.a.stop_at_eval_return:
                self.eval_hit = (self.clock(), self.num_timesteps)
                return False
        stop_at = self.a.stop_at_return
        if stop_at is not None and len(self.returns) >= 100 and mean >= stop_at:
            self.hit = (self.clock(), self.num_timesteps)
            return False
        if self.clock() - self.last_mark >= 5:
            self.last_mark = self.clock()
            self.curve.append([round(self.last_mark, 1), self.num_timesteps, None if mean is None else round(mean, 2)])
        if self.a.env_steps is not None and self.num_timesteps >= self.a.env_steps:
            return False
        return self.a.seconds is None or time.time() - self.start - self.paused < self.a.seconds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", required=True, choices=sorted(CLASSES))
    p.add_argument("--env", required=True, help="a Gymnasium id (ALE's ids for Atari)")
    p.add_argument("--seconds", type=float, default=None, help="seconds of training (default: no time limit)")
    p.add_argument("--env_steps", type=int, default=None, help="stop after this many env steps (default: the zoo's)")
    p.add_argument("--stop_at_return", type=float, default=None, help="stop once the last 100 episodes' mean is this")
    p.add_argument("--eval_every_sec", type=float, default=0, help="greedy evaluation every N s of training")
    p.add_argument("--eval_episodes", type=int, default=10)
    p.add_argument("--stop_at_eval_return", type=float, default=None, help="stop once a greedy evaluation is this")
    p.add_argument("--final_eval", action="store_true", help="a greedy evaluation of the final policy, last in evals")
    p.add_argument("--buffer_size", type=int, default=None, help="replace the zoo's replay size (Atari's is 1M)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads (SB3 trains in the main thread)")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    zoo, source = zoo_entry(a.algo, a.env)
    hp = copy.deepcopy(zoo)  # the library adds to policy_kwargs
    overridden = {}
    if a.buffer_size is not None:
        hp["buffer_size"] = overridden["buffer_size"] = a.buffer_size
    budget = int(hp.pop("n_timesteps"))
    policy = hp.pop("policy")
    n_envs = hp.pop("n_envs", 1)
    frame_stack = hp.pop("frame_stack", None)
    atari = hp.pop("env_wrapper", None) == "AtariWrapper"
    if "learning_rate" in hp:
        hp["learning_rate"] = linear(hp["learning_rate"])
    env = make_env(a.env, n_envs, a.seed, atari, frame_stack)
    eval_env = make_env(a.env, 1, a.seed + 1000, atari, frame_stack) if a.eval_every_sec or a.final_eval else None
    try:
        model = CLASSES[a.algo](policy, env, seed=a.seed, device=a.device, verbose=0, **hp)
    except MemoryError as e:
        raise SystemExit(f"the replay buffer does not fit in memory ({e}): pass a smaller --buffer_size")
    track = Track(a, eval_env)
    began = time.time()
    model.learn(total_timesteps=budget, callback=track)
    train_sec = time.time() - began - track.paused
    if a.final_eval:  # the policy the run ends with, greedily: its figure at exactly the env steps it trained
        track.evals.append([round(track.clock(), 1), int(model.num_timesteps), round(track.evaluate(), 2)])
    steps = int(model.num_timesteps)
    grad_steps = int(getattr(model, "_n_updates", 0))
    batch = int(model.batch_size)
    settings = {
        "source": source,
        "zoo": zoo,
        "overridden": overridden,
        "defaults": f"sb3-contrib {sb3_contrib.__version__} {CLASSES[a.algo].__name__}'s for what the entry leaves out",
        "env": (
            "Monitor, AtariWrapper (terminal on life loss, clipped rewards), VecFrameStack 4, VecTransposeImage; "
            "returns are whole games' raw scores"
            if atari
            else "Monitor"
        ),
        "env_kwargs": env_kwargs(a.env, atari),
        "n_envs": n_envs,
        "torch_threads": a.threads,
        "device": a.device,
        "eval": "greedy (deterministic=True)",
    }
    out = {
        "system": f"sb3-contrib {sb3_contrib.__version__} (stable-baselines3 {stable_baselines3.__version__})",
        "algo": a.algo,
        "env": a.env,
        "seed": a.seed,
        "budget_env_steps": budget,
        "env_steps": steps,
        "wall_sec": round(time.time() - T0 - track.paused, 2),
        "env_steps_per_sec": round(steps / max(train_sec, 1e-9), 1),
        "env_steps_per_sec_learning": (
            round((steps - track.learning[1]) / max(train_sec - track.learning[0], 1e-9), 1) if track.learning else None
        ),
        "episode_return_mean": round(float(np.mean(track.returns[-100:])), 2) if track.returns else None,
        "episodes": len(track.returns),
        "seconds_to_threshold": None if track.hit is None else round(track.hit[0], 2),
        "env_steps_to_threshold": None if track.hit is None else track.hit[1],
        "seconds_to_eval_threshold": None if track.eval_hit is None else round(track.eval_hit[0], 2),
        "env_steps_to_eval_threshold": None if track.eval_hit is None else track.eval_hit[1],
        "eval_seconds_excluded": round(track.paused, 2),
        "evals": track.evals,
        "gradient_steps": grad_steps,
        "replay_ratio": round(grad_steps * batch / steps, 2) if steps else None,
        "curve": track.curve,
        "settings": settings,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
