"""GRU and LSTM sequences with episode resets, forward and backward written out by hand.

Training re-runs the core over [T, B] sequences whose states are zeroed where an episode starts.
PyTorch's fused nn.GRU / nn.LSTM cannot zero a state mid-sequence, so the sequence would have to be
cut into one call per stretch without a start, and on the CPU autograd then records a handful of
small ops per time step. Here one autograd node covers the whole sequence:
- the input projections of all steps are one matrix product; each step is one small matrix product
  and a few element-wise ops into preallocated buffers;
- the backward pass runs the same recursion in reverse; the gradients of the weights and of the
  input are three matrix products over all steps;
- those large products of CPU float32 run on oneDNN's kernel where torch has it (`_linear`): on this
  project's reference CPU (AMD EPYC, AVX-512) it is about twice as fast as torch.mm, whose MKL
  takes its AVX2 kernels there;
- the per-step loops come three ways, all tested against nn.GRU / nn.LSTM: compiled
  (sf_engine/csrc/recurrent_loops.cpp, built by setup.py: each step is one BLAS call and one or two
  fused element-wise passes, with glibc's vector tanh) for CPU float32/float64; NumPy ops on views
  of the CPU tensors when those are not built (an element-wise NumPy op on a [32, 64] array costs
  about a third of a torch op there); torch ops elsewhere (CUDA, bfloat16). `_NUMPY` and `_TORCH`
  name the few functions the two Python loops share. Matrix products always go through torch or
  its BLAS, whose thread count the process sets (NumPy's BLAS would start threads of its own and
  fight the other processes for the cores).

Without the compiled loops, the CPU LSTM has a faster way when few episodes start inside the
sequences: nn.LSTM runs on oneDNN's fused kernel there, and `padded_sequence` turns every stretch
between starts into a row of its own, from step 0 of the call (it runs on into later inputs, which
no output it keeps depends on), so one call needs no reset; `use_padded` picks it while the rows are
at most twice the sequences (beyond that the extra rows cost more than they save). The compiled
loops beat it even with few starts (2.2 vs 2.3 ms for a [32, 32] minibatch with 3 starts).

The maths and the parameters are nn.GRU's and nn.LSTM's (gate order r, z, n and i, f, g, o), so
checkpoints and acting agree with nn.GRU / nn.LSTM. Sigmoids are computed as 0.5 + 0.5 tanh(a / 2):
the loops work on copies of the weights whose sigmoid rows are halved (the LSTM's rows also
reordered to i, f, o, g, the three sigmoids first).
"""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import torch

_NUMPY = SimpleNamespace(add=np.add, sub=np.subtract, mul=np.multiply, tanh=np.tanh)
_TORCH = SimpleNamespace(add=torch.add, sub=torch.sub, mul=torch.mul, tanh=torch.tanh)


_NATIVE_VERSION = 2  # recurrent_loops.cpp's version(): a build of another version is not used


def _load_native():
    """The compiled loops (sf_engine/csrc/recurrent_loops.cpp, built by setup.py) as torch ops, or None
    when they were not built, do not load (built for another torch), are of another version (rebuild:
    `make`) or have only a scalar tanh."""
    spec = importlib.util.find_spec("sf_engine._recurrent_loops")
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
    """Which loops run: 'native' (compiled) for CPU float32/float64 when built, else 'numpy' for CPU
    dtypes NumPy has, else 'torch' (CUDA, bfloat16); `loops` forces one."""
    if loops is not None:
        if loops == "native" and NATIVE is None:
            raise RuntimeError("the compiled recurrent loops are not built: run "
                               "`pip install --no-build-isolation -e .`")
        return loops
    if tensor.device.type == "cpu":
        if NATIVE is not None and tensor.dtype in (torch.float32, torch.float64):
            return "native"
        if tensor.dtype in (torch.float16, torch.float32, torch.float64):
            return "numpy"
    return "torch"


