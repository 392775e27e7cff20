"""What one receiver can take in: whole trajectory slots through Ray's object store into local shared
memory (needs `pip install ray`).

  python perf/ray_receiver.py --env CartPole-v1 --senders 2 --seconds 20
Builds the run plan of `train.py --env ENV` (its slot layout: rollout x envs per split, every field a
learner reads), starts a local Ray instance with --senders actors, each holding one packed slot of that
layout (sf_engine.scaleout.slot_transport.pack_slot) that it hands out again and again, as a sampler node hands
out the slots its workers fill. The receiver, in this process, keeps --in_flight requests open per
sender, and for each slot that arrives fetches it from the object store and writes it into a local
slot (unpack_slot, with its checks), cycling over the run's slots. Sampling is left out on purpose:
this measures the receiving end. The senders share the machine with the receiver, so the rate is that
of the whole loop; `receiver_busy` says how much of the time the receiver spent fetching and writing
(its own ceiling is about slots/s / receiver_busy). Prints one JSON line: env steps/s received,
slots/s, bytes per env step, the receiver's microseconds per slot fetching and writing, its busy share,
and the bytes of one weights version.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sf_engine.run.plan import build_plan  # noqa: E402
from sf_engine.runtime.shared_buffers import SharedBuffers, shm_path  # noqa: E402
from sf_engine.scaleout.slot_transport import pack_slot, unpack_slot  # noqa: E402


def _payload(layout: dict, shm_dir: str) -> dict:
    """One slot of `layout`, packed, with random observations, rewards and versions."""
    buffers = SharedBuffers.create(shm_path(shm_dir, "ray_receiver_payload"), layout)
    try:
        rng = np.random.default_rng(0)
        for array in buffers.obs.values():
            array[0] = rng.integers(0, 255, array[0].shape).astype(array.dtype)
        buffers.rewards[0] = rng.random(buffers.rewards[0].shape)
        buffers.policy_version[0] = 7
        buffers.valid[0] = True
        buffers.slot_rows[0] = buffers.log_probs.shape[1]
        return pack_slot(buffers, 0)
    finally:
        buffers.release()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--senders", type=int, default=2, help="Ray actors handing out slots")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--in_flight", type=int, default=4, help="open requests per sender")
    parser.add_argument("--shm_dir", default="/dev/shm")
    args = parser.parse_args()
    import ray

    with tempfile.TemporaryDirectory() as train_dir:
        plan = build_plan(["--env", args.env, "--train_dir", train_dir, "--experiment", "receiver"])
    layout, cfg = plan.layout, plan.cfg
    payload = _payload(layout, args.shm_dir)
    slot_bytes = sum(value.nbytes for value in payload.values())
    steps_per_slot = cfg.sampler.rollout * cfg.sampler.envs_per_split

    @ray.remote(num_cpus=0)
    class Sender:
        def __init__(self, slot):
            self.slot = slot

        def next_slot(self):
            return self.slot

    ray.init(num_cpus=args.senders + 1, include_dashboard=False, log_to_driver=False)
    receiver = SharedBuffers.create(shm_path(args.shm_dir, "ray_receiver"), layout)
    try:
        senders = [Sender.remote(ray.put(payload)) for _ in range(args.senders)]
        ray.get([sender.next_slot.remote() for sender in senders])  # warm: every actor up
        pending = {sender.next_slot.remote(): sender for sender in senders for _ in range(args.in_flight)}
        slots = receiver.slot_owner.shape[0]
        received = fetch_sec = write_sec = 0.0
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            ready, _ = ray.wait(list(pending), num_returns=1)
            sender = pending.pop(ready[0])
            pending[sender.next_slot.remote()] = sender
            t0 = time.perf_counter()
            slot = ray.get(ready[0])
            t1 = time.perf_counter()
            received += unpack_slot(receiver, int(received // steps_per_slot) % slots, slot)
            write_sec += time.perf_counter() - t1
            fetch_sec += t1 - t0
        wall = time.perf_counter() - started
    finally:
        receiver.release()
        ray.shutdown()
    count = received / steps_per_slot
    if not count:
        raise SystemExit("no slot arrived: is Ray running?")
    print(
        json.dumps(
            {
                "env": args.env,
                "senders": args.senders,
                "in_flight": args.in_flight,
                "slot_env_steps": steps_per_slot,
                "slot_bytes": slot_bytes,
                "bytes_per_env_step": round(slot_bytes / steps_per_slot, 1),
                "env_steps_per_sec": round(received / wall),
                "slots_per_sec": round(count / wall, 1),
                "fetch_us_per_slot": round(fetch_sec / count * 1e6, 1),
                "write_us_per_slot": round(write_sec / count * 1e6, 1),
                "receiver_busy": round((fetch_sec + write_sec) / wall, 2),
                "weights_bytes_per_version": _weights_bytes(plan),
                "seconds": round(wall, 1),
            }
        )
    )


def _weights_bytes(plan) -> int:
    """Bytes of one policy version as the learner publishes it (its flat float32 state vector)."""
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.flat_state import flatten_state

    return int(flatten_state(ActorCritic(plan.spec, plan.cfg.model)).numel()) * 4


if __name__ == "__main__":
    main()
