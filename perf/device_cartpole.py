"""CartPole as a device env on this machine's CPU (TorchCartPole-v1, device mode: one sampler process) against the
rollout-worker path (CartPole-v1 through EnvPool: rollout workers and a policy worker), PPO at the defaults, the two
alternating round by round: training env steps/s over a fixed time, and seconds from launch to a mean return of 475.

  python perf/device_cartpole.py                       # 3 rounds: 30-s throughput runs, then runs to 475
  python perf/device_cartpole.py --rounds 5 --baseline_backend gymnasium
  python perf/device_cartpole.py --algo dqn --skip_solve -- --num_envs_per_worker 64   # flags after -- go to both

Throughput: each run's median of its 10-s windows of training env steps/s (start-up excluded). Time to 475: from the
launch of train.py (imports and start-up included) to the stop at --stop_at_return 475. Prints each run (stderr)
and one JSON line last, with the ratios of the medians (device / workers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_windows, run_train  # noqa: E402


def systems(baseline_backend: str) -> dict:
    return {
        "device": ["--env", "TorchCartPole-v1"],
        "workers": ["--env", "CartPole-v1", "--env_backend", baseline_backend],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="each throughput run's --train_for_seconds")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--baseline_backend", default="envpool", choices=("envpool", "gymnasium"))
    parser.add_argument("--skip_solve", action="store_true", help="throughput runs only")
    parser.add_argument("train_args", nargs="*", help="more flags for both (after --)")
    args = parser.parse_args()
    runs: dict = {name: {"throughput": [], "solve": []} for name in ("device", "workers")}
    for round_index in range(args.rounds):
        order = list(systems(args.baseline_backend).items())
        order = order if round_index % 2 == 0 else order[::-1]
        for name, env_flags in order:
            flags = [*env_flags, "--algo", args.algo, *args.train_args]
            summary = run_train([*flags, "--train_for_seconds", str(args.seconds)], timeout_sec=args.seconds + 180)
            runs[name]["throughput"].append(summary)
            print(name, "throughput", json.dumps(summary), file=sys.stderr, flush=True)
            if not args.skip_solve:
                solve = run_train([*flags, "--stop_at_return", "475", "--train_for_seconds", "120"], 300)
                solved = solve["episode_return_mean"] is not None and solve["episode_return_mean"] >= 475
                runs[name]["solve"].append(solve["launch_to_exit_sec"] if solved else None)
                print(name, "solve", json.dumps(solve), file=sys.stderr, flush=True)
    figures = {}
    for name, measured in runs.items():
        solves = measured["solve"]
        figures[name] = {
            "env_steps_per_sec": round(median_windows(measured["throughput"])),
            "seconds_to_475": solves,
            "seconds_to_475_median": statistics.median(solves) if solves and None not in solves else None,
            "policy_lag_mean": statistics.median(s["policy_lag_mean"] for s in measured["throughput"]),
            "num_workers": measured["throughput"][-1]["num_workers"],
            "num_envs_per_worker": measured["throughput"][-1]["num_envs_per_worker"],
        }
    device, workers = figures["device"], figures["workers"]
    both_solved = device["seconds_to_475_median"] and workers["seconds_to_475_median"]
    result = {
        "env": "TorchCartPole-v1 vs CartPole-v1",
        "algo": args.algo,
        "mode": "async",
        "rounds": args.rounds,
        "baseline_backend": args.baseline_backend,
        "device": device,
        "workers": workers,
        "env_steps_per_sec_ratio": round(device["env_steps_per_sec"] / workers["env_steps_per_sec"], 3),
        "seconds_to_475_ratio": (
            round(device["seconds_to_475_median"] / workers["seconds_to_475_median"], 3) if both_solved else None
        ),
        "env_steps_per_sec": device["env_steps_per_sec"],
        "frames_per_sec": device["env_steps_per_sec"],
        "num_workers": device["num_workers"],
        "num_envs_per_worker": device["num_envs_per_worker"],
        "policy_lag_mean": device["policy_lag_mean"],
        "wall_sec": args.seconds,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
