"""Is this checkout as fast as another one (say, the previous main in a second worktree)? Runs the same
measurements on both, interleaved, and prints the ratios this / other.

  git worktree add ../previous origin/main   # then, in this checkout:
  python perf/compare_checkouts.py --other ../previous --rounds 2
  python perf/compare_checkouts.py --other ../previous --env Pong-v5 --seconds 120 --this_flags=--bf16
  python perf/compare_checkouts.py --other ../previous --flags="--algo dqn" --train_only   # both with the flags
  python perf/compare_checkouts.py --other ../previous --env HalfCheetah-v5 --flags="--algo sac" --seconds 60
Per round and checkout (the order alternates between rounds): on CartPole-v1 a training run until the
mean return of the last 100 episodes reaches 475 (time from launch), a training run of --seconds (env
steps/s, median of 2-s windows), and a sampling-only run of --seconds; on another env, or with
--train_only, the training run alone (on another env env steps/s over the run after warm-up: a slow learner
hands slots back in bursts). Each training run also gives its learner updates per second of the run.
--this_flags go to this checkout's runs only. The other checkout runs with --other_python, by default this
Python: give it the Python of a virtual environment where the other checkout is installed (`pip install
--no-build-isolation -e OTHER`) so that it runs with its own compiled kernels and env registry (an editable
install maps sf_engine.envs to its own checkout's envs/); one without the compiled kernels the other has is refused.

Each figure's `_ratio` is the ratio of the two checkouts' medians; with two rounds or more, `_paired` is the
geometric mean of the rounds' ratios (each round's two runs follow one another, so a slow spell of the machine
falls on both) and `_paired_90` its 90% interval (Student's t over the rounds' log ratios). One JSON line last.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, median_windows, run_train  # noqa: E402


def measure(repo: str, python: str, seconds: float, env: str, flags: list, train_only: bool) -> dict:
    flags = ["--env", env] + flags
    train = run_train(
        flags + ["--train_for_seconds", str(seconds), "--train_for_env_steps", str(10**12)], seconds + 180, repo, python
    )
    out = {
        "train_updates_per_sec": train["learner_version"] / train["wall_sec"],
        "train_bottleneck": train["bottleneck"],
    }
    if env != "CartPole-v1":  # a slow learner hands slots back in bursts: the whole run's rate after warm-up
        return {"train_env_steps_per_sec": train["env_steps_per_sec"], **out}
    out["train_env_steps_per_sec"] = median_windows([train])
    if train_only:
        return out
    solve = run_train(flags + ["--stop_at_return", "475", "--train_for_seconds", "120"], 240, repo, python)
    sample = run_train(
        flags + ["--sampling_only", "true", "--train_for_seconds", str(seconds)], seconds + 120, repo, python
    )
    return {
        **out,
        "solve_sec_from_launch": solve["launch_to_exit_sec"] if solve["episode_return_mean"] >= 475 else None,
        "sampling_env_steps_per_sec": median_windows([sample]),
    }


# Student's t at 95% (one side), 1..14 degrees of freedom (the last one beyond): a 90% two-sided interval
_T95 = [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761]  # fmt: skip


def paired(this: list, other: list) -> dict:
    """The geometric mean of the rounds' ratios this / other and its 90% interval (None with one round)."""
    logs = [math.log(a / b) for a, b in zip(this, other) if a is not None and b is not None and a > 0 and b > 0]
    if len(logs) < 2:
        return {}
    mean, sd = statistics.mean(logs), statistics.stdev(logs)
    half = _T95[min(len(logs) - 2, len(_T95) - 1)] * sd / math.sqrt(len(logs))
    return {
        "paired": round(math.exp(mean), 3),
        "paired_90": [round(math.exp(mean - half), 3), round(math.exp(mean + half), 3)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--other", required=True, help="path of the other checkout (its train.py is run)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both checkouts (>= 1)")
    parser.add_argument("--seconds", type=float, default=25.0, help="length of each throughput run")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--this_flags", default="", help="train.py flags for this checkout's runs only")
    parser.add_argument("--flags", default="", help="train.py flags for both checkouts' runs (say, --algo dqn)")
    parser.add_argument("--train_only", action="store_true", help="on CartPole-v1 too, the training run alone")
    parser.add_argument(
        "--other_python",
        default=sys.executable,
        help="Python of a virtual environment where the other checkout is installed",
    )
    args = parser.parse_args()
    other = os.path.abspath(args.other)
    if not os.path.isfile(os.path.join(other, "train.py")):
        parser.error(f"--other {args.other}: no train.py there")
    built = {
        repo: bool(glob.glob(os.path.join(repo, "sf_engine", "model", "_cpu_kernels*.so"))) for repo in (REPO, other)
    }
    if built[REPO] != built[other]:
        unbuilt = other if built[REPO] else REPO
        parser.error(
            f"{unbuilt} has no compiled kernels where the other checkout has them, so the two would run "
            "different layers: build them there (python setup.py build_ext --inplace)"
        )
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1 (got {args.rounds})")
    runs = {"this": [], "other": []}
    for round_index in range(args.rounds):
        both = args.flags.split()
        order = [
            ("this", REPO, sys.executable, both + args.this_flags.split()),
            ("other", other, args.other_python, both),
        ]
        for name, repo, python, flags in order if round_index % 2 == 0 else order[::-1]:
            runs[name].append(measure(repo, python, args.seconds, args.env, flags, args.train_only))
            print(f"round {round_index + 1} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    out = {
        "bench": "compare_checkouts",
        "env": args.env,
        "other": other,
        "rounds": args.rounds,
        "this_flags": args.this_flags,
        "flags": args.flags,
        "train_only": args.train_only,
    }
    for key in [k for k in runs["this"][0] if not k.endswith("bottleneck")]:
        for name in runs:
            out[f"{name}_{key}_runs"] = [r[key] for r in runs[name]]
        medians = {
            name: statistics.median([r[key] for r in runs[name] if r[key] is not None] or [float("nan")])
            for name in runs
        }
        out[f"{key}_ratio"] = round(medians["this"] / medians["other"], 3)
        rounds = paired(out[f"this_{key}_runs"], out[f"other_{key}_runs"])
        out.update({f"{key}_{name}": value for name, value in rounds.items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