def _probe_onednn():
    """oneDNN's matrix product as torch exposes it (torch.ops.mkldnn._linear_pointwise: a @ w^T + b),
    if this torch has it and it agrees with torch.mm; else None. On this project's reference CPU it
    runs the core's large float32 products at about twice the speed of torch.mm (MKL). Probed on
    first use, not at import: the forkserver imports this module, and a process that has run
    oneDNN's (OpenMP) threads before forking leaves its children hanging in theirs."""
    try:
        if not torch.backends.mkldnn.is_available():
            return None
        op = torch.ops.mkldnn._linear_pointwise
        generator = torch.Generator().manual_seed(0)
        a, w = torch.randn(300, 20, generator=generator), torch.randn(7, 20, generator=generator)
        bias = torch.randn(7, generator=generator)
        if not torch.allclose(op(a, w, bias, "none", [], ""), torch.addmm(bias, a, w.t()), rtol=1e-5, atol=1e-5):
            return None
        return op
    except (AttributeError, RuntimeError):
        return None


_ONEDNN = []  # [the op or None] once probed
_ONEDNN_MIN_MACS = 1 << 21  # below this, its per-call cost outweighs the faster kernel


def _onednn():
    if not _ONEDNN:
        _ONEDNN.append(_probe_onednn())
    return _ONEDNN[0]


def _onednn_for(a: torch.Tensor, w: torch.Tensor) -> bool:
    return (a.device.type == "cpu" and a.dtype == torch.float32 and torch.backends.mkldnn.enabled
            and a.shape[0] * a.shape[1] * w.shape[0] >= _ONEDNN_MIN_MACS and _onednn() is not None)


def _linear(a: torch.Tensor, w: torch.Tensor, bias=None) -> torch.Tensor:
    """a [M, K] @ w[N, K]^T (+ bias [N]): oneDNN's product for large CPU float32 ones, torch's else.
    oneDNN wants a with rows in memory order and w contiguous or the transpose of a contiguous
    matrix (other layouts of w run a slow path): both are copied into those layouts if need be."""
    if not _onednn_for(a, w):
        return a @ w.t() if bias is None else torch.addmm(bias, a, w.t())
    if a.stride(-1) != 1:
        a = a.contiguous()
    if not (w.is_contiguous() or w.t().is_contiguous()):
        w = w.contiguous()
    return _onednn()(a, w, bias, "none", [], "")


def _backend(loops: str):
    """(ops, view) for the Python loops."""
    return (_NUMPY, lambda t: t.detach().numpy()) if loops == "numpy" else (_TORCH, lambda t: t)


def _flat_keep(keep):
    return None if keep is None else keep.reshape(keep.shape[0], -1)


def _halved_rows(tensor: torch.Tensor, rows: list) -> torch.Tensor:
    """A copy of `tensor` with the row ranges in `rows` halved (the pre-activations of sigmoids)."""
    tensor = tensor.detach().clone()
    for begin, end in rows:
        tensor[begin:end] *= 0.5
    return tensor


def _sigmoid_from_tanh(array) -> None:
    """In place: tanh(a / 2) -> sigmoid(a)."""
    array *= 0.5
    array += 0.5


def gru_forward(x, h0, keep, resets, w_ih, w_hh, b_ih, b_hh, loops=None):
    """x [T, B, F], h0 [B, H], keep [T, B, 1] (0 where the state is zeroed before the step) or None,
    resets [T] bools (some keep is 0 at that step). Returns the outputs h_t [T, B, H] and, for the
    backward pass, the recurrent pre-activations gh [T, B, 3H] (its r and z parts halved; only its n
    part is read, and the compiled loops leave b_hh out of the others) and the gates rz [T, B, 2H]
    and n [T, B, H]."""
    steps, batch, _ = x.shape
    size = h0.shape[-1]
    halve = [(0, 2 * size)]
    gi = _linear(x.detach().reshape(steps * batch, -1), _halved_rows(w_ih, halve),
                 _halved_rows(b_ih, halve)).view(steps, batch, 3 * size)
    w_hh_t = _halved_rows(w_hh, halve).t().contiguous()
    b_hh = _halved_rows(b_hh, halve)
    loops = loops_for(x, loops)
    if loops == "native":
        return NATIVE.gru_forward(gi, h0.detach(), _flat_keep(keep), w_hh_t, b_hh)
    out, gh = x.new_empty(steps, batch, size), x.new_empty(steps, batch, 3 * size)
    rz, n = x.new_empty(steps, batch, 2 * size), x.new_empty(steps, batch, size)
    ops, view = _backend(loops)
    gi_, out_, gh_, rz_, n_ = (view(t) for t in (gi, out, gh, rz, n))
    gh_steps, out_steps = gh.unbind(0), out.unbind(0)
    h_tensor = h0.detach()
    h = view(h_tensor)
    for t in range(steps):
        if resets[t]:
            h_tensor = h_tensor * keep[t]
            h = view(h_tensor)
        g, a, nt, o = gh_[t], rz_[t], n_[t], out_[t]
        torch.addmm(b_hh, h_tensor, w_hh_t, out=gh_steps[t])
        ops.tanh(ops.add(gi_[t, :, :2 * size], g[:, :2 * size], out=a), out=a)
        _sigmoid_from_tanh(a)
        ops.mul(a[:, :size], g[:, 2 * size:], out=nt)
        nt += gi_[t, :, 2 * size:]
        ops.tanh(nt, out=nt)
        ops.sub(h, nt, out=o)  # h' = n + z (h - n)
        o *= a[:, size:]
        o += nt
        h, h_tensor = o, out_steps[t]
    return out, gh, rz, n


