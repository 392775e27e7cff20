"""Learners on several machines (--dist_init): node groups, each a train.py with its own samplers and learner ranks,
whose ranks train one policy together. Shown here on one machine over the loopback: the node groups learn, hold the
same weights, stop together on the env-step budget of all of them or on one's stop, and start again together when
a learner of one dies; torchrun's environment and bad addresses are read or refused in one line."""

import multiprocessing
import os
import re
import signal
import socket

import pytest
import torch
from conftest import one_line_error, read_json, run_train
from test_reliability import (  # noqa: F401  (no_leftover_runs: the autouse fixture that kills what a test left)
    books_balance,
    no_leftover_runs,
    start_train,
    wait_for,
    wait_for_children,
)

from sf_engine.config.parallel import ParallelConfig, node_groups, node_seed, under_torchrun
from sf_engine.runtime.checkpoint import latest_checkpoint, load_checkpoint

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_node_groups_are_read_from_the_flags_or_from_torchrun():
    """tcp://HOST:PORT with --dist_rank and --dist_world; under torchrun (--nproc_per_node 1) its environment, node
    group 0 serving the rendezvous unless torchrun's agent does; one machine without either."""
    assert node_groups(ParallelConfig(), {}) is None
    groups = node_groups(ParallelConfig(dist_init="tcp://node0:1234", dist_rank=1, dist_world=3), {})
    assert (groups.host, groups.port, groups.node, groups.nodes, groups.serves) == ("node0", 1234, 1, 3, False)
    parallel = under_torchrun(ParallelConfig(), TORCHRUN)
    assert (parallel.dist_init, parallel.dist_rank, parallel.dist_world) == ("env://", 1, 2)
    groups = node_groups(parallel, TORCHRUN)
    assert (groups.host, groups.port, groups.node, groups.serves) == ("10.0.0.1", 29400, 1, False)
    first = TORCHRUN | {"RANK": "0"}
    assert node_groups(parallel, first).serves
    assert not node_groups(parallel, first | {"TORCHELASTIC_USE_AGENT_STORE": "True"}).serves  # the agent serves it
    assert under_torchrun(ParallelConfig(dist_init="tcp://a:1", dist_world=1), TORCHRUN).dist_rank == 0  # flags win
    # envs and replay sampling: node group 0's seed is --seed (one machine's runs as before), the others' their own
    seeds = [node_seed(ParallelConfig(dist_init="tcp://a:1", dist_rank=g, dist_world=3), 7) for g in range(3)]
    assert seeds[0] == 7 and len(set(seeds)) == 3


@pytest.mark.parametrize(
    "flags, environ, expected",
    [
        (["--dist_world", "2"], {}, "--dist_world 2: the node groups meet at --dist_init"),
        (["--dist_init", "node0:1234"], {}, "--dist_init must be tcp://HOST:PORT or env://"),
        (["--dist_init", "tcp://a:1", "--dist_rank", "2", "--dist_world", "2"], {}, "--dist_rank must be one of"),
        (["--dist_init", "env://"], {}, "--dist_init env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE not set"),
        ([], TORCHRUN | {"LOCAL_WORLD_SIZE": "4"}, "torchrun --nproc_per_node 4: each node's one train.py"),
        (["--dist_init", "tcp://a:1", "--dist_world", "2", "--mode", "serial"], {}, "--dist_world 2: --mode serial"),
        (["--dist_init", "tcp://a:1", "--dist_world", "2", "--pbt", "true"], {}, "--dist_world 2: --pbt"),
    ],
)
def test_bad_node_group_flags_are_one_line_before_anything_starts(tmp_path, flags, environ, expected):
    result = run_train(
        ["--env", "CartPole-v1", "--experiment", "x"] + flags,
        tmp_path,
        timeout=120,
        env={**os.environ, **environ},
    )
    assert expected in one_line_error(result)
    assert not os.path.exists(tmp_path / "x"), "a refused run wrote its experiment"


def _rank_of_a_rendezvous(groups, rank: int, faults: int, results) -> None:
    """A learner rank that joins `faults` + 1 times, leaving each generation but the last as after a fault, and
    all-reduces its rank + 1 in each group it makes."""
    import torch.distributed as dist

    from sf_engine.runtime.ranks import RankGroup
    from sf_engine.runtime.rendezvous import Rendezvous

    seen = []
    for attempt in range(faults + 1):
        rendezvous = Rendezvous(groups, rank, 2, 20.0, lambda: None, "2 ranks")
        generation, store = rendezvous.join(lambda: False)
        group = RankGroup(rank, 2, store, torch.device("cpu"), 20.0, nodes=2)
        value = torch.tensor([rank + 1.0])
        dist.all_reduce(value)
        agreed = group.agree(1, False, 100 * (rank + 1), 0.0)
        seen.append((generation, float(value), agreed.env_steps))
        if attempt < faults:
            rendezvous.leave(generation)
        group.close()
    results.put((rank, seen))


