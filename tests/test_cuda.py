"""The GPU paths: --compile's bucketed forward (CUDA graphs on a GPU, torch.compile on the CPU), observations
through pinned memory, the weights through CUDA IPC, the recurrent cores on CUDA. The CPU half runs
everywhere; the CUDA half runs where there is a GPU (CI has none: perf/gpu_session.sh runs it there)."""

import multiprocessing

import numpy as np
import pytest
import torch
from test_learner_restart import LAYOUT
from test_recurrent import _stepped_reference

from sf_engine.config.groups import ModelConfig
from sf_engine.config.value import QConfig
from sf_engine.envs import ActionSpec, EnvSpec
from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model.actor_critic import ActorCritic
from sf_engine.model.flat_state import flatten_state
from sf_engine.model.graphed import BucketedForward, bucket_sizes
from sf_engine.model.q_network import QNetwork
from sf_engine.model.shape import resolve_model_config
from sf_engine.runtime.shared_buffers import SharedBuffers
from sf_engine.runtime.transfer import PinnedRows, to_device
from sf_engine.runtime.weights import SharedWeights

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
VECTOR = EnvSpec((("obs", (4,), "float32"),), ActionSpec("discrete", nvec=(2,)))
IMAGES = EnvSpec((("obs", (84, 84, 4), "uint8"),), ActionSpec("discrete", nvec=(6,)), family="atari")
MASKED = EnvSpec((("obs", (4,), "float32"), (ACTION_MASK_KEY, (5,), "float32")), ActionSpec("discrete", nvec=(5,)))
MODELS = {  # name -> (spec, model flags, bf16, a Q-network)
    "mlp": (VECTOR, dict(actor_critic="separate"), False, False),  # CartPole's
    "cnn": (IMAGES, dict(encoder="convnet_simple"), False, False),  # an Atari CNN
    "cnn_gru": (IMAGES, dict(encoder="convnet_simple", rnn="gru", rnn_size=64), False, False),
    "cnn_gru_bf16": (IMAGES, dict(encoder="convnet_simple", rnn="gru", rnn_size=64), True, False),  # bf16 copies
    "masked": (MASKED, dict(), False, False),  # action masks
    "q_lstm_masked": (MASKED, dict(rnn="lstm", rnn_size=32), False, True),  # R2D2's kind of Q-network
}


def _model(kind: str, device):
    spec, flags, bf16, q = MODELS[kind]
    torch.manual_seed(0)
    mcfg = resolve_model_config(ModelConfig(**flags), spec)
    model = (QNetwork(spec, mcfg, QConfig()) if q else ActorCritic(spec, mcfg, bf16)).to(device)
    model.requires_grad_(False)
    model.refresh_bf16_acting()  # as the policy worker does before capturing
    return model


def _obs(kind: str, rows: int, device) -> dict:
    obs, generator = {}, torch.Generator().manual_seed(rows)
    for key, shape, dtype in MODELS[kind][0].obs:
        if dtype == "uint8":
            obs[key] = torch.randint(0, 256, (rows, *shape), dtype=torch.uint8, generator=generator)
        elif key == ACTION_MASK_KEY:  # a random set of legal actions per row
            obs[key] = (torch.rand((rows, *shape), generator=generator) < 0.5).float()
        else:
            obs[key] = torch.randn((rows, *shape), generator=generator)
    return {key: value.to(device) for key, value in obs.items()}


def test_bucket_sizes_double_up_to_every_request():
    assert bucket_sizes(256, 28) == [256, 512, 1024, 2048, 4096, 28 * 256]
    assert bucket_sizes(8, 1) == [8] and bucket_sizes(8, 2) == [8, 16]


def _check_bucketed(kind: str, device: str, sizes: list):
    """The bucketed forward gives the eager forward's outputs at every batch size, padded or not (past the
    largest bucket: uncompiled), and follows weights changed in place (the policy worker's reload)."""
    model = _model(kind, device)
    params = flatten_state(model)
    tolerance = dict(rtol=3e-2, atol=3e-2) if MODELS[kind][2] else dict(rtol=1e-4, atol=1e-4)  # bf16: cuDNN's choice
    example = {key: value[:1] for key, value in _obs(kind, 1, device).items()}
    forward = BucketedForward(model.outputs, example, model.state_size, sizes, device)
    with torch.inference_mode():
        forward.warm_up()
        for rows in sorted({1, sizes[0] - 1, sizes[0], sizes[-1] - 1, sizes[-1]} - {0}):
            obs = _obs(kind, rows, device)
            state = torch.randn(rows, model.state_size, device=device) if model.recurrent else None
            for got, want in zip(forward(obs, state), model.outputs(obs, state)):
                if want is not None:
                    torch.testing.assert_close(got, want, **tolerance)
        before = forward(obs, state)[0].clone()
        params.add_(torch.randn_like(params) * 0.05)  # in place, as SharedWeights.read_into does
        model.refresh_bf16_acting()  # as the policy worker does after each reload
        after = forward(obs, state)[0]
        torch.testing.assert_close(after, model.outputs(obs, state)[0], **tolerance)
        assert (after - before).abs().max() > 1e-3
        rows = sizes[-1] + 3  # more rows than any bucket (stale requests of a restarted worker): uncompiled
        obs = _obs(kind, rows, device)
        state = torch.randn(rows, model.state_size, device=device) if model.recurrent else None
        torch.testing.assert_close(forward(obs, state)[0], model.outputs(obs, state)[0], **tolerance)
    with pytest.raises(ValueError, match="past the largest bucket"):
        forward.bucket(sizes[-1] + 1)