def lstm_forward(x, s0, keep, resets, w_ih, w_hh, b_ih, b_hh, loops=None):
    """x [T, B, F], s0 [B, 2H] (h and c), keep and resets as for the GRU. Returns [T, B, 2H] (h_t and
    c_t) and, for the backward pass, the activated gates [T, B, 4H] in (i, f, o, g) order (the three
    sigmoids first) and tanh(c_t) [T, B, H]."""
    steps, batch, _ = x.shape
    size = s0.shape[-1] // 2
    ifog = _IFOG(size, x.device)
    halve = [(0, 3 * size)]
    gi = _linear(x.detach().reshape(steps * batch, -1), _halved_rows(w_ih[ifog], halve),
                 _halved_rows((b_ih + b_hh)[ifog], halve)).view(steps, batch, 4 * size)
    w_hh_t = _halved_rows(w_hh[ifog], halve).t().contiguous()
    loops = loops_for(x, loops)
    if loops == "native":
        return NATIVE.lstm_forward(gi, s0.detach(), _flat_keep(keep), w_hh_t)
    out, gates, tanh_c = x.new_empty(steps, batch, 2 * size), x.new_empty(steps, batch, 4 * size), x.new_empty(
        steps, batch, size)
    ops, view = _backend(loops)
    out_, gates_, tanh_c_ = (view(t) for t in (out, gates, tanh_c))
    keep_ = None if keep is None else view(keep)
    gi_steps, gates_steps, h_steps = gi.unbind(0), gates.unbind(0), out[..., :size].unbind(0)
    h_tensor, c = s0[:, :size].detach(), view(s0)[:, size:]
    scratch = view(x.new_empty(batch, size))
    for t in range(steps):
        if resets[t]:
            h_tensor, c = h_tensor * keep[t], c * keep_[t]
        g, ht, ct, tc = gates_[t], out_[t, :, :size], out_[t, :, size:], tanh_c_[t]
        torch.addmm(gi_steps[t], h_tensor, w_hh_t, out=gates_steps[t])
        ops.tanh(g, out=g)
        _sigmoid_from_tanh(g[:, :3 * size])
        ops.mul(g[:, :size], g[:, 3 * size:], out=ct)  # c' = i g + f c
        ct += ops.mul(g[:, size:2 * size], c, out=scratch)
        ops.mul(g[:, 2 * size:3 * size], ops.tanh(ct, out=tc), out=ht)  # h' = o tanh(c')
        h_tensor, c = h_steps[t], ct
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
    w_nrz = torch.cat([w_hh[2 * size:], w_hh[:2 * size]]).detach()  # w_hh's rows in (n, r, z) order
    # d_all = [d gh_n | d a_r | d a_z | d a_n] (a: the pre-activations): [..., :3H] is d gh in (n, r, z)
    # order, [..., H:] is d gi in (r, z, n) order, so neither needs a copy
    loops = loops_for(x, loops)
    if loops == "native":
        d_all, dh = NATIVE.gru_backward(grad_out, h0.detach(), _flat_keep(keep), out, gh, rz, n, w_nrz)
    else:
        d_all, dh = _gru_backward_loop(grad_out, hp, keep, resets, w_nrz, gh, rz, n, _backend(loops))
    d_all = d_all.view(steps * batch, 4 * size)
    d_gi, d_gh = d_all[:, size:], d_all[:, :3 * size]
    x2d, hp2d = x.detach().reshape(steps * batch, -1), hp.reshape(steps * batch, size)
    if _onednn_for(x2d.t(), d_all.t()):  # products with all of d_all (its columns as oneDNN takes them), then the parts
        grad_w_ih = _linear(x2d.t(), d_all.t())[:, size:].t()
        grad_w_nrz = _linear(hp2d.t(), d_all.t())[:, :3 * size].t()
    else:
        grad_w_ih, grad_w_nrz = d_gi.t() @ x2d, d_gh.t() @ hp2d
    grad_b_nrz = d_gh.sum(0)
    return (_linear(d_gi, w_ih.detach().t()).view_as(x), dh, grad_w_ih,
            torch.cat([grad_w_nrz[size:], grad_w_nrz[:size]]), d_gi.sum(0),
            torch.cat([grad_b_nrz[size:], grad_b_nrz[:size]]))


