"""Which stage binds a run, and the knob to turn: a pure function of per-role stage seconds.

Runs in the runner, over the stage seconds that the roles accumulated during a window of wall time,
read by the stage names they book to (sf_engine.stats.stages). The learner's and the policy worker's busy
fractions are the window less their waiting: the learner reports once per training batch, so its latest
batch may still be running when the window closes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.stats.stages import InferenceStage, LearnerStage, ReceiverStage, SamplerStage, WorkerStage

BUSY = 0.8  # a role busier than this is saturated
NEVER_WAITS = 0.95  # a learner this busy trains back to back: it sets the pace whatever the others do
WAITING = 0.3  # a role waiting longer than this for another one is held up by it


@dataclass
class Diagnosis:
    stage: str  # "learning", "inference", "sampling", "receiving" (sampler nodes), or "balanced"
    message: str
    fractions: dict


def _mean(values: list) -> float:
    return sum(values) / len(values) if values else 0.0


def stage_fractions(stage_sec: dict, window_sec: float) -> dict:
    """Fractions of the window: learner busy/waiting for data, policy worker busy, rollout workers
    stepping envs / waiting for actions / waiting for a free slot (mean over workers; a device sampler's env steps,
    forward passes and slot writes count as its stepping)."""
    learner = stage_sec.get("learner", {})
    policy = stage_sec.get("policy_worker", {})
    workers = [v for k, v in stage_sec.items() if k.startswith("rollout_worker")]
    samplers = [v for k, v in stage_sec.items() if k.startswith("device_sampler")]
    receiver = stage_sec.get("receiver")
    window = max(window_sec, 1e-9)
    remote = (
        {}
        if receiver is None
        else {
            "receiver_busy": 1.0
            - (receiver.get(ReceiverStage.WAIT_REMOTE, 0.0) + receiver.get(ReceiverStage.WAIT_SLOT, 0.0)) / window
        }
    )
    return remote | {
        "learner_busy": 1.0 - learner.get(LearnerStage.WAIT_DATA, 0.0) / window if learner else 0.0,
        "learner_wait_data": learner.get(LearnerStage.WAIT_DATA, 0.0) / window,
        "inference_busy": 1.0 - policy.get(InferenceStage.WAIT_REQUESTS, 0.0) / window if policy else 0.0,
        "workers_env_step": _mean(
            [w.get(WorkerStage.ENV_STEP, 0.0) for w in workers]
            + [window - s.get(SamplerStage.WAIT_SLOT, 0.0) for s in samplers]
        )
        / window,
        "workers_wait_actions": _mean([w.get(WorkerStage.WAIT_ACTIONS, 0.0) for w in workers]) / window,
        "workers_wait_slot": _mean([w.get(WorkerStage.WAIT_SLOT, 0.0) for w in workers + samplers]) / window,
    }


def diagnose(stage_sec: dict, window_sec: float, replay_ratio: float | None = None, gpu: bool = False) -> Diagnosis:
    """The binding stage of a window; `replay_ratio`: the target of a run with a replay buffer (whose rate
    limiter makes sampling wait for learning, or learning for data); `gpu`: the run is on one already."""
    f = stage_fractions(stage_sec, window_sec)
    pct = {k: f"{100 * v:.0f}%" for k, v in f.items()}
    if f["learner_busy"] >= NEVER_WAITS or (f["learner_busy"] >= BUSY and f["workers_wait_slot"] >= WAITING):
        fix = "raise --batch_size or lower --num_epochs"
        if replay_ratio is not None:
            fix = f"the replay ratio's limiter holds sampling back: lower --replay_ratio ({replay_ratio:g})"
        return Diagnosis(
            "learning",
            f"learner-bound: learner busy {pct['learner_busy']}, workers wait "
            f"{pct['workers_wait_slot']} for free slots: {fix}, or "
            + ("--compile / --bf16" if gpu else "use a GPU (--device cuda)"),
            f,
        )
    if f["inference_busy"] >= BUSY and f["workers_wait_actions"] >= WAITING:
        return Diagnosis(
            "inference",
            f"inference-bound: policy worker busy {pct['inference_busy']}, workers wait "
            f"{pct['workers_wait_actions']} for actions: "
            + (
                "raise --num_envs_per_worker (fewer, larger forwards) or --compile"
                if gpu
                else "use a GPU (--device cuda) or a smaller model"
            ),
            f,
        )
    if "receiver_busy" in f and f["learner_wait_data"] >= WAITING and f["workers_env_step"] < 0.5:
        if f["receiver_busy"] >= BUSY:
            return Diagnosis(
                "receiving",
                f"receiver-bound: the receiver is busy {pct['receiver_busy']} moving "
                f"slots from the sampler actors, the learner waits {pct['learner_wait_data']} for data: "
                f"raise --num_envs_per_worker (fewer, larger slots) or give the receiver a core of "
                f"its own (fewer local --num_workers)",
                f,
            )
        return Diagnosis(
            "sampling",
            f"sampling-bound: the learner waits {pct['learner_wait_data']} for data while "
            f"the receiver waits for the sampler actors (busy {pct['receiver_busy']}): add "
            f"--num_remote_samplers (or local --num_workers)",
            f,
        )
    if f["workers_env_step"] >= 0.5 and f["learner_wait_data"] >= WAITING:
        return Diagnosis(
            "sampling",
            f"sampling-bound: workers step envs {pct['workers_env_step']} of the time, "
            f"the learner waits {pct['learner_wait_data']} for data: add --num_workers (up to the "
            f"cores) or raise --num_envs_per_worker"
            + ("" if replay_ratio is None else f", or train more per env step (--replay_ratio {replay_ratio:g})"),
            f,
        )
    return Diagnosis(
        "balanced",
        f"balanced: learner busy {pct['learner_busy']}, policy worker busy "
        f"{pct['inference_busy']}, workers stepping envs {pct['workers_env_step']}",
        f,
    )


def subtract(newer: dict, older: dict) -> dict:
    """Stage seconds accumulated between two snapshots of cumulative per-role stage seconds."""
    return {
        role: {stage: max(0.0, sec - older.get(role, {}).get(stage, 0.0)) for stage, sec in stages.items()}
        for role, stages in newer.items()
    }  # a restarted process starts its counts from 0
