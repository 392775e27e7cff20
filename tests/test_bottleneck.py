"""The bottleneck report on synthetic stage figures names the right stage and knob."""

import pytest

from sf_engine.stats.bottleneck import diagnose, stage_fractions, subtract


def figures(learner=(0.0, 0.0), inference=0.0, workers=(0.0, 0.0, 0.0)):
    """Stage seconds over a 10-s window: learner (busy, waiting for data), policy forward,
    two rollout workers each (env step, waiting for actions, waiting for a slot)."""
    env_step, wait_actions, wait_slot = workers
    worker = {"env_step": env_step, "wait_actions": wait_actions, "wait_slot": wait_slot}
    return {
        "learner": {"train": learner[0], "wait_data": learner[1]},  # busy + waiting = the window
        "policy_worker": {"forward": inference, "wait_requests": 10.0 - inference},
        "rollout_worker_0": dict(worker),
        "rollout_worker_1": dict(worker),
    }


@pytest.mark.parametrize(
    "stage_sec, stage, knob",
    [
        (figures(learner=(9.7, 0.3), inference=2.0, workers=(2.0, 2.0, 6.0)), "learning", "--num_epochs"),
        # the learner never waits for data (one worker feeding it just in time, cores shared): still learner-bound
        (figures(learner=(9.8, 0.2), inference=6.0, workers=(2.5, 4.0, 2.0)), "learning", "--batch_size"),
        (figures(learner=(3.0, 7.0), inference=9.0, workers=(3.0, 6.5, 0.0)), "inference", "--device cuda"),
        (figures(learner=(2.0, 8.0), inference=2.0, workers=(8.0, 1.5, 0.0)), "sampling", "--num_workers"),
        (figures(learner=(7.0, 2.0), inference=5.0, workers=(4.0, 2.0, 1.0)), "balanced", "balanced"),
    ],
)
def test_diagnosis_names_the_binding_stage_and_the_knob(stage_sec, stage, knob):
    diagnosis = diagnose(stage_sec, window_sec=10.0)
    assert diagnosis.stage == stage
    assert knob in diagnosis.message


@pytest.mark.parametrize(
    "stage_sec", [figures(learner=(9.7, 0.3), workers=(2.0, 2.0, 6.0)), figures(inference=9.0, workers=(3.0, 6.5, 0.0))]
)
def test_on_a_gpu_the_advice_is_not_to_use_one(stage_sec):
    on_cpu, on_gpu = diagnose(stage_sec, window_sec=10.0), diagnose(stage_sec, window_sec=10.0, gpu=True)
    assert on_cpu.stage == on_gpu.stage and "--device cuda" in on_cpu.message
    assert "--device cuda" not in on_gpu.message and "--compile" in on_gpu.message


def test_fractions_and_windows():
    newer = figures(learner=(9.0, 1.5), inference=4.0, workers=(5.0, 3.0, 2.0))
    older = figures(learner=(4.0, 1.0), inference=1.0, workers=(1.0, 1.0, 1.0))
    window = subtract(newer, older)
    assert window["learner"] == {"train": 5.0, "wait_data": 0.5}
    fractions = stage_fractions(window, 5.0)
    assert fractions["learner_busy"] == pytest.approx(0.9)
    assert fractions["workers_env_step"] == pytest.approx(0.8)
    assert fractions["workers_wait_slot"] == pytest.approx(0.2)


def test_a_learner_held_in_one_long_first_round_reads_as_learner_bound_and_shows_on_the_status_line(monkeypatch):
    import time

    import numpy as np

    from sf_engine.config.groups import Config
    from sf_engine.stats import messages as msg
    from sf_engine.stats.report import status_line
    from sf_engine.stats.run_stats import RunStats
    from sf_engine.stats.stages import LearnerStage, LiveStage, StageTimer

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    live = np.zeros(2)
    timer = StageTimer(*LearnerStage, live=live)  # the learner's, writing to the shared array
    stats = RunStats(0, np.zeros(1, np.int64), learner_live=LiveStage("learner", LearnerStage, live))
    timer.start()
    timer.enter(LearnerStage.WAIT_DATA)
    clock[0] += 1.0
    timer.lap(LearnerStage.WAIT_DATA)
    timer.lap(LearnerStage.BATCH_ASSEMBLY)
    timer.enter(LearnerStage.TRAIN)  # its first round: no report yet
    workers = {f"rollout_worker_{w}": {"env_step": 0.5, "wait_actions": 0.5, "wait_slot": 0.0} for w in (0, 1)}
    stats.stages = {role: msg.Stages(role, dict(sec), 1.0) for role, sec in workers.items()}
    stats.throughput.warmup = 0
    stats.sample()  # the window opens
    clock[0] += 30.0
    for role in workers:  # the workers wait for free slots the whole window
        stats.stages[role] = msg.Stages(role, {**workers[role], "wait_slot": 30.0}, 31.0)
    assert stats.diagnose_window() == 30.0
    assert stats.diagnosis.stage == "learning" and "learner busy 100%" in stats.diagnosis.message
    assert "| learner in train for 30 s" in status_line(stats, Config(), 1)
    clock[0] += 5.0
    timer.lap(LearnerStage.TRAIN)  # the round ends, and is reported: its 35 s counted once
    stats.stages["learner"] = timer.report("learner")
    assert stats.stage_sec["learner"]["train"] == 35.0 and stats.learner_now() is None
    assert "learner in" not in status_line(stats, Config(), 1)
