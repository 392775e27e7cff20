"""--num_workers auto / --num_envs_per_worker auto: the balance rule, and real measurements."""

import os
import sys

import pytest

from sf_engine.config.checks import check_resolved
from sf_engine.run.autosize import Costs, choose_envs_per_split, choose_num_workers
from sf_engine.run.plan import build_plan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def test_learner_bound_fast_env_needs_few_workers():
    # CartPole-like: 2.5 us per env step, learning 6 us per sample: the learner takes ~166k steps/s,
    # which half a core of env stepping supplies
    workers, demand = choose_num_workers(Costs(2.5e-6, 2.5e-6, 1e-6, 6e-6), cores=2)
    assert workers == 1 and demand == pytest.approx(1 / 6e-6, rel=0.01)


def test_cpu_bound_env_never_gets_more_workers_than_cores():
    workers, _ = choose_num_workers(Costs(1e-3, 1e-3, 1e-6, 1e-6), cores=2)
    assert workers == 2


def test_waiting_env_gets_more_workers_than_cores_up_to_the_cap():
    workers, _ = choose_num_workers(Costs(2e-3, 1e-5, 1e-5, 1e-5), cores=2)
    assert workers == 8  # 4 per core


def test_envs_per_split_amortize_the_round_trip_and_divide_the_batch():
    assert choose_envs_per_split(Costs(2.5e-6, 2.5e-6, 0, 0), slot_divisor=128, hint=64) == 128  # largest divisor
    assert choose_envs_per_split(Costs(3e-4, 3e-4, 0, 0), slot_divisor=32, hint=16) == 16  # 4.8 ms >= 2 ms
    assert choose_envs_per_split(Costs(3e-4, 3e-4, 0, 0), slot_divisor=32, hint=2) == 8  # 2.4 ms
    assert choose_envs_per_split(Costs(1e-5, 1e-5, 0, 0), slot_divisor=48, hint=16) == 48


def _auto(env_id):
    plan = build_plan(["--env", env_id, "--restart"])  # --restart: reads no experiment
    assert any("--num_workers auto" in note for note in plan.notes)
    lines = [note for note in plan.notes if note.startswith("auto sizing:")]
    assert len(lines) == 3 + any("--rollout auto" in note for note in lines)  # measured, envs, workers (rollout)
    check_resolved(plan.cfg)  # the choice is a valid configuration
    return plan.cfg.sampler


def test_auto_picks_more_workers_for_a_slow_env_than_a_fast_one():
    fast, slow = _auto("CartPole-v1"), _auto("toy_envs:SlowEnv")
    assert slow.num_workers > fast.num_workers, (slow, fast)
    assert slow.num_envs_per_worker <= fast.num_envs_per_worker


def test_serial_mode_needs_no_measurement():
    sampler = build_plan(["--mode", "serial", "--restart"]).cfg.sampler
    assert (sampler.num_workers, sampler.num_envs_per_worker) == (1, 128)


def test_auto_sizing_builds_no_more_envs_than_memory_allows():
    from sf_engine.run.autosize import fit_memory

    heavy = Costs(1e-4, 1e-4, 1e-6, 1e-6, env_bytes=100 * 2**20)  # 100 MiB per env
    allowed = [1, 2, 4, 8, 16, 32, 64]
    gib = 2**30
    # envs per split go down first: 4 workers x 2 splits x 1 env x 100 MiB + 7 processes fit in 4 GiB
    assert fit_memory(4, 64, 2, heavy, 8 * gib, allowed) == (4, 1)
    # sizes the user gave stay; what is auto goes down
    assert fit_memory(4, 64, 2, heavy, 8 * gib, allowed, fixed_envs=True) == (1, 64)
    assert fit_memory(4, 8, 2, heavy, 8 * gib, allowed, fixed_workers=True) == (4, 1)
    # 16 processes alone do not fit in 2 GiB of 4: fewer workers first, the envs per split stay
    assert fit_memory(16, 64, 2, Costs(1e-4, 1e-4, 1e-6, 1e-6, env_bytes=2**10), 4 * gib, allowed) == (2, 64)
    light = Costs(1e-6, 1e-6, 1e-6, 1e-6, env_bytes=2**10)
    assert fit_memory(2, 128, 2, light, 8 * gib, allowed + [128]) == (2, 128)  # nothing to lower