def _gru_backward_loop(grad_out, hp, keep, resets, w_nrz, gh, rz, n, backend):
    """The GRU's backward recursion in Python loops -> (d_all [T, B, 4H], dh0)."""
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
    torch.mul(r, r, out=from_an[:, :, 1]).neg_().add_(r).mul_(gh[..., 2 * size:])
    d_all = grad_out.new_empty(steps, batch, 4 * size)
    dh, scratch = n.new_zeros(batch, size), n.new_empty(batch, size)
    ops, view = backend
    d_pairs = d_all.view(steps, batch, 2, 2, size)
    to_ghn_ar, to_az_an, grad_, from_dh_, from_an_, z_, dh_, scratch_ = (
        view(t) for t in (d_pairs[:, :, 0], d_pairs[:, :, 1], grad_out.contiguous(), from_dh, from_an, z, dh, scratch))
    d_gh_steps = d_all[..., :3 * size].unbind(0)
    keep_ = None if keep is None else view(keep)
    for t in range(steps - 1, -1, -1):
        dh_ += grad_[t]
        az_an = ops.mul(dh_[:, None], from_dh_[t], out=to_az_an[t])
        ops.mul(az_an[:, 1:], from_an_[t], out=to_ghn_ar[t])
        ops.mul(dh_, z_[t], out=scratch_)
        torch.addmm(scratch, d_gh_steps[t], w_nrz, out=dh)
        if resets[t]:
            dh_ *= keep_[t]
    return d_all, dh


def lstm_backward(grad_out, x, s0, keep, resets, w_ih, w_hh, out, gates, tanh_c, loops=None):
    """Gradients of lstm_forward's outputs -> (dx, ds0, dw_ih, dw_hh, db_ih, db_hh)."""
    steps, batch, size = tanh_c.shape
    sp = _previous(out, s0, keep)
    w_hh = w_hh.detach()
    loops = loops_for(x, loops)
    if loops == "native":  # d_all: d of the pre-activations in (i, f, g, o) order
        d_all, ds0 = NATIVE.lstm_backward(grad_out, s0.detach(), _flat_keep(keep), out, gates, tanh_c, w_hh)
    else:
        d_all, ds0 = _lstm_backward_loop(grad_out, sp, keep, resets, w_hh, gates, tanh_c, _backend(loops))
    d_a = d_all.reshape(steps * batch, 4 * size)
    grad_b = d_a.sum(0)
    x2d = x.detach().reshape(steps * batch, -1)
    return (_linear(d_a, w_ih.detach().t()).view_as(x), ds0, _linear(x2d.t(), d_a.t()).t(),
            _linear(sp[..., :size].reshape(steps * batch, size).t(), d_a.t()).t(), grad_b, grad_b)


