"""GRU and LSTM sequences with episode resets, forward and backward written out by hand.

Training re-runs the core over [T, B] sequences whose states are zeroed where an episode starts.
PyTorch's fused nn.GRU / nn.LSTM cannot zero a state mid-sequence, so the sequence would have to be
cut into one call per stretch without a start, and on the CPU autograd then records a handful of
small ops per time step. Here one autograd node covers the whole sequence:
- the input projections of all steps are one matrix product; each step is one small matrix product
  and a few element-wise ops into preallocated buffers;
- the backward pass runs the same recursion in reverse; the gradients of the weights and of the
  input are three matrix products over all steps, torch's, on the threads the process sets;
- the per-step loops come two ways, both tested against nn.GRU / nn.LSTM: compiled
  (sf_engine/csrc/recurrent_loops.cpp, built by setup.py: no operator dispatch per step, each step
  one BLAS call and one or two fused element-wise passes, with glibc's vector tanh) for CPU
  float32/float64; torch ops everywhere else: CUDA, other dtypes, and CPUs where the compiled loops
  were not built. The torch loops are also the reference the compiled loops follow.
perf/rnn_ways.py times them. It also measured the ways that were dropped: NumPy loops and nn.LSTM's
fused kernel over padded stretches were slower than the compiled loops and only helped where those
are not built, which the torch loops now cover alone; oneDNN's kernel for the large products did not
make the compiled loops faster than torch's products.

The maths and the parameters are nn.GRU's and nn.LSTM's (gate order r, z, n and i, f, g, o), so
checkpoints and acting agree with nn.GRU / nn.LSTM. Sigmoids are computed as 0.5 + 0.5 tanh(a / 2):
the loops work on copies of the weights whose sigmoid rows are halved (the LSTM's rows also
reordered to i, f, o, g, the three sigmoids first).

`RecurrentCore` is the models' core module: acting steps it once (torch's fused cell), training runs
whole sequences through the above.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

_NATIVE_VERSION = 2  # recurrent_loops.cpp's version(): a build of another version is not used


def _load_native():
    """The compiled loops (sf_engine/csrc/recurrent_loops.cpp, built by setup.py) as torch ops, or None
    when they were not built, do not load (built for another torch), are of another version (rebuild:
    `make`) or have only a scalar tanh."""
    spec = importlib.util.find_spec("sf_engine.model._recurrent_loops")
    if spec is None or spec.origin is None:
        return None
    try:
        torch.ops.load_library(spec.origin)
        ops = torch.ops.sf_engine_recurrent
        return ops if ops.version() == _NATIVE_VERSION and ops.vector_tanh() else None
    except (OSError, RuntimeError, AttributeError):
        return None


NATIVE = _load_native()


def loops_for(tensor: torch.Tensor, loops=None) -> str:
    """Which loops run: 'native' (compiled) for CPU float32/float64 when built, else 'torch'; `loops`
    forces one."""
    if loops is not None:
        if loops not in ("native", "torch"):
            raise ValueError(f"loops must be 'native' or 'torch' (got {loops!r})")
        if loops == "native" and NATIVE is None:
            raise RuntimeError(
                "the compiled recurrent loops are not built: run `pip install --no-build-isolation -e .`"
            )
        return loops
    if NATIVE is not None and tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64):
        return "native"
    return "torch"


def _flat_keep(keep):
    return None if keep is None else keep.reshape(keep.shape[0], -1)


def _halved_rows(tensor: torch.Tensor, rows: list) -> torch.Tensor:
    """A copy of `tensor` with the row ranges in `rows` halved (the pre-activations of sigmoids)."""
    tensor = tensor.detach().clone()
    for begin, end in rows:
        tensor[begin:end] *= 0.5
    return tensor


def _sigmoid_from_tanh(tensor: torch.Tensor) -> None:
    """In place: tanh(a / 2) -> sigmoid(a)."""
    tensor.mul_(0.5).add_(0.5)


def gru_forward(x, h0, keep, resets, w_ih, w_hh, b_ih, b_hh, loops=None):
    """x [T, B, F], h0 [B, H], keep [T, B, 1] (0 where the state is zeroed before the step) or None,
    resets [T] bools (some keep is 0 at that step). Returns the outputs h_t [T, B, H] and, for the
    backward pass, the recurrent pre-activations gh [T, B, 3H] (its r and z parts halved; only its n
    part is read, and the compiled loops leave b_hh out of the others) and the gates rz [T, B, 2H]
    and n [T, B, H]."""
    steps, batch, _ = x.shape
    size = h0.shape[-1]
    halve = [(0, 2 * size)]
    gi = torch.addmm(
        _halved_rows(b_ih, halve), x.detach().reshape(steps * batch, -1), _halved_rows(w_ih, halve).t()
    ).view(steps, batch, 3 * size)
    w_hh_t = _halved_rows(w_hh, halve).t().contiguous()
    b_hh = _halved_rows(b_hh, halve)
    if loops_for(x, loops) == "native":
        return NATIVE.gru_forward(gi, h0.detach(), _flat_keep(keep), w_hh_t, b_hh)
    out, gh = x.new_empty(steps, batch, size), x.new_empty(steps, batch, 3 * size)
    rz, n = x.new_empty(steps, batch, 2 * size), x.new_empty(steps, batch, size)
    h = h0.detach()
    for t in range(steps):
        if resets[t]:
            h = h * keep[t]
        g, a, nt, o = gh[t], rz[t], n[t], out[t]
        torch.addmm(b_hh, h, w_hh_t, out=g)
        torch.tanh(torch.add(gi[t, :, : 2 * size], g[:, : 2 * size], out=a), out=a)
        _sigmoid_from_tanh(a)
        torch.mul(a[:, :size], g[:, 2 * size :], out=nt)
        nt += gi[t, :, 2 * size :]
        torch.tanh(nt, out=nt)
        torch.sub(h, nt, out=o)  # h' = n + z (h - n)
        o *= a[:, size:]
        o += nt
        h = o
    return out, gh, rz, n


def lstm_forward(x, s0, keep, resets, w_ih, w_hh, b_ih, b_hh, loops=None):
    """x [T, B, F], s0 [B, 2H] (h and c), keep and resets as for the GRU. Returns [T, B, 2H] (h_t and
    c_t) and, for the backward pass, the activated gates [T, B, 4H] in (i, f, o, g) order (the three
    sigmoids first) and tanh(c_t) [T, B, H]."""
    steps, batch, _ = x.shape
    size = s0.shape[-1] // 2
    ifog = _IFOG(size, x.device)
    halve = [(0, 3 * size)]
    gi = torch.addmm(
        _halved_rows((b_ih + b_hh)[ifog], halve),
        x.detach().reshape(steps * batch, -1),
        _halved_rows(w_ih[ifog], halve).t(),
    ).view(steps, batch, 4 * size)
    w_hh_t = _halved_rows(w_hh[ifog], halve).t().contiguous()
    if loops_for(x, loops) == "native":
        return NATIVE.lstm_forward(gi, s0.detach(), _flat_keep(keep), w_hh_t)
    out, gates = x.new_empty(steps, batch, 2 * size), x.new_empty(steps, batch, 4 * size)
    tanh_c, scratch = x.new_empty(steps, batch, size), x.new_empty(batch, size)
    h, c = s0[:, :size].detach(), s0[:, size:].detach()
    for t in range(steps):
        if resets[t]:
            h, c = h * keep[t], c * keep[t]
        g, ht, ct, tc = gates[t], out[t, :, :size], out[t, :, size:], tanh_c[t]
        torch.addmm(gi[t], h, w_hh_t, out=g)
        torch.tanh(g, out=g)
        _sigmoid_from_tanh(g[:, : 3 * size])
        torch.mul(g[:, :size], g[:, 3 * size :], out=ct)  # c' = i g + f c
        ct += torch.mul(g[:, size : 2 * size], c, out=scratch)
        torch.mul(g[:, 2 * size : 3 * size], torch.tanh(ct, out=tc), out=ht)  # h' = o tanh(c')
        h, c = ht, ct
    return out, gates, tanh_c


def _IFOG(size: int, device) -> torch.Tensor:
    """Row order (i, f, o, g) of nn.LSTM's (i, f, g, o) weight rows."""
    rows = torch.arange(4 * size, device=device).view(4, size)
    return rows[[0, 1, 3, 2]].reshape(-1)


