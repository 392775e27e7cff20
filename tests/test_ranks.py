"""Data-parallel learner ranks (sf_engine.runtime.ranks) over gloo, two processes on this host: the averaged
gradient is the mean of the ranks' gradients on their halves of a batch, the ranks' weights stay bit-identical step
after step (and close to one learner's on the whole batch), their agreement on each round and the gather of their
figures are the same on every rank, and a collective a rank never joins ends in one line within the timeout instead
of a hang."""

import functools
import multiprocessing
import time
import traceback

import pytest
import torch
from torch import nn

from sf_engine.model.flat_state import FlatAdam, flatten_state
from sf_engine.runtime.ranks import CollectiveError, RankGroup, checksum

STEPS = 5
BATCH = 64


def _network(device: str = "cpu"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)).to(device)
    return model, flatten_state(model)


def _batch(step: int):
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 4, generator=generator)
    return x, torch.randn(BATCH, 2, generator=generator) + x[:, :2]


def _gradient_and_step(model, optimizer, x, y) -> torch.Tensor:
    """One update on (x, y); returns the gradient it stepped with (after the ranks' mean, before clipping)."""
    optimizer.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optimizer.clip_grad_norm(10.0)
    gradient = optimizer.grad.clone()  # clipping at 10 leaves these gradients as they are
    optimizer.step()
    return gradient


def _joined(rank: int, init: str, device: str = "cpu") -> tuple:
    """(group, model, flat weights, optimizer averaging over the group) of rank `rank` of two, on `device` (both
    ranks on the one GPU meet over gloo)."""
    group = RankGroup(rank, 2, init, torch.device(device), timeout_sec=60, backend="gloo")
    model, flat = _network(device)
    optimizer = FlatAdam(model, flat, lr=1e-2, eps=1e-8)
    optimizer.average = group.average_
    return group, model, flat, optimizer


def _train_rank(device: str, rank: int, init: str, results) -> None:
    try:
        group, model, flat, optimizer = _joined(rank, init, device)
        sums, gradients = [], []
        for step in range(STEPS):
            x, y = (tensor.to(device) for tensor in _batch(step))
            half = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
            gradients.append(_gradient_and_step(model, optimizer, x[half], y[half]).cpu())
            sums.append(checksum(flat))
            assert group.same_everywhere(sums[-1])
        results.put((rank, sums, gradients, flat.cpu().clone()))
        group.close()
    except BaseException:
        results.put((rank, traceback.format_exc(), None, None))