def _lstm_backward_loop(grad_out, sp, keep, resets, w_hh, gates, tanh_c, backend):
    """The LSTM's backward recursion in Python loops -> (d_all [T, B, 4H], ds0)."""
    steps, batch, size = tanh_c.shape
    i, f, o, g = (gates[..., k * size:(k + 1) * size] for k in range(4))
    to_c = (1 - tanh_c * tanh_c).mul_(o)                # dh -> dc
    to_a = gates.new_empty(steps, batch, 3 * size)      # dc -> d a_i, d a_f, d a_g
    torch.mul(i, i, out=to_a[..., :size]).neg_().add_(i).mul_(g)
    torch.mul(f, f, out=to_a[..., size:2 * size]).neg_().add_(f).mul_(sp[..., size:])
    torch.mul(g, g, out=to_a[..., 2 * size:]).neg_().add_(1).mul_(i)
    to_ao = (1 - o).mul_(o).mul_(tanh_c)                # dh -> d a_o
    d_all = grad_out.new_empty(steps, batch, 4 * size)  # d a in (i, f, g, o) order
    dh_tensor, dc_tensor = gates.new_zeros(batch, size), gates.new_zeros(batch, size)
    ops, view = backend
    d_ifg, d_o, grad_, to_c_, to_a_, to_ao_, f_, dh, dc, scratch = (
        view(t) for t in (d_all[..., :3 * size].unflatten(-1, (3, size)), d_all[..., 3 * size:], grad_out.contiguous(),
                          to_c, to_a.unflatten(-1, (3, size)), to_ao, f, dh_tensor, dc_tensor,
                          torch.empty_like(dc_tensor)))
    keep_ = None if keep is None else view(keep)
    d_steps = d_all.unbind(0)
    for t in range(steps - 1, -1, -1):
        dh += grad_[t, :, :size]
        dc += grad_[t, :, size:]
        dc += ops.mul(dh, to_c_[t], out=scratch)
        ops.mul(dc[:, None], to_a_[t], out=d_ifg[t])
        ops.mul(dh, to_ao_[t], out=d_o[t])
        torch.mm(d_steps[t], w_hh, out=dh_tensor)
        dc *= f_[t]
        if resets[t]:
            dh *= keep_[t]
            dc *= keep_[t]
    return d_all, torch.cat([dh_tensor, dc_tensor], dim=-1)


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
        dx, dstate, dw_ih, dw_hh, db_ih, db_hh = _BACKWARD[ctx.kind](grad_out, x, state, keep, ctx.resets, w_ih,
                                                                     w_hh, out, *saved)
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


def use_padded(kind: str, x: torch.Tensor, episode_start) -> bool:
    """Whether `padded_sequence` (oneDNN's fused LSTM) is the faster way for this CPU sequence."""
    return (NATIVE is None and kind == "lstm" and x.device.type == "cpu" and x.dtype == torch.float32
            and episode_start is not None
            and torch.backends.mkldnn.is_available() and int(episode_start[1:].sum()) <= x.shape[1])


def padded_sequence(module: torch.nn.Module, x, state, episode_start) -> torch.Tensor:
    """nn.GRU / nn.LSTM `module` over [T, B] steps with resets in one call: each stretch of a sequence
    that starts at step 0 or at an episode start becomes its own row, from step 0 of the call, with the
    sequence's state (zeroed at an episode start) or zeros. A row runs on past its stretch (into the
    sequence's later inputs, then repeating the last one) to the call's T steps; no output that is
    kept depends on those steps. Returns the outputs h_t [T, B, H]."""
    steps, batch, features = x.shape
    size = module.hidden_size
    starts = episode_start.clone()
    starts[0] = True
    row_b, row_t = starts.t().nonzero(as_tuple=True)  # row j: sequence row_b[j] from step row_t[j]
    rows = row_b.numel()
    row_of = starts.t().reshape(-1).long().cumsum(0).view(batch, steps).t() - 1  # [T, B] -> its row
    step = torch.arange(steps, device=x.device).unsqueeze(1)
    source = (row_t + step).clamp(max=steps - 1) * batch + row_b  # [T, rows] -> flat step of x
    padded = x.reshape(steps * batch, features)[source.reshape(-1)].view(steps, rows, features)
    first = row_t == 0
    initial = x.new_zeros(rows, state.shape[-1])
    initial[first] = (state * (~episode_start[0]).to(state.dtype).unsqueeze(-1))[row_b[first]]
    if isinstance(module, torch.nn.LSTM):
        hx = (initial[:, :size].unsqueeze(0).contiguous(), initial[:, size:].unsqueeze(0).contiguous())
    else:
        hx = initial.unsqueeze(0)
    out, _ = module(padded, hx)
    back = (step - row_t[row_of]) * rows + row_of  # (t, b) -> flat (position in its row, row)
    return out.reshape(steps * rows, size)[back.reshape(-1)].view(steps, batch, size)
