"""The sampling half of a run on its own shared memory, for a machine without the learner.

A `SamplerNode` holds a run plan's rollout workers and policy worker (the same classes as every mode,
stepped in turn in this one process, as serial mode steps them) over a SharedBuffers and queues of its
own. Weights come in from outside, one whole version at a time (`set_weights`), and are published
into the node's shared weights as the learner publishes them, so every step it samples is tagged with
the version of the learner that made those weights. Full slots go out packed
(`sf_engine.scaleout.slot_transport`): `collect` returns them, with the stats messages the roles sent, and
hands the slots back to the node's free pool. A receiver writes them into free slots of the learner's
run with `unpack_slot`, where they train like local ones.
"""

from __future__ import annotations

import numpy as np

from sf_engine.runtime.ipc import drain, get_many
from sf_engine.runtime.role import InProcessRoles
from sf_engine.runtime.shared_buffers import SharedBuffers
from sf_engine.runtime.slot_pool import SlotPool
from sf_engine.runtime.weights import SharedWeights
from sf_engine.runtime.wiring import make_queues
from sf_engine.scaleout.slot_transport import pack_slot

STEPS_PER_COLLECT = 100_000  # steps of the roles before collect gives up on filling a slot


class SamplerNode:
    """Rollout workers and a policy worker of `plan` over a new shared-memory file at `shm_path`."""

    def __init__(self, plan, shm_path: str):
        cfg = plan.cfg
        self.plan, self.num_acting = plan, cfg.policies.num_acting
        self.buffers = SharedBuffers.create(shm_path, plan.layout)
        try:
            self.queues = make_queues(cfg.sampler.num_workers, num_policies=self.num_acting)
            self.pool = SlotPool(self.buffers, self.queues)
            self.pool.fill()
            self.weights = [SharedWeights(self.buffers, self.queues.weights, p) for p in range(self.num_acting)]
            places = [("policy_worker", 0)] + [("rollout_worker", w) for w in range(cfg.sampler.num_workers)]
            self.roles = InProcessRoles(plan, self.buffers, self.queues, places)
        except BaseException:
            self.buffers.release()
            raise

    def set_weights(self, policy: int, params: np.ndarray, version: int) -> None:
        """Publish `params` (a policy's flat state vector, see sf_engine.model.flat_state.flatten_state) as `version` of
        acting policy `policy`; the policy worker acts with it from its next step."""
        import torch

        flat = torch.as_tensor(np.ascontiguousarray(params, np.float32))
        weights = self.weights[policy]
        if weights.shared is None:
            weights.create(flat, version, readers=("policy_worker",))
        elif flat.shape != weights.shared.shape:
            raise ValueError(
                f"weights of policy {policy}: {flat.numel()} floats where the node's model has "
                f"{weights.shared.numel()}: the learner runs another model"
            )
        else:
            weights.publish(flat, version)

    def collect(self, count: int) -> tuple:
        """Step the roles until at least `count` slots are full; returns (their payloads, the stats
        messages the roles sent meanwhile). Every slot that filled is returned, none is kept."""
        if any(weights.shared is None for weights in self.weights):
            raise RuntimeError("set_weights for every acting policy before collecting")
        full = []
        for _ in range(STEPS_PER_COLLECT):
            self.roles.step()
            full += get_many(self.queues.full_slots, 0)
            if len(full) >= count:
                break
        payloads = [pack_slot(self.buffers, slot) for slot in full]
        self.pool.recycle(full)
        return payloads, drain(self.queues.stats)

    def close(self) -> None:
        try:
            self.roles.close()
        finally:
            self.buffers.release()
