#!/usr/bin/python3
"""Generate PyTorch reference vectors for ferry's numerics tests.

Run with Debian's PyTorch (python3-torch, 1.13, CPU):
    /usr/bin/python3 scripts/gen_torch_vectors.py [OUTDIR]
Writes OUTDIR/torch_nn.json (layers: forward values and gradients) and
OUTDIR/torch_optim.json (optimizer trajectories, dense and row-sparse); OUTDIR defaults
to the repository's tests/data/. Everything is computed in float64 from fixed seeds,
so reruns on the same machine are byte-identical. The schema is in tests/data/README.md.
The script stops with an AssertionError if a cross-check fails (hand-written LSTM cell
vs nn.LSTM, lazy reference optimizers vs torch's dense and sparse ones).
"""
import json
import math
import os
import sys

import torch

DT = torch.float64
SEED = 1234
STEPS = 6


def enc(t):
    """Tensor -> {"shape": [...], "data": [...]} (row-major); 0-d -> plain number."""
    t = t.detach()
    if t.dim() == 0:
        return t.item()
    data = t.reshape(-1).tolist()
    return {"shape": list(t.shape), "data": data}


def randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=DT) * scale


def meta(what):
    return {
        "generator": "scripts/gen_torch_vectors.py",
        "what": what,
        "torch": torch.__version__,
        "dtype": "float64",
        "seed": SEED,
        "layout": "every tensor is {shape, data}; data is row-major (C order), last index "
                  "fastest; scalars are plain numbers; integer tensors hold exact integers",
    }


# ---------------------------------------------------------------- torch_nn.json
def case_linear(gen):
    x = randn(gen, 5, 3).requires_grad_()
    lin = torch.nn.Linear(3, 4).to(DT)
    with torch.no_grad():
        lin.weight.copy_(randn(gen, 4, 3, scale=0.5))
        lin.bias.copy_(randn(gen, 4, scale=0.5))
    R = randn(gen, 5, 4)
    y = lin(x)
    loss = (y * R).sum()
    loss.backward()
    return {
        "name": "linear", "in_features": 3, "out_features": 4, "batch": 5,
        "loss_definition": "y = x @ weight^T + bias; loss = sum(y * R)",
        "inputs": {"x": enc(x)},
        "params": {"weight": enc(lin.weight), "bias": enc(lin.bias)},
        "upstream": {"R": enc(R)},
        "output": enc(y), "loss": loss.item(),
        "grads": {"weight": enc(lin.weight.grad), "bias": enc(lin.bias.grad)},
        "grad_inputs": {"x": enc(x.grad)},
    }


def case_embedding(gen):
    emb = torch.nn.Embedding(10, 3).to(DT)
    with torch.no_grad():
        emb.weight.copy_(randn(gen, 10, 3))
    ids = torch.tensor([3, 7, 3, 0, 9, 7, 3], dtype=torch.long)  # repeats: 3 x3, 7 x2
    R = randn(gen, 7, 3)
    out = emb(ids)
    loss = (out * R).sum()
    loss.backward()
    return {
        "name": "embedding", "num_embeddings": 10, "embedding_dim": 3, "n_ids": 7,
        "loss_definition": "out[k] = weight[ids[k]]; loss = sum(out * R); grads.weight is "
                           "dense (rows never looked up are zero, repeated ids accumulate)",
        "inputs": {"ids": enc(ids)},
        "params": {"weight": enc(emb.weight)},
        "upstream": {"R": enc(R)},
        "output": enc(out), "loss": loss.item(),
        "grads": {"weight": enc(emb.weight.grad)},
    }


def xent_logits(gen):
    logits = randn(gen, 6, 5, scale=2.0)
    logits[3] += 100.0  # exp(100) overflows float32: catches a softmax without max-shift
    return logits


def case_xent(logits, reduction):
    """Both reductions use the same logits and targets, so loss_sum == 6 * loss_mean."""
    logits = logits.clone().requires_grad_()
    targets = torch.tensor([1, 0, 4, 2, 4, 3], dtype=torch.long)
    loss = torch.nn.functional.cross_entropy(logits, targets, reduction=reduction)
    loss.backward()
    return {
        "name": "xent_" + reduction, "batch": 6, "classes": 5, "reduction": reduction,
        "loss_definition": "loss_i = logsumexp(logits[i]) - logits[i, targets[i]]; loss = "
                           + ("mean_i loss_i" if reduction == "mean" else "sum_i loss_i")
                           + "; row 3 of logits is shifted by +100",
        "inputs": {"logits": enc(logits), "targets": enc(targets)},
        "loss": loss.item(),
        "grad_inputs": {"logits": enc(logits.grad)},
    }


