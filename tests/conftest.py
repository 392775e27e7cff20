import glob
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: runs train.py / enjoy.py or a whole run (the slow half)")
    config.addinivalue_line(
        "markers",
        "unit: everything else: functions, classes and roles stepped by hand (`pytest -m unit`, the fast half)",
    )


def pytest_collection_modifyitems(items):
    """A test not marked e2e is a unit test."""
    for item in items:
        if item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.unit)


def run_train(args, train_dir, timeout=180, **kwargs):
    """Run train.py as a user would; returns the CompletedProcess."""
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", str(train_dir)] + list(args)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)


def one_line_error(result) -> str:
    """The promised failure of a script: exit code 2 and exactly one 'error: ...' line on stderr."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def main_error(main, argv, capsys) -> str:
    """The promised failure of a script's main(argv) for bad input, run in this process: exit code 2
    and one 'error: ...' line on stderr, which is returned."""
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def train_error(args, train_dir, capsys) -> str:
    """train.py's promised failure (sf_engine.run.runner.main, as train.py calls it), with `train_dir`."""
    from sf_engine.run.runner import main

    # a budget of one step first, so that input wrongly accepted ends the run at once (the args win)
    return main_error(main, ["--train_dir", str(train_dir), "--train_for_env_steps", "1"] + list(args), capsys)


def files_of(path) -> dict:
    """Every file under `path` with its bytes: a bad command must leave the same."""
    return {
        p: open(p, "rb").read() for p in glob.glob(os.path.join(str(path), "**"), recursive=True) if os.path.isfile(p)
    }


def assert_refused_untouched(args, train_dir, capsys, words) -> None:
    """train.py with `args` fails in one line holding every one of `words`, and leaves `train_dir` (given a file
    to keep) as it was."""
    (train_dir / "keep").write_text("x")
    before = files_of(train_dir)
    error = train_error(args, train_dir, capsys)
    assert all(word in error for word in words), error
    assert files_of(train_dir) == before


def enjoy_episodes(capsys, *args) -> list:
    """enjoy.py in this process on two episodes: the printed (return, length) of each."""
    import re

    from sf_engine.play import enjoy

    assert enjoy.main(["--num_episodes", "2"] + list(args)) == 0
    out = capsys.readouterr().out
    episodes = re.findall(r"^episode \d+: return (-?[0-9.]+), length (\d+)$", out, re.M)
    assert len(episodes) == 2, out
    return episodes


def read_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def shm_dir(tmp_path):
    """A private directory (on the same tmpfs as /dev/shm) for a run's shared segment, so a test can see
    that nothing is left behind."""
    path = os.path.join("/dev/shm", f"sf_engine_test_{os.getpid()}_{tmp_path.name}")
    os.makedirs(path)
    yield path
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


TINY = [
    "--mode",
    "serial",
    "--num_workers",
    "1",
    "--num_envs_per_worker",
    "4",
    "--rollout",
    "16",
    "--batch_size",
    "32",
    "--num_batches_per_epoch",
    "2",
    "--num_epochs",
    "1",
]


def serial_plan(tmp_path, shm_dir, env, *flags):
    """The plan of a tiny serial run of `env` (flags after TINY win)."""
    from sf_engine.run.plan import build_plan

    argv = ["--env", env, "--train_dir", str(tmp_path), "--shm_dir", shm_dir, "--experiment", "family"]
    return build_plan(argv + TINY + list(flags))


class SerialRun:
    """The roles of a plan, built as serial mode builds them and stepped by hand."""

    def __init__(self, plan, tmp_path):
        from sf_engine.run.serial import SerialRoles
        from sf_engine.runtime.shared_buffers import SharedBuffers
        from sf_engine.runtime.wiring import make_queues

        self.plan, self.cfg = plan, plan.cfg
        self.buffers = SharedBuffers.create(str(tmp_path / "segment"), plan.layout)
        self.queues = make_queues(plan.cfg.sampler.num_workers, num_policies=plan.cfg.policies.num_acting)
        self.queues.free_slots.put_many(list(range(plan.cfg.num_slots)))
        self.roles = SerialRoles(plan, self.buffers, self.queues)
        self.learner, self.policy = self.roles["learner"], self.roles["policy_worker"]
        self.workers = [self.roles[("rollout_worker", w)] for w in range(plan.cfg.sampler.num_workers)]
        self.worker = self.workers[0]

    def full_slots(self, count: int) -> list:
        from sf_engine.runtime.ipc import get_many

        slots = []
        for _ in range(1000):
            for worker in self.workers:
                worker.step(0)
            self.policy.step(0)
            slots += get_many(self.queues.full_slots, 0)
            if len(slots) >= count:
                return slots
        raise AssertionError("the workers did not fill slots")

    def messages(self, kind) -> list:
        """The stats messages of type `kind` waiting in the stats queue (the others are dropped)."""
        from sf_engine.runtime.ipc import drain

        return [m for m in drain(self.queues.stats) if isinstance(m, kind)]

    def close(self):
        for worker in self.workers:
            worker.close()
        self.buffers.release()


def receive(head, payloads) -> list:
    """Each payload written into a free slot of the head's run (as a receiver does): the slots."""
    from sf_engine.runtime.ipc import get_many
    from sf_engine.scaleout.slot_transport import unpack_slot

    slots = []
    while len(slots) < len(payloads):
        slots += get_many(head.queues.free_slots, 0, max_messages=len(payloads) - len(slots))
    for slot, payload in zip(slots, payloads):
        unpack_slot(head.buffers, slot, payload)
    return slots


def compiled_kernels_expected() -> bool:
    """Whether setup.py builds the compiled kernels here (x86-64 with glibc >= 2.35: glibc's vector tanh)."""
    import platform

    libc, version = platform.libc_ver()
    glibc = tuple(int(v) for v in version.split(".")[:2] if v.isdigit()) if libc == "glibc" else ()
    return platform.machine() == "x86_64" and glibc >= (2, 35)