def _previous(out, s0, keep):
    """The state each step started from (after its reset): [T, B, S]."""
    previous = torch.cat([s0.detach().unsqueeze(0), out[:-1]])
    return previous if keep is None else previous.mul_(keep)


def gru_backward(grad_out, x, h0, keep, resets, w_ih, w_hh, out, gh, rz, n, loops=None):
    """Gradients of gru_forward's outputs -> (dx, dh0, dw_ih, dw_hh, db_ih, db_hh)."""
    steps, batch, size = out.shape
    hp = _previous(out, h0, keep)
    w_nrz = torch.cat([w_hh[2 * size :], w_hh[: 2 * size]]).detach()  # w_hh's rows in (n, r, z) order
    # d_all = [d gh_n | d a_r | d a_z | d a_n] (a: the pre-activations): [..., :3H] is d gh in (n, r, z)
    # order, [..., H:] is d gi in (r, z, n) order, so neither needs a copy
    if loops_for(x, loops) == "native":
        d_all, dh = NATIVE.gru_backward(grad_out, h0.detach(), _flat_keep(keep), out, gh, rz, n, w_nrz)
    else:
        d_all, dh = _gru_backward_loop(grad_out, hp, keep, resets, w_nrz, gh, rz, n)
    d_all = d_all.view(steps * batch, 4 * size)
    d_gi, d_gh = d_all[:, size:], d_all[:, : 3 * size]
    grad_w_ih = d_gi.t() @ x.detach().reshape(steps * batch, -1)
    grad_w_nrz = d_gh.t() @ hp.reshape(steps * batch, size)
    grad_b_nrz = d_gh.sum(0)
    return (
        (d_gi @ w_ih.detach()).view_as(x),
        dh,
        grad_w_ih,
        torch.cat([grad_w_nrz[size:], grad_w_nrz[:size]]),
        d_gi.sum(0),
        torch.cat([grad_b_nrz[size:], grad_b_nrz[:size]]),
    )


