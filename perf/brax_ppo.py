"""Our PPO on a Brax env through the JAX bridge against Brax's own PPO trainer (brax.training.agents.ppo: the whole
loop on the device under JAX), the same env on the same device in one call: env steps/s once compiled, and the
return at the same env steps.

  python perf/brax_ppo.py --env ant --device cuda                       # the GPU figure: Brax's 50M env steps of ant
  python perf/brax_ppo.py --env inverted_pendulum --device cpu --env_steps 300000 --num_envs 256   # a CPU check

Brax's run takes its published settings for the env (BRAX_SETTINGS; ant: 4,096 envs, unrolls of 5 steps, 32
minibatches of 2,048 unrolls, 4 epochs, discount 0.97, ...; --num_envs scales its envs and minibatches together);
ours the same where a flag of ours means the same (`our_flags`), our own otherwise: our return normalization where
Brax scales its rewards, and 4 layers of 256 units in both heads, the nearest of ours to its networks (on Brax's
inverted_pendulum they take ours to 1,000 in Brax's env steps, our continuous family's 2 x 64 in about twice them).
Rates: Brax's env steps from its second evaluation to its last over the seconds between them (its compilation is
before the second); ours from the second status line (every 2 s) with env steps to the last. Returns: the last
evaluation of each, the greedy policy (Brax's deterministic_eval, which changes nothing of its training) on 128
episodes of at most 1,000 steps; ours every 20 s in its evaluator process, so its last comes up to 20 s before the
end of the same env steps (or at what it reached when --timeout_sec less 30 s stopped it). Each trainer runs in a
process of its own (JAX takes the GPU's memory it is given).
Prints each run (stderr) and one JSON line last. Needs brax beside jax.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402

# Brax's published PPO settings (its README's training examples), by env: what they share, then each env's own
SHARED = dict(episode_length=1000, normalize_observations=True, action_repeat=1, num_minibatches=32, learning_rate=3e-4)
ANT_LIKE = dict(reward_scaling=10, unroll_length=5, num_updates_per_batch=4, discounting=0.97, entropy_cost=1e-2)
BRAX_SETTINGS = {
    "ant": SHARED | ANT_LIKE | dict(num_timesteps=50_000_000, num_evals=10, num_envs=4096, batch_size=2048, seed=1),
    "halfcheetah": SHARED
    | dict(num_timesteps=50_000_000, num_evals=20, reward_scaling=1, unroll_length=20, num_updates_per_batch=8)
    | dict(discounting=0.95, entropy_cost=1e-3, num_envs=2048, batch_size=512, seed=3),
    "inverted_pendulum": SHARED
    | ANT_LIKE
    | dict(num_timesteps=2_000_000, num_evals=20, num_envs=2048, batch_size=1024, seed=1),
}
STATUS = re.compile(r"\[\s*([\d.]+)s\] env steps ([\d,]+) \|")


def settings(args) -> dict:
    """Brax's settings for --env, with --env_steps and --num_envs (its minibatches scaled with it) where given."""
    chosen = dict(BRAX_SETTINGS[args.env])
    if args.env_steps:
        chosen["num_timesteps"] = args.env_steps
    if args.num_envs:
        chosen["batch_size"] = max(1, chosen["batch_size"] * args.num_envs // chosen["num_envs"])
        chosen["num_envs"] = args.num_envs
    return chosen


def run_brax(env: str, chosen: dict) -> dict:
    """Brax's PPO trainer on `env` (in this process): its evaluations as (seconds, env steps, return)."""
    import jax

    if not hasattr(jax, "device_put_replicated"):  # gone from JAX 0.8 on, still called by Brax 0.14's trainer
        jax.device_put_replicated = lambda tree, devices: jax.device_put(
            jax.tree.map(lambda leaf: jax.numpy.stack([leaf] * len(devices)), tree), devices[0]
        )
    from brax import envs
    from brax.training.agents.ppo import train as ppo

    evaluations, start = [], time.monotonic()

    def progress(steps, metrics):
        evaluations.append((time.monotonic() - start, int(steps), float(metrics["eval/episode_reward"])))
        print(f"brax: {evaluations[-1]}", file=sys.stderr, flush=True)

    ppo.train(environment=envs.get_environment(env), progress_fn=progress, deterministic_eval=True, **chosen)
    (t0, s0, _), (t1, s1, last) = evaluations[1], evaluations[-1]
    return {
        "env_steps": s1,
        "env_steps_per_sec": round((s1 - s0) / (t1 - t0)),
        "return": round(last, 1),
        "launch_to_end_sec": round(t1, 1),
        "evaluations": evaluations,
    }


def our_flags(env: str, chosen: dict, device: str) -> list:
    """Ours with Brax's settings where a flag of ours means the same (a slot: one unroll of every env)."""
    unroll = chosen["unroll_length"]
    return [
        "--env",
        f"brax/{env}",
        "--device",
        device,
        "--algo",
        "ppo",
        "--seed",
        str(chosen["seed"]),
        "--num_envs_per_worker",
        str(chosen["num_envs"]),
        "--rollout",
        str(unroll),
        "--batch_size",
        str(chosen["batch_size"] * unroll),
        "--num_batches_per_epoch",
        str(chosen["num_minibatches"]),
        "--num_epochs",
        str(chosen["num_updates_per_batch"]),
        "--gamma",
        str(chosen["discounting"]),
        "--learning_rate",
        str(chosen["learning_rate"]),
        "--entropy_coeff",
        str(chosen["entropy_cost"]),
        "--ppo_clip_ratio",
        "0.3",
        "--gae_lambda",
        "0.95",
        "--value_loss_coeff",
        "0.5",
        "--normalize_input",
        str(chosen["normalize_observations"]).lower(),
        "--normalize_returns",
        "true",
        "--hidden_size",  # the nearest of ours to Brax's networks (policy 4 x 32, value 5 x 256)
        "256",
        "--mlp_layers",
        "4",
        "--train_for_env_steps",
        str(chosen["num_timesteps"]),
    ]


def run_ours(env: str, chosen: dict, device: str, timeout_sec: float) -> dict:
    lines: list = []

    def read_status(train_dir, experiment):
        with open(os.path.join(train_dir, experiment, "train.log")) as f:
            lines.extend((float(m[1]), int(m[2].replace(",", ""))) for m in map(STATUS.search, f) if m and m[2] != "0")

    evaluation = ["--eval_every_sec", "20", "--eval_episodes", "128", "--eval_max_steps", "128000"]
    stop = ["--train_for_seconds", str(max(10, int(timeout_sec) - 30))]  # within the limit: it ends with its figures
    flags = our_flags(env, chosen, device) + evaluation + stop + ["--status_every_sec", "2"]
    summary = run_train(flags, timeout_sec, inspect=read_status)
    (t0, s0), (t1, s1) = lines[1], lines[-1]
    return {
        "env_steps": summary["env_steps"],
        "env_steps_per_sec": round((s1 - s0) / (t1 - t0)),
        "return": summary["eval_return_mean"],
        "eval_version": summary["eval_version"],
        "training_return": round(summary["episode_return_mean"], 1),
        "launch_to_end_sec": summary["launch_to_exit_sec"],
        "policy_lag_mean": summary["policy_lag_mean"],
        "bottleneck": summary["bottleneck"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="ant", choices=sorted(BRAX_SETTINGS), help="a Brax env of BRAX_SETTINGS")
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--env_steps", type=int, default=0, help="both runs' env steps (0: Brax's published)")
    parser.add_argument("--num_envs", type=int, default=0, help="both runs' envs (0: Brax's published)")
    parser.add_argument("--timeout_sec", type=float, default=1200.0, help="each run's limit")
    parser.add_argument("--brax_only", action="store_true", help=argparse.SUPPRESS)  # the child that runs Brax's
    args = parser.parse_args()
    chosen = settings(args)
    if args.brax_only:
        print(json.dumps(run_brax(args.env, chosen)))
        return
    child = [sys.executable, os.path.abspath(__file__), "--brax_only", *sys.argv[1:]]
    platform = {"JAX_PLATFORMS": "cuda" if args.device == "cuda" else "cpu"}
    try:  # its evaluations go to stderr as they come: a run past the limit leaves them there
        done = subprocess.run(
            child, stdout=subprocess.PIPE, text=True, timeout=args.timeout_sec, env=os.environ | platform
        )
    except subprocess.TimeoutExpired:
        print(json.dumps({"env": f"brax/{args.env}", "device": args.device, "brax": f"past {args.timeout_sec} s"}))
        raise SystemExit(f"Brax's trainer ran past --timeout_sec {args.timeout_sec}: its evaluations are above")
    if done.returncode != 0:
        raise SystemExit(f"Brax's trainer exited with {done.returncode}")
    brax = json.loads(done.stdout.strip().splitlines()[-1])
    # Brax's trainer runs whole training steps past num_timesteps: ours then takes the env steps it took
    ours = run_ours(args.env, chosen | {"num_timesteps": brax["env_steps"]}, args.device, args.timeout_sec)
    print(f"ours: {ours}", file=sys.stderr)
    brax.pop("evaluations")
    result = {
        "env": f"brax/{args.env}",
        "device": args.device,
        "brax_settings": chosen,
        "brax": brax,
        "ours": ours,
        "rate_ratio": round(ours["env_steps_per_sec"] / brax["env_steps_per_sec"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
