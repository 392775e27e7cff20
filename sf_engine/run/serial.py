"""Serial mode: every role of a run in this one process, built from the same plan and classes as in
the other modes and stepped in turn (debugging, deterministic tests)."""

from __future__ import annotations

from sf_engine.runtime.role import RoleContext, set_torch_threads
from sf_engine.runtime.wiring import ROLES, role_class, roles_of


class SerialRoles:
    """The roles of `plan` (sf_engine.runtime.wiring.roles_of) in start order, over `buffers` and `queues`
    (serial queues: wiring.make_queues without a multiprocessing context)."""

    def __init__(self, plan, buffers, queues):
        set_torch_threads("learner", plan.cfg)  # the learner's threads: the one that needs them
        self.roles = {}
        for role, index in roles_of(plan.cfg):
            self.roles[(role, index)] = role_class(role)(RoleContext(plan, role, index, buffers, queues))

    def __getitem__(self, key):
        return self.roles[key if isinstance(key, tuple) else (key, 0)]

    def start(self) -> None:
        pass

    def step(self) -> None:
        """One unit of work of every role, none of them waiting."""
        for key in sorted(self.roles, key=lambda key: (ROLES[key[0]].serial_order, key[1])):
            self.roles[key].step(0)

    def shutdown(self) -> None:
        """The clean stop of every role (the learner's last checkpoint, the workers' last stats)."""
        try:
            for instance in self.roles.values():
                instance.finish()
        finally:
            for instance in self.roles.values():
                instance.close()
