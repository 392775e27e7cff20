"""The return of a uniformly random policy (legal actions where the env has an action mask): the floor a
learning curve is read against. Every agent of a multi-agent env plays at random and each agent's
episode counts as one.

  python perf/random_return.py --env mpe2.simple_spread_v3:parallel_env --episodes 1000
Prints one JSON line: env, episodes, return mean and std, length mean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sf_engine.envs import make_batch_env, probe_env_spec  # noqa: E402
from sf_engine.envs.masks import random_actions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", required=True, help="as train.py's --env")
    parser.add_argument("--env_backend", default="auto", help="as train.py's --env_backend")
    parser.add_argument("--episodes", type=int, default=1000, help="episodes (per agent) to average")
    parser.add_argument("--num_envs", type=int, default=32, help="envs (games) stepped as one batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = probe_env_spec(args.env, args.env_backend)
    env = make_batch_env(
        args.env, args.env_backend, args.num_envs * spec.num_agents, seed=args.seed, spec=spec, training=False
    )
    rng = np.random.default_rng(args.seed)
    obs = env.reset()
    returns, lengths = np.zeros(env.num_envs), np.zeros(env.num_envs, np.int64)
    resetting = np.zeros(env.num_envs, bool)
    alive = getattr(env, "alive", None)  # multi-agent: the rows whose agent is in its game
    alive = np.ones(env.num_envs, bool) if alive is None else alive.copy()
    finished, finished_lengths = [], []
    while len(finished) < args.episodes:
        result = env.step(random_actions(spec, obs, rng))
        counting = ~resetting & alive
        returns += result.score_rewards * ~resetting
        lengths += counting
        for i in np.flatnonzero(result.episode_over & ~resetting):
            finished.append(returns[i])
            finished_lengths.append(lengths[i])
            returns[i], lengths[i] = 0.0, 0
        resetting = result.episode_over if result.alive is None else (result.episode_over | ~result.alive)
        alive = np.ones(env.num_envs, bool) if result.alive is None else result.alive
        obs = result.obs
    env.close()
    finished = np.array(finished[: args.episodes])
    print(
        json.dumps(
            {
                "env": args.env,
                "policy": "random",
                "episodes": len(finished),
                "return_mean": round(float(finished.mean()), 4),
                "return_std": round(float(finished.std()), 4),
                "length_mean": round(float(np.mean(finished_lengths[: args.episodes])), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