def _run_ranks(target, tmp_path, reporting: int = 2) -> dict:
    """rank -> what it reported, of two ranks running `target`, the first `reporting` reports; then every rank that
    has not ended is killed (at once where a rank reports nothing)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    processes = [context.Process(target=target, args=(rank, init, results)) for rank in range(2)]
    for process in processes:
        process.start()
    out = {}
    try:
        for _ in range(reporting):
            rank, *rest = results.get(timeout=120)
            out[rank] = rest
    finally:
        for process in processes:
            process.join(timeout=30 if reporting == len(processes) else 0)
            if process.is_alive():
                process.kill()
                process.join()
    return out


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))],
)
def test_two_ranks_step_with_the_mean_gradient_and_hold_the_same_weights_bit_for_bit(tmp_path, device):
    """On the CPU, and both ranks on the one GPU (gloo, through the host's memory)."""
    out = _run_ranks(functools.partial(_train_rank, device), tmp_path)
    for rank in (0, 1):
        assert not isinstance(out[rank][0], str), out[rank][0]
    assert out[0][0] == out[1][0]  # the checksums of the two ranks' weights, step after step
    assert torch.equal(out[0][2], out[1][2])
    # one learner, the same halves: its gradients' mean is the gradient the ranks stepped with
    model, flat = _network()
    optimizer = FlatAdam(model, flat, lr=1e-2, eps=1e-8)
    x, y = _batch(0)
    halves = []
    for half in (slice(0, BATCH // 2), slice(BATCH // 2, BATCH)):
        optimizer.zero_grad()
        ((model(x[half]) - y[half]) ** 2).mean().backward()
        halves.append(optimizer.grad.clone())
    torch.testing.assert_close(out[0][1][0], (halves[0] + halves[1]) / 2)
    # ... and trained on the whole batches it ends where the ranks do (the same steps, sums in another order)
    model, flat = _network()
    optimizer = FlatAdam(model, flat, lr=1e-2, eps=1e-8)
    for step in range(STEPS):
        _gradient_and_step(model, optimizer, *_batch(step))
    torch.testing.assert_close(out[0][2], flat, rtol=1e-4, atol=1e-5)
    assert checksum(flat) != out[0][0][0]  # the checksum sees the weights move


def _agree_and_gather(rank: int, init: str, results) -> None:
    try:
        group = RankGroup(rank, 2, init, torch.device("cpu"), timeout_sec=60)
        agreed = [
            group.agree(batches=1, stopping=False, env_steps=1000 + rank, elapsed_sec=1.5),
            group.agree(batches=int(rank == 0), stopping=False, env_steps=7, elapsed_sec=0.25 * rank),
            group.agree(batches=1, stopping=rank == 1, env_steps=0, elapsed_sec=0.0),
            group.agree(batches=5 - 2 * rank, stopping=False, env_steps=0, elapsed_sec=0.0),
        ]
        rows = group.gather(torch.tensor([float(rank), 10.0 + rank, -1.0], dtype=torch.float64))
        results.put((rank, agreed, rows))
        group.close()
    except BaseException:
        results.put((rank, traceback.format_exc(), None))


def test_the_ranks_agree_on_each_round_and_gather_their_figures_in_rank_order(tmp_path):
    """Every rank gets the same agreement: a round only when all hold their share (of as many batches as the rank
    with the fewest has), the stop when any saw it, the furthest env steps and seconds; the gather gives every
    rank's row, in rank order, on every rank."""
    out = _run_ranks(_agree_and_gather, tmp_path)
    for rank in (0, 1):
        assert not isinstance(out[rank][0], str), out[rank][0]
    assert out[0][0] == out[1][0]
    first, not_all_ready, one_stops, fewest = out[0][0]
    assert (first.all_ready, first.stop, first.env_steps, first.elapsed_sec) == (True, False, 1001, 1.5)
    assert (not_all_ready.all_ready, not_all_ready.stop, not_all_ready.elapsed_sec) == (False, False, 0.25)
    assert one_stops.stop and one_stops.all_ready
    assert fewest.batches == 3
    expected = torch.tensor([[0.0, 10.0, -1.0], [1.0, 11.0, -1.0]], dtype=torch.float64)
    assert torch.equal(out[0][1], expected) and torch.equal(out[1][1], expected)


def _one_loss_not_finite(rank: int, init: str, results) -> None:
    try:
        group, model, flat, optimizer = _joined(rank, init)
        x, y = _batch(0)
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()  # a finite gradient on both ranks; rank 1's loss statistic says it is not finite
        norm = optimizer.clip_grad_norm(10.0, loss.detach() * (float("nan") if rank == 1 else 1.0))
        results.put((rank, bool(torch.isfinite(norm)), bool(torch.isfinite(optimizer.grad).all())))
        group.close()
    except BaseException:
        results.put((rank, traceback.format_exc(), None))


def test_one_ranks_non_finite_loss_makes_every_rank_skip_the_step(tmp_path):
    """clip_grad_norm given the loss: where one rank's is not finite its gradient goes into the mean as NaN, so the
    norm every rank reads is not finite and every rank skips the step (one skipping alone would part the weights)."""
    out = _run_ranks(_one_loss_not_finite, tmp_path)
    assert out[0] == [False, False] and out[1] == [False, False], out


def _one_rank_never_comes(rank: int, init: str, results) -> None:
    try:
        group = RankGroup(rank, 2, init, torch.device("cpu"), timeout_sec=3)
        if rank == 1:
            time.sleep(30)  # joined, then hangs: never takes part in the all-reduce
            return
        started = time.monotonic()
        try:
            group.average_(torch.ones(10))
            results.put((rank, "the all-reduce completed", None))
        except CollectiveError as exc:
            results.put((rank, str(exc), time.monotonic() - started))
    except BaseException:
        results.put((rank, traceback.format_exc(), None))


def test_a_collective_a_rank_never_joins_ends_in_one_line_within_the_timeout(tmp_path):
    out = _run_ranks(_one_rank_never_comes, tmp_path, reporting=1)
    assert list(out) == [0], out
    message, waited = out[0]
    assert waited is not None, message
    assert message.startswith("learner rank 0 of 2: a gradient all-reduce did not complete within 3 s")
    assert "\n" not in message
    assert waited < 30


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="rank 2 is not one of the 2 ranks"):
        RankGroup(2, 2, "file:///nonexistent", torch.device("cpu"), timeout_sec=1)
