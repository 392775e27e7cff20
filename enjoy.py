#!/usr/bin/env python
"""Replay a trained agent: loads <train_dir>/<experiment>/config.json and its newest checkpoint, runs
--num_episodes episodes on the CPU and prints each episode's return and length, then a summary line."""
import argparse
import json
import os
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--experiment", default="default", help="Experiment name (as given to train.py).")
    parser.add_argument("--train_dir", default="train_dir", help="Root directory of all experiments.")
    parser.add_argument("--num_episodes", type=int, default=10, help="Episodes to play.")
    parser.add_argument("--deterministic", action="store_true", help="Take the most likely action instead of sampling.")
    parser.add_argument("--seed", type=int, default=12345, help="Seed of the evaluation env.")
    return parser.parse_args(argv)


def play(policy, env, num_episodes: int, deterministic: bool):
    """Yield (return, length) of `num_episodes` whole episodes of a one-env BatchEnv."""
    import numpy as np
    import torch

    obs, episode_return, length, episodes = env.reset(), 0.0, 0, 0
    with torch.inference_mode():
        while episodes < num_episodes:
            tensors = {key: torch.from_numpy(np.asarray(value)) for key, value in obs.items()}
            if deterministic:
                actions = policy.distribution.mode(policy(tensors)[0])
            else:
                actions = policy.sample(tensors)[0]
            result = env.step(actions.numpy())
            obs = result.obs
            episode_return, length = episode_return + float(result.score_rewards[0]), length + 1
            if result.episode_over[0]:
                yield episode_return, length
                episodes, episode_return, length = episodes + 1, 0.0, 0
                obs = env.step(actions.numpy()).obs  # the env's reset step (action ignored)


def main(argv=None) -> int:
    args = parse_args(argv)
    exp_dir = os.path.join(args.train_dir, args.experiment)
    if not os.path.exists(os.path.join(exp_dir, "config.json")):
        print(f"error: no experiment at {exp_dir}: check --experiment and --train_dir", file=sys.stderr)
        return 2
    import numpy as np

    from envs import make_batch_env, probe_env_spec
    from sf_engine.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint
    from sf_engine.config import Config
    from sf_engine.model import ActorCritic

    with open(os.path.join(exp_dir, "config.json")) as f:
        cfg = Config.from_dict(json.load(f))
    path = latest_checkpoint(checkpoint_dir(exp_dir))
    if path is None:
        print(f"error: experiment {args.experiment} has no checkpoint yet: train it first", file=sys.stderr)
        return 2
    spec = probe_env_spec(cfg.env.env, cfg.env.env_backend)
    policy = ActorCritic(spec, cfg.model)
    policy.load_state_dict(load_checkpoint(path)["model"])
    env = make_batch_env(cfg.env.env, cfg.env.env_backend, 1, seed=args.seed, spec=spec, training=False)
    results = []
    for episode, (episode_return, length) in enumerate(play(policy, env, args.num_episodes, args.deterministic)):
        print(f"episode {episode}: return {episode_return:.1f}, length {length}")
        results.append((episode_return, length))
    returns = np.array([r for r, _ in results])
    print(f"{len(results)} episodes of {cfg.env.env} from {os.path.basename(path)}: return "
          f"{returns.mean():.1f} +- {returns.std():.1f}, length {np.mean([n for _, n in results]):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