def _gru_backward_loop(grad_out, hp, keep, resets, w_nrz, gh, rz, n):
    """The GRU's backward recursion in torch ops -> (d_all [T, B, 4H], dh0)."""
    steps, batch, size = n.shape
    r, z = rz[..., :size], rz[..., size:]
    one_minus_z = 1 - z
    # factors of the recursion that do not depend on it, for all steps at once: dh -> (d a_z, d a_n)
    # and d a_n -> (d gh_n, d a_r)
    from_dh = n.new_empty(steps, batch, 2, size)
    torch.sub(hp, n, out=from_dh[:, :, 0]).mul_(z).mul_(one_minus_z)
    torch.mul(n, n, out=from_dh[:, :, 1]).neg_().add_(1).mul_(one_minus_z)
    from_an = n.new_empty(steps, batch, 2, size)
    from_an[:, :, 0] = r
    torch.mul(r, r, out=from_an[:, :, 1]).neg_().add_(r).mul_(gh[..., 2 * size :])
    d_all = grad_out.new_empty(steps, batch, 4 * size)
    dh, scratch = n.new_zeros(batch, size), n.new_empty(batch, size)
    d_pairs = d_all.view(steps, batch, 2, 2, size)
    to_ghn_ar, to_az_an, d_gh = d_pairs[:, :, 0], d_pairs[:, :, 1], d_all[..., : 3 * size]
    for t in range(steps - 1, -1, -1):
        dh += grad_out[t]
        az_an = torch.mul(dh[:, None], from_dh[t], out=to_az_an[t])
        torch.mul(az_an[:, 1:], from_an[t], out=to_ghn_ar[t])
        torch.mul(dh, z[t], out=scratch)
        torch.addmm(scratch, d_gh[t], w_nrz, out=dh)
        if resets[t]:
            dh *= keep[t]
    return d_all, dh