@pytest.mark.parametrize("kind", ["mlp", "q_lstm_masked"])
def test_the_compiled_forward_matches_the_eager_one_on_the_cpu(kind):
    _check_bucketed(kind, "cpu", [4, 8])


def test_the_pinned_gather_takes_the_rows_asked_for_in_order():
    device = torch.device("cuda" if CUDA else "cpu")
    array = np.arange(5 * 3 * 2 * 4, dtype=np.float32).reshape(5, 3, 2, 4)  # [slots, rows, E, obs]
    slots, rows = np.array([4, 0, 2]), np.array([1, 2, 0])
    gather = PinnedRows(device, most=4)
    got = gather.gather("obs", array, slots, rows)
    assert got.device.type == device.type
    assert np.array_equal(got.cpu().numpy(), array[slots, rows].reshape(-1, 4))
    assert np.array_equal(gather.gather("obs", array, slots[:1], rows[:1]).cpu().numpy(), array[4, 1])
    if CUDA:
        assert gather._staging["obs"].is_pinned()
    assert np.array_equal(to_device(array, device).cpu().numpy(), array)
    strided = array.swapaxes(0, 1)  # as the learner's time-major trajectories: one copy into place
    assert np.array_equal(to_device(strided, device).cpu().numpy(), strided)


@needs_cuda
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_cuda_graphs_match_the_eager_forward(kind):
    _check_bucketed(kind, "cuda", [8, 16, 40])


def _publisher(path: str, channel, floats: int, versions: int, done) -> None:
    """A learner on CUDA: its shared vector out through `channel`, then `versions` versions, each all of its
    version number."""
    buffers = SharedBuffers.attach(path, LAYOUT)
    weights = SharedWeights(buffers, {("policy_worker", 0): channel})
    params = torch.zeros(floats, device="cuda")
    weights.create(params, 0, ("policy_worker",))
    for version in range(1, versions + 1):
        weights.publish(params.fill_(float(version)), version)
    done.wait(120)  # the vector lives as long as this process: until the reader is done
    buffers.release()


@needs_cuda
def test_weights_through_cuda_ipc_are_read_whole_device_to_device(tmp_path):
    """A learner process publishes versions on CUDA as fast as it can; this process (the policy worker) holds
    its vector through CUDA IPC and copies it device to device: every read is one whole version."""
    floats, versions = 1 << 22, 400
    buffers = SharedBuffers.create(str(tmp_path / "segment"), LAYOUT)
    context = multiprocessing.get_context("spawn")
    channel, done = context.Queue(), context.Event()
    learner = context.Process(target=_publisher, args=(buffers.path, channel, floats, versions, done))
    learner.start()
    try:
        reader, local = SharedWeights(buffers, {("policy_worker", 0): channel}), torch.empty(floats, device="cuda")
        assert reader.connect("policy_worker", 60) and reader.shared.is_cuda
        seen = set()
        while not seen or max(seen) < versions:
            version = reader.read_into(local)
            assert local.min() == local.max() == version, "a torn read"
            seen.add(version)
        assert len(seen) > 2
    finally:
        done.set()
        learner.join(60)
        buffers.release()
    assert learner.exitcode == 0


