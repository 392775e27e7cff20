"""One trained policy as the learner role holds it (sf_engine.roles.learner): its algorithm, its shared weights, the
version it published last, and the guard against updates that are not finite."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sf_engine.algo.base import Algorithm, TrainResult, all_finite
from sf_engine.runtime.checkpoint import latest_valid_checkpoint
from sf_engine.runtime.role import RunStopped
from sf_engine.runtime.weights import SharedWeights


@dataclass
class LearningPolicy:
    """One trained policy as the learner holds it: its algorithm (model, optimizer, maths), its shared
    weights, the version it published last, the oldest version whose samples it still trains on (a
    PBT exploit replaces the weights: what the old ones acted is dropped), and its updates in a row that
    had a non-finite loss or gradient or left non-finite weights (count_bad_updates)."""

    policy: int
    algorithm: Algorithm
    weights: SharedWeights
    version: int = 0
    min_version: int = 0
    bad_updates: int = 0
    publishes: bool = True  # False: a learner rank other than 0 (--num_learners), which counts the versions only
    counted_weights: torch.Tensor | None = None  # a rank that does not publish: the weights of the version counted last

    @property
    def params(self):
        return self.algorithm.params

    def publish(self) -> bool:
        """The algorithm's weights as the next version when every value is finite (one check over the flat
        vector); else the weights published last are put back into the algorithm (the shared copy holds
        them), nothing is published, and False is returned. A rank that does not publish counts the version
        and keeps a copy of the weights instead."""
        if not all_finite(self.params):
            self.params.copy_(self.weights.shared if self.publishes else self.counted_weights)
            return False
        self.version += 1
        if not self.publishes:
            self.counted_weights = self.params.detach().clone()
        else:
            self.weights.publish(self.params, self.version)
        return True

    def count_bad_updates(
        self, result: TrainResult, published: bool, max_bad_updates: int, checkpoint_dir: str
    ) -> None:
        """Count its updates in a row that had a non-finite loss or gradient (the algorithm skipped
        them) or left non-finite weights (`published` False: undone); an update kept ends the run of them.
        The first of a run is logged; --max_bad_updates in a row stop the run (RunStopped, one line)."""
        if published and result.updates:
            self.bad_updates = 0
            return
        bad = result.skipped_updates + (0 if published else max(result.updates, 1))
        if not bad:
            return
        if not self.bad_updates:
            logging.warning(
                "policy %d: %s (version %d); training goes on, and stops after --max_bad_updates %d in a row",
                self.policy,
                "an update had a non-finite loss or gradient: skipped"
                if published
                else "its weights went non-finite in training: those of the version published last are back",
                self.version,
                max_bad_updates,
            )
        self.bad_updates += bad
        if self.bad_updates >= max_bad_updates:
            last, _ = latest_valid_checkpoint(checkpoint_dir)
            raise RunStopped(
                f"{self.bad_updates} updates in a row had a non-finite loss or gradient or left non-finite "
                f"weights (--max_bad_updates {max_bad_updates}; last: policy {self.policy} at version "
                f"{self.version}, learning rate {self.algorithm.learning_rate:g}): the env's observations or "
                f"rewards, or too high a --learning_rate, are the usual causes; the last checkpoint is "
                f"{last or 'none yet'} (weights with a non-finite value are never saved)"
            )