def lstm_by_hand(lstm, x, h0, c0):
    """Plain float64 LSTM (gate order i, f, g, o); returns output, h_n, c_n, preacts."""
    H, nl = lstm.hidden_size, lstm.num_layers
    inp, hs, cs, pre = x, [], [], {}
    for k in range(nl):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{k}"), getattr(lstm, f"weight_hh_l{k}")
        b = getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}")
        h, c, outs, zs = h0[k], c0[k], [], []
        for t in range(x.shape[0]):
            z = inp[t] @ w_ih.t() + h @ w_hh.t() + b  # (N, 4H): i, f, g, o
            i, f = torch.sigmoid(z[:, :H]), torch.sigmoid(z[:, H:2 * H])
            g, o = torch.tanh(z[:, 2 * H:3 * H]), torch.sigmoid(z[:, 3 * H:])
            c = f * c + i * g
            h = o * torch.tanh(c)
            outs.append(h)
            zs.append(z)
        inp = torch.stack(outs)
        hs.append(h)
        cs.append(c)
        pre[f"l{k}"] = enc(torch.stack(zs))
    return inp, torch.stack(hs), torch.stack(cs), pre


def case_lstm(gen, name, I, H, nl, L, N):
    torch.manual_seed(SEED + nl * 100 + H)  # nn.LSTM's default init draws from the global RNG
    lstm = torch.nn.LSTM(input_size=I, hidden_size=H, num_layers=nl).to(DT)
    x = randn(gen, L, N, I).requires_grad_()
    h0 = randn(gen, nl, N, H, scale=0.5).requires_grad_()
    c0 = randn(gen, nl, N, H, scale=0.5).requires_grad_()
    R, Rh, Rc = randn(gen, L, N, H), randn(gen, nl, N, H), randn(gen, nl, N, H)
    out, (h_n, c_n) = lstm(x, (h0, c0))
    loss = (out * R).sum() + (h_n * Rh).sum() + (c_n * Rc).sum()
    loss.backward()
    with torch.no_grad():
        o2, h2, c2, pre = lstm_by_hand(lstm, x, h0, c0)
    for a, b in ((out, o2), (h_n, h2), (c_n, c2)):
        assert torch.allclose(a, b, rtol=0, atol=1e-13), "hand-written LSTM != nn.LSTM"
    return {
        "name": name, "input_size": I, "hidden_size": H, "num_layers": nl, "seq_len": L,
        "batch": N, "batch_first": False, "gate_order": "i,f,g,o",
        "loss_definition": "loss = sum(output * R) + sum(h_n * Rh) + sum(c_n * Rc)",
        "inputs": {"x": enc(x), "h0": enc(h0), "c0": enc(c0)},
        "params": {n: enc(p) for n, p in lstm.named_parameters()},
        "upstream": {"R": enc(R), "Rh": enc(Rh), "Rc": enc(Rc)},
        "gates_preact": pre,
        "output": enc(out), "h_n": enc(h_n), "c_n": enc(c_n), "loss": loss.item(),
        "grads": {n: enc(p.grad) for n, p in lstm.named_parameters()},
        "grad_inputs": {"x": enc(x.grad), "h0": enc(h0.grad), "c0": enc(c0.grad)},
    }


def build_nn():
    gen = torch.Generator().manual_seed(SEED)
    doc = {"meta": meta("layer forward values and gradients (torch.nn, float64)")}
    doc["linear"] = case_linear(gen)
    doc["embedding"] = case_embedding(gen)
    logits = xent_logits(gen)
    doc["xent_mean"] = case_xent(logits, "mean")
    doc["xent_sum"] = case_xent(logits, "sum")
    doc["lstm_2layer"] = case_lstm(gen, "lstm_2layer", 3, 4, 2, 5, 2)
    doc["lstm_1layer_big"] = case_lstm(gen, "lstm_1layer_big", 8, 16, 1, 7, 3)
    return doc


