"""Soak test: train for a long time and watch memory, shared memory and the books of env steps.

  python perf/soak.py --minutes 30                  # CartPole defaults
  python perf/soak.py --minutes 10 -- --env Pong-v5  # flags after -- go to train.py

Every minute it samples the resident memory (RSS) of every process of the run (from processes.json)
and the bytes used in /dev/shm. After the run: memory growth from the end of warm-up (the first
`--warmup_minutes`) to the end, shared-memory entries left behind, and the run's env-step books from
summary.json (sampled = trained + dropped for lag + not trainable + dropped with failed workers + in
flight at stop; `unaccounted` must be 0). Prints one JSON line last; exits 1 when growth >= 5%, a
segment leaked or an env step is unaccounted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHM = "/dev/shm"


def shm_entries() -> set:
    return set(os.listdir(SHM))


def shm_used_bytes() -> int:
    stat = os.statvfs(SHM)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def run_rss(exp_dir: str) -> dict:
    """role_index -> RSS bytes of every live process of the run."""
    try:
        with open(os.path.join(exp_dir, "processes.json")) as f:
            rows = json.load(f)["processes"]
    except (OSError, ValueError):
        return {}
    out = {}
    for row in rows:
        try:
            out[f"{row['role']}_{row['index']}"] = psutil.Process(row["pid"]).memory_info().rss
        except psutil.Error:
            pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup_minutes", type=float, default=2.0)
    parser.add_argument("--sample_every_sec", type=float, default=60.0)
    parser.add_argument("train_flags", nargs="*", help="extra train.py flags (after --)")
    args = parser.parse_args()
    before = shm_entries()
    train_dir = tempfile.mkdtemp(prefix="sf_engine_soak_")
    exp_dir = os.path.join(train_dir, "soak")
    cmd = [
        sys.executable,
        os.path.join(REPO, "train.py"),
        "--train_dir",
        train_dir,
        "--experiment",
        "soak",
        "--train_for_seconds",
        str(args.minutes * 60),
        "--train_for_env_steps",
        str(10**13),
        "--status_every_sec",
        "60",
    ] + args.train_flags
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples = []
    next_sample = start + args.sample_every_sec
    try:
        while proc.poll() is None:
            time.sleep(max(0.0, min(1.0, next_sample - time.monotonic())))
            if time.monotonic() >= next_sample and proc.poll() is None:
                rss = run_rss(exp_dir)
                samples.append(
                    {
                        "minute": round((time.monotonic() - start) / 60, 2),
                        "rss_bytes": sum(rss.values()),
                        "processes": len(rss),
                        "shm_used_bytes": shm_used_bytes(),
                    }
                )
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
                next_sample += args.sample_every_sec
        out = proc.communicate()[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    with open(os.path.join(exp_dir, "summary.json")) as f:
        summary = json.load(f)
    shutil.rmtree(train_dir, ignore_errors=True)
    leaked = sorted(shm_entries() - before)
    warm = [s for s in samples if s["minute"] >= args.warmup_minutes]
    growth = (warm[-1]["rss_bytes"] / warm[0]["rss_bytes"] - 1.0) if len(warm) >= 2 else None
    shm_growth = (warm[-1]["shm_used_bytes"] - warm[0]["shm_used_bytes"]) if len(warm) >= 2 else None
    books = summary["env_step_books"]
    result = {
        "bench": "soak",
        "minutes": args.minutes,
        "exit_code": proc.returncode,
        "env": summary["env"],
        "env_steps": summary["env_steps"],
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "episode_return_mean": summary["episode_return_mean"],
        "rss_mb_first_after_warmup": round(warm[0]["rss_bytes"] / 2**20, 1) if warm else None,
        "rss_mb_last": round(warm[-1]["rss_bytes"] / 2**20, 1) if warm else None,
        "rss_growth_after_warmup": round(growth, 4) if growth is not None else None,
        "shm_used_growth_bytes_after_warmup": shm_growth,
        "leaked_shm_entries": leaked,
        "env_step_books": books,
        "worker_restarts": summary["worker_restarts"],
        "samples": samples,
    }
    ok = proc.returncode == 0 and growth is not None and growth < 0.05 and not leaked and books.get("unaccounted") == 0
    if proc.returncode != 0:
        sys.stderr.write(out[-3000:])
    result["passed"] = ok
    print(json.dumps(result))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