def test_cpu_affinity_auto_gives_a_cpu_learner_its_own_core_when_there_is_one_to_spare():
    def affinity(*flags):
        return build_plan(
            ["--restart", "--num_workers", "1", "--num_envs_per_worker", "8", *flags]
        ).cfg.run.cpu_affinity

    spare = os.cpu_count() > 1
    assert affinity("--device", "cpu") == ("learner" if spare else "off")
    assert affinity("--device", "cpu", "--mode", "serial") == "off"  # one process
    assert affinity("--device", "cpu", "--sampling_only", "true") == "off"  # no training: the sampler takes every core
    assert affinity("--device", "cpu", "--learner_threads", str(os.cpu_count())) == "off"  # no core left over
    assert affinity("--device", "cpu", "--cpu_affinity", "off") == "off"


@pytest.mark.skipif(os.cpu_count() < 2, reason="needs two cores")
def test_pinned_learner_and_sampler_share_no_core():
    import subprocess

    code = (
        "import os, sys; from sf_engine.run.plan import build_plan; from sf_engine.runtime.role import pin_to_cores; "
        "cfg = build_plan(['--restart', '--cpu_affinity', 'learner', '--num_workers', '1', "
        "'--num_envs_per_worker', '8']).cfg; pin_to_cores(sys.argv[1], cfg); print(sorted(os.sched_getaffinity(0)))"
    )
    cores = {
        role: subprocess.run(
            [sys.executable, "-c", code, role],
            capture_output=True,
            text=True,
            check=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        ).stdout.strip()
        for role in ("learner", "policy_worker", "rollout_worker")
    }
    everything = sorted(os.sched_getaffinity(0))
    assert cores["learner"] == str(everything[-1:])  # --learner_threads 1: the last core
    assert cores["policy_worker"] == cores["rollout_worker"] == str(everything[:-1])


def test_rollout_auto_halves_only_for_an_env_too_cheap_to_fill_a_split():
    from sf_engine.run.autosize import choose_rollout

    cartpole, pong = Costs(0.55e-6, 0.55e-6, 1e-6, 3e-6), Costs(280e-6, 280e-6, 150e-6, 1e-3)
    assert choose_rollout(cartpole, 4096) == 16  # 128 envs of 32 steps step in 0.07 ms: splits of 256 instead
    assert choose_rollout(pong, 4096) == 32
    assert choose_rollout(cartpole, 4096 * 4) == 32  # 512 envs: already past the widest split allowed
    plan = build_plan(["--restart", "--device", "cpu"]).cfg  # CartPole's: measured, feed-forward
    assert (plan.sampler.rollout, plan.learner.recurrence) in ((16, 16), (32, 32))
    assert build_plan(["--restart", "--rnn", "gru"]).cfg.sampler.rollout == 32  # the BPTT length stays
    assert build_plan(["--restart", "--num_envs_per_worker", "64"]).cfg.sampler.rollout == 32


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="the wait for a core is read from Linux's schedstat")
def test_on_a_busy_core_a_cpu_bound_env_is_not_taken_for_one_that_waits():
    """Two busy loops share this thread's core: the probe waits for the core about 2/3 of the time. That wait is
    not the env's: what is left is about its CPU time, so the env reads as CPU-bound (at most a worker per core)."""
    import subprocess

    from sf_engine.envs import probe_env_spec
    from sf_engine.run.costs import measure_env

    plan = build_plan(["--env", "CartPole-v1", "--restart", "--num_workers", "1", "--num_envs_per_worker", "128"])
    spec = probe_env_spec("CartPole-v1", "auto")
    core, cores = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for loop in loops:
            os.sched_setaffinity(loop.pid, {core})
        os.sched_setaffinity(0, {core})
        cost, _, _ = measure_env(plan.cfg, spec, 128)
    finally:
        os.sched_setaffinity(0, cores)
        for loop in loops:
            loop.kill()
            loop.wait()
    assert cost.queued > cost.cpu, cost  # it waited for the core longer than it ran
    assert cost.wall < 1.5 * cost.cpu, cost  # the wall less that wait: the env's own work
    assert cost.others_busy > 0.4, cost
    workers, _ = choose_num_workers(Costs(cost.wall, cost.cpu, 1e-6, 1e-6), cores=2)
    assert workers <= 2