@needs_cuda
@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_the_recurrent_core_on_cuda_matches_nn_gru_and_lstm(kind):
    """The torch loops (what CUDA runs) on CUDA against nn.GRU / nn.LSTM on CUDA, resets included, forward
    and backward, in double precision."""
    from sf_engine.model import recurrent

    torch.manual_seed(1)
    steps, batch, features, size = 9, 6, 5, 4
    module = (torch.nn.GRU if kind == "gru" else torch.nn.LSTM)(features, size).double().cuda()
    x = torch.randn(steps, batch, features, dtype=torch.double, device="cuda", requires_grad=True)
    state = torch.randn(batch, size * (1 if kind == "gru" else 2), dtype=torch.double, device="cuda")
    state.requires_grad_(True)
    episode_start = torch.rand(steps, batch, device="cuda") < 0.25
    episode_start[0, 0] = episode_start[4, :] = True
    weights = (module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0, module.bias_hh_l0)
    assert recurrent.loops_for(x) == "torch"
    reference = _stepped_reference(kind, module, x, state, episode_start)
    out = recurrent.run_sequence(kind, x, state, episode_start, weights)
    torch.testing.assert_close(out, reference, rtol=1e-10, atol=1e-12)
    grad_out = torch.randn_like(out)
    expected = torch.autograd.grad((reference * grad_out).sum(), (x, state) + weights)
    got = torch.autograd.grad((out * grad_out).sum(), (x, state) + weights)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11)


def test_a_compiled_run_trains_on_the_cpu(tmp_path, shm_dir):
    """--compile end to end, in serial mode on the CPU: the policy worker's bucketed forward (torch.compile
    here, CUDA graphs on a GPU) and PPO's compiled learner forward (the shared actor-critic's autograd path)."""
    from conftest import TINY, read_json, run_train

    args = TINY + ["--compile", "true", "--actor_critic", "shared", "--device", "cpu", "--shm_dir", shm_dir]
    result = run_train(args + ["--experiment", "compiled", "--train_for_env_steps", "3000"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "compiled" / "summary.json")
    assert summary["env_steps"] >= 3000 and summary["learner_version"] > 0


def _replay_learner(tmp_path, algo: str, device: str, *flags):
    """SAC's or TD3's learner on Pendulum's shapes on `device`, and minibatches of 256 there (seeded)."""
    from sf_engine.algo.base import TrainingHooks
    from sf_engine.algo.batch import ReplayBatch
    from sf_engine.config.algorithms import import_class
    from sf_engine.run.plan import build_plan

    plan = build_plan(
        ["--algo", algo, "--env", "Pendulum-v1", "--train_dir", str(tmp_path), "--mode", "serial"] + list(flags)
    )
    hooks = TrainingHooks(lambda: 0, lambda: None, lambda: False, lambda: 0.0)
    torch.manual_seed(0)
    learner = import_class(plan.cfg.algorithm.learner)(plan.cfg, plan.spec, torch.device(device), hooks)
    rng = torch.Generator().manual_seed(0)
    batches = [
        ReplayBatch(
            obs={"obs": torch.randn(256, 3, generator=rng).to(device)},
            actions=(torch.rand(256, 1, generator=rng) * 4 - 2).to(device),
            returns=torch.randn(256, generator=rng).to(device),
            discounts=torch.full((256,), 0.99, device=device),
            next_obs={"obs": torch.randn(256, 3, generator=rng).to(device)},
            weights=torch.ones(256, device=device),
        )
        for _ in range(6)
    ]
    return learner, batches


@needs_cuda
def test_td3s_compiled_losses_in_cuda_graphs_take_the_eager_updates(tmp_path):
    """--compile on a GPU: TD3's losses in CUDA graphs (mode reduce-overhead: warm-up, recording, then replays)
    take the same six updates as eager ones (no target noise: no random draw in an update), the actor's every
    second, and each update's priorities are its own (not overwritten by the next update's graphs)."""
    runs = []
    for compile_flag in ("false", "true"):
        learner, batches = _replay_learner(tmp_path, "td3", "cuda", "--target_noise", "0", "--compile", compile_flag)
        results = [learner.train(batch) for batch in batches]
        runs.append((learner, [result.priorities for result in results]))
    (eager, eager_priorities), (compiled, compiled_priorities) = runs
    for name in ("params", "critic_params", "target_params", "actor_target_params"):
        torch.testing.assert_close(getattr(compiled, name), getattr(eager, name), rtol=1e-4, atol=1e-5, msg=name)
    for mine, theirs in zip(compiled_priorities, eager_priorities):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


@needs_cuda
def test_sacs_compiled_losses_train_in_cuda_graphs(tmp_path):
    """--compile on a GPU: SAC's losses in CUDA graphs train: six updates, none skipped, every weight finite and
    moved, each update's priorities its own."""
    learner, batches = _replay_learner(tmp_path, "sac", "cuda", "--compile", "true")
    before = (learner.params.clone(), learner.critic_params.clone())
    results = [learner.train(batch) for batch in batches]
    assert [result.updates for result in results] == [1] * 6
    for now, then in zip((learner.params, learner.critic_params), before):
        assert torch.isfinite(now).all() and not torch.equal(now, then)
    priorities = [result.priorities for result in results]
    assert all(torch.isfinite(p).all() for p in priorities) and not torch.equal(priorities[0], priorities[-1])
