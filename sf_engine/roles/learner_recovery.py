"""What a learner (sf_engine.roles.learner.Learner) starts from besides scratch: a checkpoint to resume from, or what a
learner that died left (the training state it kept, else its last checkpoint and the weights it published last)."""

from __future__ import annotations

import logging
import os
import time

import torch

from sf_engine.runtime.checkpoint import CheckpointError, latest_valid_checkpoint, load_checkpoint, policy_states


def resume_from(learner, path: str) -> None:
    """`learner` (a Learner) goes on from the checkpoint at `path`, of one policy or of several
    (sf_engine.runtime.checkpoint.policy_states)."""
    adopt(learner, load_checkpoint(path, learner.device), path)


def adopt(learner, state: dict, source: str) -> None:
    """`learner` goes on from a checkpoint's `state` (read from `source`: a path, or learner rank 0's)."""
    for policy, policy_state in zip(learner.policies, policy_states(state)):
        policy.algorithm.load(policy_state, source)
        policy.version = policy.min_version = int(policy_state["version"])
        logging.info("policy %d resumed from %s (version %d)", policy.policy, source, policy.version)
    learner.population.load(state)


def recover(learner) -> str:
    """`learner` (a Learner) takes what a learner that died left: the training state it kept (Learner._keep_when_due),
    whole; without one, the newest checkpoint that loads (weights, optimizer state, the population), then each
    policy's weights as that learner published them last where they are newer (they outlive it in the shared-memory
    file: SharedWeights.last_published). Returns one line on where each policy's state came from, and so what was
    lost."""
    kept = _kept_state(learner)
    if kept is not None:
        return _resume_kept(learner, kept)
    path, _ = latest_valid_checkpoint(learner.checkpoint_dir, load=True)
    if path:
        resume_from(learner, path)
    name = os.path.basename(path) if path else None
    parts, learner.newer_than_checkpoint = [], False
    for policy in learner.policies:
        published = policy.weights.last_published(policy.params.numel())
        if published is not None and (path is None or published[0] > policy.version):
            policy.version, flat = published
            policy.params.copy_(torch.from_numpy(flat))
            policy.algorithm.weights_replaced()
            learner.newer_than_checkpoint = True
            optimizer = f"the optimizer state of {name}" if name else "a new optimizer state (no checkpoint yet)"
            parts.append(
                f"policy {policy.policy} version {policy.version} from its last published weights, {optimizer}"
            )
        else:
            source = name or "scratch (nothing published, no checkpoint)"
            parts.append(f"policy {policy.policy} version {policy.version} from {source}")
    return "recovered what the learner left: " + "; ".join(parts)


def _kept_state(learner) -> dict | None:
    """The training state a dead learner kept, or None where it kept none (or, never expected, none whole)."""
    if not os.path.exists(learner.kept_path):
        return None
    try:
        return load_checkpoint(learner.kept_path, learner.device)
    except CheckpointError as exc:
        logging.warning("the training state the learner kept is not used: %s", exc)
        return None


def _resume_kept(learner, kept: dict) -> str:
    """Every policy's training state as the dead learner kept it; each goes on from the version it published
    last (the kept state is up to KEEP_EVERY_SEC older: its weights are published as the next version)."""
    parts, age = [], max(0.0, time.time() - float(kept["kept_at"]))
    for policy, state in zip(learner.policies, policy_states(kept)):
        policy.algorithm.load(state, "the training state the learner kept")
        published = policy.weights.last_published(policy.params.numel())
        policy.version = max(int(state["version"]), published[0] if published is not None else 0)
        parts.append(
            f"policy {policy.policy} version {policy.version} with the training state of version "
            f"{int(state['version'])}"
        )
    learner.population.load(kept)
    learner.newer_than_checkpoint = True
    return (
        f"recovered what the learner left: {'; '.join(parts)}, kept {age:.1f} s before (weights, optimizer "
        f"moments and the rest of the algorithm's state)"
    )
