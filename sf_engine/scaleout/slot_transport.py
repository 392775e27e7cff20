"""Whole trajectory slots as plain arrays, to move them between the shared memories of two machines.

`pack_slot` copies one slot's fields out of a run's SharedBuffers into a dict of numpy arrays (a
payload); `unpack_slot` writes a payload into a free slot of another SharedBuffers of the same layout,
after checking every field's name, dtype and shape, and returns the env steps it holds. Everything a
learner reads of a slot travels (observations with the bootstrap row, actions, behaviour log-probs and
values, policy versions, rewards, episode ends, validity, and where the run has them the acting mask,
policy ids and recurrent states). A slot filled on another machine whose policy worker acted with this
learner's published versions (and the same policy numbering) then trains as a local one: lag and
V-trace see the same version tags. The env steps it holds are returned for the receiver to book.
`unpack_slot` takes plain numpy arrays only and checks their values where a bad one would break
training (versions, policy ids, finite floats). It does not decode anything: whatever carries the
payload (Ray's object store unpickles it) must connect trusted peers only.
"""

from __future__ import annotations

import numpy as np

from sf_engine.algo.batch import SLOT_FIELDS
from sf_engine.runtime.shared_buffers import NO_OWNER, slot_fields

ROWS_KEY = "rows"  # the env-step rows written into the slot (slot_rows)


class PayloadError(ValueError):
    """A payload that does not fit the local slots: one line naming the field."""


def _array(buffers, name: str) -> np.ndarray:
    return buffers.obs[name[4:]] if name.startswith("obs.") else getattr(buffers, name)


def pack_slot(buffers, slot: int) -> dict:
    """A copy of slot `slot`'s trajectory: field name -> array, and ROWS_KEY -> rows written."""
    payload = {name: np.array(_array(buffers, name)[slot]) for name in slot_fields(buffers.layout)}
    payload[ROWS_KEY] = np.array(buffers.slot_rows[slot], np.int64)
    return payload


_FINITE = tuple(field.name for field in SLOT_FIELDS if field.finite)  # a NaN here would poison a whole batch


def unpack_slot(buffers, slot: int, payload: dict, latest_version: int | None = None, owner: int = NO_OWNER) -> int:
    """Write `payload` (pack_slot's, from a run of the same layout) into free local slot `slot` (its
    slot_owner `owner`: NO_OWNER, or the receiver's WRITING) and count its rows as written;
    returns its env steps. PayloadError, before anything is written, when
    the slot is not a free one, or a field is missing, extra, not a plain numpy array, of another dtype
    or shape, or holds a value training cannot take: a policy version below 0 or above
    `latest_version` (where given), a policy id outside the run's policies, a float that is not finite."""
    if not isinstance(payload, dict):
        raise PayloadError(f"a slot payload is a dict of arrays, not {type(payload).__name__}")
    if not 0 <= slot < buffers.slot_owner.shape[0] or buffers.slot_owner[slot] != owner:
        raise PayloadError(
            f"slot {slot} is not a free slot of this run (0..{buffers.slot_owner.shape[0] - 1}, owned by no worker)"
        )
    fields = slot_fields(buffers.layout)
    unknown = sorted(set(payload) - set(fields) - {ROWS_KEY}, key=str)
    if unknown:
        raise PayloadError(
            f"slot payload field {unknown[0]!r} has no place here: the sender runs another "
            f"configuration (same env and flags needed)"
        )
    rollout = buffers.log_probs.shape[1]
    for name in fields + (ROWS_KEY,):
        value = payload.get(name)
        local = buffers.slot_rows if name == ROWS_KEY else _array(buffers, name)
        want = (local.dtype, local.shape[1:])
        if type(value) is not np.ndarray:
            raise PayloadError(
                f"slot payload field {name!r} is {'missing' if value is None else type(value).__name__}"
                f": a plain numpy array is needed"
            )
        if (value.dtype, value.shape) != want:
            raise PayloadError(
                f"slot payload field {name!r} is {value.dtype}{list(value.shape)} where this run "
                f"holds {want[0]}{list(want[1])}: the sender runs another configuration"
            )
    rows = int(payload[ROWS_KEY])
    if not 0 <= rows <= rollout:
        raise PayloadError(f"slot payload says {rows} rows were written; a slot holds 0..{rollout}")
    _check_values(buffers, payload, latest_version)
    for name in fields:
        _array(buffers, name)[slot] = payload[name]
    buffers.slot_rows[slot] = rows
    return rows * buffers.log_probs.shape[2]


def _check_values(buffers, payload: dict, latest_version) -> None:
    versions = payload["policy_version"]
    if versions.size and (versions.min() < 0 or (latest_version is not None and versions.max() > latest_version)):
        raise PayloadError(
            f"slot payload holds policy versions {versions.min()}..{versions.max()}; this learner "
            f"has published 0..{latest_version}: the sender acts with another learner's weights"
        )
    if "policy_id" in payload and payload["policy_id"].size:
        ids, policies = payload["policy_id"], buffers.param_seq.shape[0]
        if ids.min() < 0 or ids.max() >= policies:
            raise PayloadError(
                f"slot payload holds policy ids {ids.min()}..{ids.max()}; this run has 0..{policies - 1}"
            )
    for name in _FINITE:
        if name in payload and not np.isfinite(payload[name]).all():
            raise PayloadError(f"slot payload field {name!r} holds a value that is not finite")