def lstm_backward(grad_out, x, s0, keep, resets, w_ih, w_hh, out, gates, tanh_c, loops=None):
    """Gradients of lstm_forward's outputs -> (dx, ds0, dw_ih, dw_hh, db_ih, db_hh)."""
    steps, batch, size = tanh_c.shape
    sp = _previous(out, s0, keep)
    w_hh = w_hh.detach()
    if loops_for(x, loops) == "native":  # d_all: d of the pre-activations in (i, f, g, o) order
        d_all, ds0 = NATIVE.lstm_backward(grad_out, s0.detach(), _flat_keep(keep), out, gates, tanh_c, w_hh)
    else:
        d_all, ds0 = _lstm_backward_loop(grad_out, sp, keep, resets, w_hh, gates, tanh_c)
    d_a = d_all.reshape(steps * batch, 4 * size)
    grad_b = d_a.sum(0)
    return (
        (d_a @ w_ih.detach()).view_as(x),
        ds0,
        d_a.t() @ x.detach().reshape(steps * batch, -1),
        d_a.t() @ sp[..., :size].reshape(steps * batch, size),
        grad_b,
        grad_b,
    )


def _lstm_backward_loop(grad_out, sp, keep, resets, w_hh, gates, tanh_c):
    """The LSTM's backward recursion in torch ops -> (d_all [T, B, 4H], ds0)."""
    steps, batch, size = tanh_c.shape
    i, f, o, g = (gates[..., k * size : (k + 1) * size] for k in range(4))
    to_c = (1 - tanh_c * tanh_c).mul_(o)  # dh -> dc
    to_a = gates.new_empty(steps, batch, 3 * size)  # dc -> d a_i, d a_f, d a_g
    torch.mul(i, i, out=to_a[..., :size]).neg_().add_(i).mul_(g)
    torch.mul(f, f, out=to_a[..., size : 2 * size]).neg_().add_(f).mul_(sp[..., size:])
    torch.mul(g, g, out=to_a[..., 2 * size :]).neg_().add_(1).mul_(i)
    to_ao = (1 - o).mul_(o).mul_(tanh_c)  # dh -> d a_o
    d_all = grad_out.new_empty(steps, batch, 4 * size)  # d a in (i, f, g, o) order
    dh, dc, scratch = gates.new_zeros(batch, size), gates.new_zeros(batch, size), gates.new_empty(batch, size)
    d_ifg, d_o = d_all[..., : 3 * size].unflatten(-1, (3, size)), d_all[..., 3 * size :]
    to_a = to_a.unflatten(-1, (3, size))
    for t in range(steps - 1, -1, -1):
        dh += grad_out[t, :, :size]
        dc += grad_out[t, :, size:]
        dc += torch.mul(dh, to_c[t], out=scratch)
        torch.mul(dc[:, None], to_a[t], out=d_ifg[t])
        torch.mul(dh, to_ao[t], out=d_o[t])
        torch.mm(d_all[t], w_hh, out=dh)
        dc *= f[t]
        if resets[t]:
            dh *= keep[t]
            dc *= keep[t]
    return d_all, torch.cat([dh, dc], dim=-1)


_FORWARD = {"gru": gru_forward, "lstm": lstm_forward}
_BACKWARD = {"gru": gru_backward, "lstm": lstm_backward}