def test_ranks_of_node_groups_meet_again_in_a_new_generation_after_a_fault():
    """Two ranks of two node groups meet in the store's generation 0, then, each leaving it as after a fault (only
    the first moves it on), in generation 1: a group of their own each time, their env steps summed over the node
    groups."""
    from sf_engine.config.parallel import NodeGroups
    from sf_engine.runtime.rendezvous import serve

    port = free_port()
    groups = NodeGroups("127.0.0.1", port, 0, 2, serves=True)
    store = serve(groups, 20.0)
    assert isinstance(store, torch.distributed.TCPStore)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_rank_of_a_rendezvous, args=(groups, r, 1, results)) for r in range(2)]
    for process in ranks:
        process.start()
    seen = dict(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(timeout=30)
    assert seen[0] == seen[1] == [(0, 3.0, 300), (1, 3.0, 300)], seen
    del store


def test_node_groups_whose_ranks_do_not_fit_together_stop_in_one_line():
    """A rank whose shape (ranks, batch sizes) differs from the one another node group's ranks wrote in the
    generation stops the run (RunStopped, no restart) with both shapes, before waiting for anyone."""
    from sf_engine.config.parallel import NodeGroups
    from sf_engine.runtime.rendezvous import Rendezvous, serve
    from sf_engine.runtime.role import RunStopped

    groups = NodeGroups("127.0.0.1", free_port(), 0, 2, serves=True)
    store = serve(groups, 5.0)
    rendezvous = Rendezvous(groups, 0, 2, 5.0, lambda: None, "2 ranks, minibatches of 256")
    rendezvous.store.compare_set("0/shape", "", "2 ranks, minibatches of 128")  # another node group's, first
    with pytest.raises(RunStopped, match=r"this node group: 2 ranks, minibatches of 256; another: 2 ranks, "):
        rendezvous.join(lambda: False)
    other = Rendezvous(groups, 1, 2, 5.0, lambda: None, "2 ranks, minibatches of 128")  # the node group that waits
    with pytest.raises(RunStopped, match=r"do not fit together \(this node group: 2 ranks, minibatches of 256"):
        other.join(lambda: False)  # the first line, from the store, at once
    del store


def test_a_rank_whose_predecessor_arrived_moves_the_rendezvous_on_and_a_stop_ends_a_join():
    """A rank claimed in a generation by a process before this one (which died there) makes the store move on to
    the next, where this one waits; a stop of the node groups (or of this node group's run) ends the wait at once."""
    from sf_engine.config.parallel import NodeGroups
    from sf_engine.runtime.rendezvous import NodeGroupsStopped, Rendezvous, serve

    groups = NodeGroups("127.0.0.1", free_port(), 0, 2, serves=True)
    store = serve(groups, 5.0)
    rendezvous = Rendezvous(groups, 0, 2, 5.0, lambda: None, "shape")
    rendezvous.store.compare_set("0/rank/0", "", "a dead predecessor")
    asked = []
    with pytest.raises(NodeGroupsStopped):
        rendezvous.join(lambda: asked.append(rendezvous.generation()) or len(asked) > 3)
    assert asked[0] == 1 and rendezvous.generation() == 1  # it waited in generation 1
    rendezvous.stop()
    with pytest.raises(NodeGroupsStopped):
        Rendezvous(groups, 1, 2, 5.0, lambda: None, "shape").join(lambda: False)
    del store


def test_a_port_node_group_0_cannot_serve_is_one_line_before_anything_is_written(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_train(
            [
                "--env",
                "CartPole-v1",
                "--experiment",
                "x",
                "--dist_init",
                f"tcp://127.0.0.1:{port}",
                "--dist_world",
                "2",
            ],
            tmp_path,
            timeout=120,
        )
    assert f"--dist_init: the rendezvous cannot be served at 127.0.0.1:{port}" in one_line_error(result)
    assert not os.path.exists(tmp_path / "x"), "a refused run wrote its experiment"


NODE = ["--env", "CartPole-v1", "--seed", "1", "--num_workers", "1", "--status_every_sec", "1"]


def _node_group_args(port: int, node: int, shm_dir: str, *flags) -> list:
    return (
        NODE
        + ["--dist_init", f"tcp://127.0.0.1:{port}", "--dist_rank", str(node), "--dist_world", "2"]
        + [
            "--shm_dir",
            shm_dir,
            *flags,
        ]
    )


def _last_weights(exp: str) -> tuple:
    state = load_checkpoint(latest_checkpoint(os.path.join(exp, "checkpoints")))
    return int(state["version"]), torch.cat([t.flatten().float() for t in state["model"].values()])


@pytest.mark.e2e
def test_two_node_groups_learn_cartpole_with_the_same_weights_and_stop_on_their_joint_budget(tmp_path, shm_dir):
    """Two node groups over the loopback, each two learner ranks (ranks 0-1 and 2-3 of 4): their env steps together
    reach the budget and both stop on it, each node group's books balance on its own (its rank 0 reports its own
    ranks' figures), their last checkpoints hold the same weights at the same version, both learned (their envs
    differ: another seed per node group), and the log says the ranks' places."""
    port, budget = free_port(), 600_000
    flags = ["--num_learners", "2", "--train_for_env_steps", str(budget)]
    procs = [start_train(_node_group_args(port, node, shm_dir, *flags), tmp_path, f"n{node}") for node in range(2)]
    outs = [proc.communicate(timeout=400)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    summaries = [read_json(tmp_path / f"n{node}" / "summary.json") for node in range(2)]
    assert summaries[0]["env_steps"] + summaries[1]["env_steps"] >= budget
    assert all(s["env_steps"] > budget / 4 for s in summaries), [s["env_steps"] for s in summaries]
    for summary in summaries:
        books_balance(summary)
        assert summary["episode_return_mean"] > 150, summary["episode_return_mean"]
    assert all("env-step budget of the node groups reached" in out for out in outs), outs[1][-2000:]
    (version, weights), (other_version, other_weights) = (_last_weights(str(tmp_path / f"n{n}")) for n in range(2))
    assert version == other_version > 0 and torch.equal(weights, other_weights)
    log = (tmp_path / "n1" / "train.log").read_text()
    assert "(rank 2 of 4 of 2 node groups)" in log and "(rank 3 of 4 of 2 node groups)" in log, log[-3000:]
    assert "every rank goes on from learner rank 0's training state, at version(s) [0]" in log
    assert os.listdir(shm_dir) == [], "a node group's shared memory was left behind"


@pytest.mark.e2e
def test_a_killed_learner_of_one_node_group_restarts_both_and_a_stop_of_one_stops_both(tmp_path, shm_dir):
    """SIGKILL of node group 1's learner: node group 0's collective times out (no hang), both restart their learner
    ranks, which meet in a new generation from node group 0's training state; then node group 1's time budget
    stops it, and node group 0, whose budgets are far, stops with it."""
    port = free_port()
    common = ["--collective_timeout_sec", "10", "--train_for_env_steps", "100000000"]
    first = start_train(_node_group_args(port, 0, shm_dir, *common, "--train_for_seconds", "400"), tmp_path, "n0")
    second = start_train(_node_group_args(port, 1, shm_dir, *common, "--train_for_seconds", "60"), tmp_path, "n1")
    exp = str(tmp_path / "n1")
    rows = wait_for_children(exp, 3)
    wait_for(exp, "learner_version", 20, timeout=120)
    os.kill(next(r["pid"] for r in rows if r["role"] == "learner"), signal.SIGKILL)
    outs = [proc.communicate(timeout=300)[0] for proc in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    summaries = [read_json(tmp_path / f"n{node}" / "summary.json") for node in range(2)]
    assert [s["learner_restarts"] for s in summaries] == [1, 1], outs[0][-3000:]
    assert "another node group stopped" in outs[0] and "time budget reached" in outs[1]
    for summary in summaries:
        books_balance(summary)
    log = (tmp_path / "n0" / "train.log").read_text()
    assert re.search(r"did not complete within 10 s", log), log[-3000:]
    (version, weights), (other_version, other_weights) = (_last_weights(str(tmp_path / f"n{n}")) for n in range(2))
    assert version == other_version and torch.equal(weights, other_weights)
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_two_node_groups_started_by_torchrun_train_together(tmp_path, shm_dir):
    """torchrun's launcher and rendezvous (--nnodes 2 --nproc_per_node 1, c10d over the loopback) start one train.py
    per node group, which reads its place from torchrun's environment: both stop on their joint budget with the
    same weights."""
    import subprocess
    import sys

    port, budget = free_port(), 200_000
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
    command += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "test"]
    procs = [
        subprocess.Popen(
            command
            + [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")]
            + NODE
            + ["--train_dir", str(tmp_path / f"d{node}"), "--shm_dir", shm_dir, "--train_for_env_steps", str(budget)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for node in range(2)
    ]
    try:
        outs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert [proc.returncode for proc in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    exps = [str(tmp_path / f"d{node}" / "default") for node in range(2)]
    assert sum(read_json(os.path.join(exp, "summary.json"))["env_steps"] for exp in exps) >= budget
    logs = "".join(open(os.path.join(exp, "train.log")).read() for exp in exps)
    assert "(rank 0 of 2 of 2 node groups)" in logs and "(rank 1 of 2 of 2 node groups)" in logs
    (version, weights), (other_version, other_weights) = (_last_weights(exp) for exp in exps)
    assert version == other_version > 0 and torch.equal(weights, other_weights)
    assert os.listdir(shm_dir) == []
