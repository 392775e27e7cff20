"""sf_engine.load_policy acts as enjoy.py does: for each algorithm, a short serial run on CartPole-v1 (Pendulum-v1 for
SAC and TD3), then 100 greedy episodes played by `enjoy.py --deterministic --seed S` and 100 by load_policy in a
plain env loop seeded the way enjoy.py seeds its env; the per-episode returns and lengths must be the same.

  python perf/load_policy_vs_enjoy.py                      # all six algorithms
  python perf/load_policy_vs_enjoy.py --algos ppo,sac --seed 7 --episodes 100

How enjoy.py seeds: one env (sf_engine.envs.make_batch_env, 1 env, seed S), reset once, then every episode follows the
previous one (the env resets itself on the step after an episode ends, that step's action ignored). A Gymnasium env
is seeded once, `reset(seed=S)`, and every reset after it draws the next initial state from that seeded generator;
an EnvPool env is seeded when it is made. So the load_policy loop is a user's loop: `gym.make(env)`, `reset(seed=S)`
once, then `reset()` at the start of each episode (or `envpool.make(env, seed=S)` and `reset()` per episode where the
run's env is an EnvPool one: Pendulum-v1 with --env_backend auto), `policy.reset()` there too (R2D2's recurrent
state), `policy.act(obs[None])` at each step. (CartPole's Gymnasium vector implementation, which enjoy.py steps,
draws the same initial states and computes the same physics as `gym.make`'s single env.)

enjoy.py prints each episode's return to 0.1 and their mean at full precision: an episode is equal when its length
and printed return are; `mean_abs_diff` compares the means at full precision (0.0: the same floats).
Prints each algorithm's line (stderr) and one JSON line last, per algorithm: enjoy's and load_policy's mean return,
episodes equal (of --episodes), the largest per-episode difference, the distinct returns (how far from a trivial
all-500 comparison), the training run's figures and the seconds of each part.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_train  # noqa: E402

sys.path.insert(0, REPO)

ALGOS = ("ppo", "dqn", "pqn", "r2d2", "sac", "td3")
# A few tens of seconds of serial training each on 2 cores: clearly better than random (CartPole ~22, Pendulum
# ~-1200), not solved, so that greedy episodes differ from one another.
TRAIN_FLAGS = {
    "ppo": ["--env", "CartPole-v1", "--num_envs_per_worker", "8", "--train_for_env_steps", "40000"],
    "dqn": ["--env", "CartPole-v1", "--num_envs_per_worker", "8", "--learning_starts", "500"]
    + ["--train_for_env_steps", "8000"],
    "pqn": ["--env", "CartPole-v1", "--num_envs_per_worker", "32", "--rollout", "32", "--batch_size", "256"]
    + ["--epsilon_decay_env_steps", "30000", "--train_for_env_steps", "60000"],
    "r2d2": ["--env", "CartPole-v1", "--train_for_env_steps", "100000"],
    "sac": ["--env", "Pendulum-v1", "--hidden_size", "64", "--learning_starts", "1000", "--replay_ratio", "256"]
    + ["--train_for_env_steps", "8000"],
    "td3": ["--env", "Pendulum-v1", "--hidden_size", "64", "--learning_starts", "1000", "--replay_ratio", "256"]
    + ["--train_for_env_steps", "8000"],
}
EPISODE_LINE = re.compile(r"^episode \d+: return (-?[0-9.]+), length (\d+)", re.M)


def enjoy(train_dir: str, experiment: str, episodes: int, seed: int) -> dict:
    """enjoy.py in a new process, greedy: its printed (return, length) per episode and its JSON line."""
    cmd = [sys.executable, os.path.join(REPO, "enjoy.py"), "--train_dir", train_dir, "--experiment", experiment]
    cmd += ["--num_episodes", str(episodes), "--deterministic", "--seed", str(seed)]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"enjoy.py exited with {proc.returncode}")
    printed = EPISODE_LINE.findall(proc.stdout)
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "returns": [float(r) for r, _ in printed],
        "texts": [r for r, _ in printed],
        "lengths": [int(n) for _, n in printed],
        "figures": figures,
        "sec": round(time.monotonic() - start, 2),
    }


def make_env(env_id: str, backend: str, seed: int):
    """The env enjoy.py plays, as a user makes it: (env, reset, backend): reset() starts the next episode and
    gives its first observation [1, ...]; an EnvPool env takes and gives batches, a Gymnasium one single steps."""
    from sf_engine.envs.registry import SEED_MODULUS, resolve_backend

    seed %= SEED_MODULUS  # as make_batch_env takes it
    backend = resolve_backend(env_id, backend)
    if backend == "envpool":
        import envpool

        env = envpool.make(env_id, env_type="gymnasium", num_envs=1, num_threads=1, seed=seed)
        return env, lambda: env.reset()[0], backend
    import gymnasium as gym

    env = gym.make(env_id)
    env.reset(seed=seed)
    return env, lambda: env.reset()[0][None], backend


def play_load_policy(experiment_dir: str, episodes: int, seed: int) -> dict:
    """load_policy's agent, greedy, in a plain loop: [return], [length] per episode."""
    import sf_engine

    start = time.monotonic()
    with open(os.path.join(experiment_dir, "config.json")) as f:
        env_cfg = json.load(f)["env"]
    policy = sf_engine.load_policy(experiment_dir)
    env, reset, backend = make_env(env_cfg["env"], env_cfg["env_backend"], seed)
    batched = backend == "envpool"
    returns, lengths = [], []
    for _ in range(episodes):
        obs, total, length, done = reset(), 0.0, 0, False
        policy.reset()
        while not done:
            actions = policy.act(obs)
            obs, reward, terminated, truncated, _ = env.step(actions if batched else actions[0])
            if not batched:
                obs, reward, terminated, truncated = obs[None], [reward], [terminated], [truncated]
            total += float(reward[0])
            length += 1
            done = bool(terminated[0] or truncated[0])
        returns.append(total)
        lengths.append(length)
    env.close()
    return {
        "returns": returns,
        "lengths": lengths,
        "checkpoint": os.path.basename(policy.checkpoint),
        "backend": backend,
        "sec": round(time.monotonic() - start, 2),
    }