class _Sequence(torch.autograd.Function):
    """One autograd node for a whole GRU or LSTM sequence."""

    @staticmethod
    def forward(ctx, kind, x, state, keep, resets, w_ih, w_hh, b_ih, b_hh):
        out, *saved = _FORWARD[kind](x, state, keep, resets, w_ih, w_hh, b_ih, b_hh)
        ctx.kind, ctx.resets = kind, resets
        ctx.save_for_backward(x, state, keep, w_ih, w_hh, out, *saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, state, keep, w_ih, w_hh, out, *saved = ctx.saved_tensors
        dx, dstate, dw_ih, dw_hh, db_ih, db_hh = _BACKWARD[ctx.kind](
            grad_out, x, state, keep, ctx.resets, w_ih, w_hh, out, *saved
        )
        return None, dx, dstate, None, None, dw_ih, dw_hh, db_ih, db_hh


def run_sequence(kind: str, x, state, episode_start, weights):
    """The core over [T, B] steps: kind 'gru' or 'lstm'; x [T, B, F]; state [B, S] before step 0 (S = H,
    or 2H with c after h); episode_start [T, B] bool (the state is zeroed before those steps) or None
    (no resets); weights (w_ih, w_hh, b_ih, b_hh) as nn.GRU / nn.LSTM hold them. Returns the state
    after each step [T, B, S]."""
    if episode_start is None:
        keep, resets = None, [False] * x.shape[0]
    else:
        keep = (~episode_start).to(x.dtype).unsqueeze(-1)
        resets = episode_start.any(dim=1).tolist()
    if torch.is_grad_enabled() and (x.requires_grad or state.requires_grad or any(w.requires_grad for w in weights)):
        return _Sequence.apply(kind, x, state, keep, resets, *weights)
    return _FORWARD[kind](x, state, keep, resets, *weights)[0]


class RecurrentCore(nn.Module):
    """A one-layer GRU or LSTM. State [B, state_size]: h, or h and c concatenated for the LSTM.
    Acting steps it once (`step`); training re-runs whole sequences (`sequence`), zeroing the state
    where an episode starts, as one autograd node (sf_engine.model.recurrent). The parameters are those of
    an nn.GRU / nn.LSTM, under its names."""

    def __init__(self, kind: str, in_size: int, size: int):
        super().__init__()
        self.kind, self.out_size = kind, size
        self.rnn = (nn.GRU if kind == "gru" else nn.LSTM)(in_size, size)
        self.state_size = size * (2 if kind == "lstm" else 1)
        for name, param in self.rnn.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param)
            else:
                nn.init.zeros_(param)

    @property
    def weights(self) -> tuple:
        """(w_ih, w_hh, b_ih, b_hh) as nn.GRU / nn.LSTM hold them."""
        rnn = self.rnn
        return rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0

    def _run(self, x: torch.Tensor, state: torch.Tensor, episode_start):
        return run_sequence(self.kind, x, state, episode_start, self.weights)

    def bfloat16_weights(self, copies: tuple = None) -> tuple:
        """bfloat16 copies of `weights` (for step's `bf16_weights`): made, or `copies` refreshed."""
        if copies is None:
            return tuple(w.detach().to(torch.bfloat16) for w in self.weights)
        with torch.no_grad():
            for target, source in zip(copies, self.weights):
                target.copy_(source)
        return copies

    def step(self, x: torch.Tensor, state: torch.Tensor, bf16_weights: tuple = None):
        """x [B, F], state [B, state_size] -> (output [B, size], new state). Without gradients (acting)
        one step is torch's fused cell, which reads the weights where they lie (the sequence loops
        prepare transposed copies of them, a cost a sequence amortizes and one step does not); with
        `bf16_weights` (bfloat16_weights()) it runs in bfloat16, outputs and state back in state's dtype."""
        if torch.is_grad_enabled():
            new_state = self._run(x.unsqueeze(0), state, None)[0]
            return new_state[:, : self.out_size], new_state
        size, weights = self.out_size, bf16_weights or self.weights
        dtype = torch.bfloat16 if bf16_weights else state.dtype
        x, cell_state = x.to(dtype), state.to(dtype)  # the encoder's features may be bf16 (--bf16)
        if self.kind == "gru":
            h = torch.gru_cell(x, cell_state, *weights).to(state.dtype)
            return h, h
        h, c = torch.lstm_cell(x, (cell_state[:, :size], cell_state[:, size:]), *weights)
        h = h.to(state.dtype)
        return h, torch.cat([h, c.to(state.dtype)], dim=1)

    def sequence(self, x: torch.Tensor, state: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """x [R, B, F] time-major, state [B, state_size] before step 0, episode_start [R, B] (the state
        is zeroed before those steps) -> outputs [R, B, size]."""
        return self._run(x, state, episode_start)[..., : self.out_size]
