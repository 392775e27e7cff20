"""Serial mode: every role of a run in this one process, built from the same plan and classes as in
the other modes and stepped in turn (debugging, deterministic tests)."""

from __future__ import annotations

import os

from sf_engine.runtime.role import InProcessRoles, set_torch_threads
from sf_engine.runtime.wiring import roles_of


class SerialRoles(InProcessRoles):
    """The roles of `plan` (sf_engine.runtime.wiring.roles_of) in start order, over `buffers` and `queues`
    (serial queues: wiring.make_queues without a multiprocessing context)."""

    def __init__(self, plan, buffers, queues):
        import torch  # here, not at the top: building a plan in this process needs no torch

        set_torch_threads("learner", plan.cfg)  # the learner's threads: the one that needs them
        self.deterministic_before = torch.are_deterministic_algorithms_enabled()  # given back at the end
        if plan.cfg.run.deterministic:  # --deterministic: the same bits from the same inputs (cuBLAS needs its
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # fixed workspace for that, set before use)
            torch.use_deterministic_algorithms(True)
        super().__init__(plan, buffers, queues, roles_of(plan.cfg))

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        """The clean stop of every role (the learner's last checkpoint, the workers' last stats)."""
        try:
            self.finish()
        finally:
            self.close()
            import torch

            torch.use_deterministic_algorithms(self.deterministic_before)