# ---------------------------------------------------------------- torch_optim.json
DENSE_CONFIGS = [  # (name, torch class, explicit kwargs)
    ("sgd", "SGD", dict(lr=0.1)),
    ("sgd_momentum_wd", "SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("sgd_momentum_dampening", "SGD", dict(lr=0.1, momentum=0.9, dampening=0.1)),
    ("sgd_nesterov", "SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("adagrad", "Adagrad", dict(lr=0.1)),
    ("adagrad_full", "Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.01,
                                     initial_accumulator_value=0.1)),
    ("adadelta", "Adadelta", dict(lr=1.0)),
    ("adadelta_full", "Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.01)),
    ("adam", "Adam", dict(lr=0.01)),
    ("adam_full", "Adam", dict(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.01)),
    ("adamw", "AdamW", dict(lr=0.01)),
    ("adamw_wd", "AdamW", dict(lr=0.01, weight_decay=0.1)),
]
SPARSE_ROWS = [[0, 2], [2, 5], [1], [0, 2, 4], [5], [2, 3]]  # rows touched at steps 1..6
SPARSE_TORCH = [  # torch optimizers that accept a sparse gradient
    ("sparse_adam", "SparseAdam", dict(lr=0.01)),
    ("sparse_adagrad", "Adagrad", dict(lr=0.1)),
    ("sparse_sgd", "SGD", dict(lr=0.1)),
]
SPARSE_REF = [  # lazy variants torch lacks, computed by LazyRef below
    ("lazy_sgd_momentum", "SGD", dict(lr=0.1, momentum=0.9)),
    ("lazy_adadelta", "Adadelta", dict(lr=1.0)),
    ("lazy_adamw", "AdamW", dict(lr=0.01)),
]
REF_SOURCE = "reference implementation in gen_torch_vectors.py"
IMPL_KEYS = ("foreach", "capturable", "differentiable", "fused")  # not hyper-parameters


def hparams(cls, kw):
    """All hyper-parameters with torch's defaults filled in (betas as a list)."""
    p = torch.nn.Parameter(torch.zeros(1, dtype=DT))
    d = getattr(torch.optim, cls)([p], **kw).defaults
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in d.items() if k not in IMPL_KEYS}


class LazyRef:
    """Row-lazy float64 optimizer: at global step t the dense torch update rule is applied
    to the touched rows only; untouched rows and their state do not change. The Adam step
    count is the global t (as in torch.optim.SparseAdam). SGD's momentum buffer of a row
    starts as that row's first (weight-decayed) gradient, as torch's dense SGD does on
    step 1. kind "SparseAdam" follows torch's sparse_adam formula instead of Adam's."""

    def __init__(self, cls, hp, shape):
        self.cls, self.hp = cls, hp
        z = lambda v=0.0: torch.full(shape, v, dtype=DT)  # noqa: E731
        init = hp.get("initial_accumulator_value", 0.0)
        self.s1, self.s2 = z(init), z()  # first / second slot (meaning depends on cls)
        self.seen = torch.zeros(shape[0], dtype=torch.bool)

    def step(self, p, t, rows, g):
        h, r = self.hp, torch.tensor(rows, dtype=torch.long)
        w = p[r]
        if h.get("weight_decay", 0) and self.cls != "AdamW":
            g = g + h["weight_decay"] * w
        s1, s2 = self.s1[r], self.s2[r]
        if self.cls == "SGD":
            if h["momentum"]:
                first = ~self.seen[r]
                s1 = torch.where(first[:, None], g, h["momentum"] * s1 + (1 - h["dampening"]) * g)
                g = g + h["momentum"] * s1 if h["nesterov"] else s1
            w = w - h["lr"] * g
        elif self.cls == "Adagrad":
            clr = h["lr"] / (1 + (t - 1) * h["lr_decay"])
            s1 = s1 + g * g
            w = w - clr * g / (s1.sqrt() + h["eps"])
        elif self.cls == "Adadelta":
            s1 = h["rho"] * s1 + (1 - h["rho"]) * g * g
            delta = (s2 + h["eps"]).sqrt() / (s1 + h["eps"]).sqrt() * g
            s2 = h["rho"] * s2 + (1 - h["rho"]) * delta * delta
            w = w - h["lr"] * delta
        else:  # Adam, AdamW, SparseAdam
            b1, b2 = h["betas"]
            if self.cls == "AdamW":
                w = w * (1 - h["lr"] * h["weight_decay"])
            s1 = b1 * s1 + (1 - b1) * g
            s2 = b2 * s2 + (1 - b2) * g * g
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            if self.cls == "SparseAdam":
                w = w - h["lr"] * math.sqrt(bc2) / bc1 * s1 / (s2.sqrt() + h["eps"])
            else:
                w = w - (h["lr"] / bc1) * s1 / (s2.sqrt() / math.sqrt(bc2) + h["eps"])
        self.s1[r], self.s2[r] = s1, s2
        self.seen[r] = True
        p = p.clone()
        p[r] = w
        return p


def run_torch(cls, kw, p0, grads, sparse_rows=None):
    p = torch.nn.Parameter(p0.clone())
    opt = getattr(torch.optim, cls)([p], **kw)
    traj = []
    for t, g in enumerate(grads):
        if sparse_rows is None:
            p.grad = g.clone()
        else:
            idx = torch.tensor([sparse_rows[t]], dtype=torch.long)
            p.grad = torch.sparse_coo_tensor(idx, g.clone(), p0.shape)
        opt.step()
        traj.append(p.detach().clone())
    return torch.stack(traj)


def run_ref(cls, hp, p0, grads, rows):
    ref, p, traj = LazyRef(cls, hp, p0.shape), p0.clone(), []
    for t, g in enumerate(grads):
        p = ref.step(p, t + 1, rows[t], g)
        traj.append(p)
    return torch.stack(traj)


def close(a, b):
    return torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def build_optim():
    gen = torch.Generator().manual_seed(SEED + 1)
    p0, grads = randn(gen, 4, 3), randn(gen, STEPS, 4, 3)
    dense = {"steps": STEPS, "p0": enc(p0), "grads": enc(grads), "configs": []}
    all_rows = [list(range(4))] * STEPS
    for name, cls, kw in DENSE_CONFIGS:
        hp = hparams(cls, kw)
        traj = run_torch(cls, kw, p0, grads)
        # The lazy reference with every row touched must reproduce torch's dense optimizer.
        assert close(traj, run_ref(cls, hp, p0, grads, all_rows)), name + ": reference != torch"
        dense["configs"].append({"name": name, "class": cls, "source": "torch.optim." + cls,
                                 "hparams": hp, "trajectory": enc(traj)})

    table0 = randn(gen, 6, 3)
    row_grads = [randn(gen, len(r), 3) for r in SPARSE_ROWS]
    dense_grads = torch.zeros(STEPS, 6, 3, dtype=DT)
    for t, r in enumerate(SPARSE_ROWS):
        dense_grads[t, r] = row_grads[t]
    sparse = {
        "steps": STEPS, "table0": enc(table0),
        "rows": [enc(torch.tensor(r, dtype=torch.long)) for r in SPARSE_ROWS],
        "row_grads": [enc(g) for g in row_grads], "dense_grads": enc(dense_grads),
        "semantics": "lazy: at global step t (1-based) the dense update rule is applied to the "
                     "touched rows only; untouched rows and their optimizer state are left "
                     "untouched; Adam-family bias correction uses the global t",
        "configs": [],
    }
    for name, cls, kw in SPARSE_TORCH:
        hp = hparams(cls, kw)
        traj = run_torch(cls, kw, table0, row_grads, SPARSE_ROWS)
        assert close(traj, run_ref(cls, hp, table0, row_grads, SPARSE_ROWS)), name
        sparse["configs"].append({"name": name, "class": cls, "source": "torch.optim." + cls,
                                  "hparams": hp, "trajectory": enc(traj)})
    for name, cls, kw in SPARSE_REF:
        hp = hparams(cls, kw)
        traj = run_ref(cls, hp, table0, row_grads, SPARSE_ROWS)
        sparse["configs"].append({"name": name, "class": cls, "source": REF_SOURCE,
                                  "hparams": hp, "trajectory": enc(traj)})
    return {"meta": meta("optimizer trajectories (torch.optim, float64)"),
            "dense": dense, "sparse": sparse}


def write(path, doc):
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n"
    assert len(text) < 1_000_000, path + " is over 1 MB"
    with open(path, "w") as fh:
        fh.write(text)
    print(f"wrote {path} {len(text)} bytes")


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "tests", "data")
    torch.set_num_threads(1)  # one reduction order, so reruns are byte-identical
    write(os.path.join(out, "torch_nn.json"), build_nn())
    write(os.path.join(out, "torch_optim.json"), build_optim())


if __name__ == "__main__":
    main()