def compare(algo: str, episodes: int, seed: int, env_backend: str) -> dict:
    played = {}

    def inspect(train_dir: str, experiment: str) -> None:
        played["enjoy"] = enjoy(train_dir, experiment, episodes, seed)
        played["load_policy"] = play_load_policy(os.path.join(train_dir, experiment), episodes, seed)

    start = time.monotonic()
    flags = ["--algo", algo, "--mode", "serial", "--num_workers", "1", "--seed", "1", "--env_backend", env_backend]
    flags += TRAIN_FLAGS[algo]
    summary = run_train(flags, timeout_sec=900, inspect=inspect)
    ours, theirs = played["load_policy"], played["enjoy"]
    assert ours["checkpoint"] == theirs["figures"]["checkpoint"], (ours["checkpoint"], theirs["figures"])
    equal = [
        f"{mine:.1f}" == text and n == m
        for mine, n, text, m in zip(ours["returns"], ours["lengths"], theirs["texts"], theirs["lengths"])
    ]
    diffs = [abs(round(mine, 1) - float(text)) for mine, text in zip(ours["returns"], theirs["texts"])]
    return {
        "env": summary["env"],
        "env_backend": ours["backend"],
        "mode": summary["mode"],
        "checkpoint": ours["checkpoint"],
        "train_env_steps": summary["env_steps"],
        "train_episode_return_mean": summary["episode_return_mean"],
        "enjoy_return_mean": theirs["figures"]["return_mean"],
        "load_policy_return_mean": float(np.mean(ours["returns"])),
        "mean_abs_diff": abs(theirs["figures"]["return_mean"] - float(np.mean(ours["returns"]))),
        "episodes": len(theirs["texts"]),
        "episodes_equal": int(sum(equal)) if len(ours["returns"]) == len(theirs["texts"]) else 0,
        "max_abs_diff": round(max(diffs), 4),
        "distinct_returns": len(set(theirs["texts"])),
        "train_sec": summary["launch_to_exit_sec"],
        "enjoy_sec": theirs["sec"],
        "load_policy_sec": ours["sec"],
        "total_sec": round(time.monotonic() - start, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--algos", default=",".join(ALGOS), help="comma-separated, of " + ", ".join(ALGOS))
    parser.add_argument("--episodes", type=int, default=100, help="greedy episodes each side plays")
    parser.add_argument("--seed", type=int, default=12345, help="enjoy.py's --seed, and the loop's")
    parser.add_argument(
        "--env_backend",
        default="auto",
        choices=("auto", "gymnasium", "envpool"),
        help="train.py's: the env the run trains on and enjoy.py and the loop play (auto: Pendulum on EnvPool)",
    )
    args = parser.parse_args()
    algos = args.algos.split(",")
    unknown = sorted(set(algos) - set(ALGOS))
    if unknown:
        parser.error(f"--algos: unknown {', '.join(unknown)} (of {', '.join(ALGOS)})")
    start = time.monotonic()
    results = {}
    for algo in algos:
        results[algo] = compare(algo, args.episodes, args.seed, args.env_backend)
        print(algo, json.dumps(results[algo]), file=sys.stderr, flush=True)
    line = {"seed": args.seed, "episodes": args.episodes, "env_backend": args.env_backend, "algos": results}
    line["wall_sec"] = round(time.monotonic() - start, 2)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
