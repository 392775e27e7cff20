"""The replay ratio held by the rate limiter, in a run where learning is the slower side and in one where sampling
is: the ratio of every 10-s window after --learning_starts, against --replay_ratio.

  python perf/replay_ratio.py                        # CartPole-v1 --algo dqn, 60 s each
  python perf/replay_ratio.py --seconds 120 -- --env Acrobot-v1

Learning slower: the classic-control DQN defaults (--replay_ratio 8: the learner takes all it can, the rollout
workers wait for free slots). Sampling slower: --replay_ratio 0.25 (the learner waits for data). Prints each run
(stderr) and one JSON line last: per run, the windows' ratios, their largest relative error, which side waited
(the run's bottleneck and the share of its seconds the learner waited for data).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402

RUNS = {"learning_slower": ["--replay_ratio", "8"], "sampling_slower": ["--replay_ratio", "0.25"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="each run's --train_for_seconds")
    parser.add_argument("train_args", nargs="*", help="more flags for train.py (after --)")
    args = parser.parse_args()
    result = {"algo": "dqn", "mode": "async", "train_for_seconds": args.seconds}
    for name, flags in RUNS.items():
        run_flags = ["--algo", "dqn", "--train_for_seconds", str(args.seconds), *flags, *args.train_args]
        summary = run_train(run_flags, timeout_sec=args.seconds + 300)
        target = summary["replay_ratio_target"]
        windows = summary["replay_ratio_windows"]
        figures = {
            "flags": " ".join(flags + args.train_args),
            "env": summary["env"],
            "num_workers": summary["num_workers"],
            "num_envs_per_worker": summary["num_envs_per_worker"],
            "replay_ratio_target": target,
            "replay_ratio": summary["replay_ratio"],
            "windows": windows,
            "max_window_error": round(max(abs(w - target) / target for w in windows), 4) if windows else None,
            "env_steps_per_sec": summary["env_steps_per_sec"],
            "frames_per_sec": summary["frames_per_sec"],
            "policy_lag_mean": summary["policy_lag_mean"],
            "episode_return_mean": summary["episode_return_mean"],
            "bottleneck": summary["bottleneck"],
            "learner_waited_share": round(summary["replay_learner_waited_sec"] / summary["wall_sec"], 3),
            "wall_sec": summary["wall_sec"],
        }
        print(name, json.dumps(figures), file=sys.stderr, flush=True)
        result[name] = figures
    print(json.dumps(result))


if __name__ == "__main__":
    main()
