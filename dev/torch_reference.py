#!/usr/bin/env python3
"""PyTorch reference for Tessera's GPT-2 training test (crates/tessera-train/tests/torch_parity.rs).

A tiny GPT-2 (2 layers, 64 dims, 4 heads, context 32, byte-level vocabulary of 257) written
out by hand in PyTorch, from initial weights given by an integer formula that the Rust test
computes identically (so no weights are stored). It records, in float64:
  - the logits and the mean cross-entropy loss of one batch of 2 samples,
  - the gradient of the loss w.r.t. every parameter,
  - the losses of 10 AdamW steps on that batch.
Output: crates/tessera-train/tests/data/gpt2_tiny.json (+ .bin, little-endian f32 arrays).

Run: python3 dev/torch_reference.py   (needs torch; CPU is enough)
"""
import json, math, os, struct, sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
V, CTX, E, H, L = 257, 32, 64, 4, 2
B = 2
HD = E // H
EPS = 1e-5
TEXT = b"O Romeo, Romeo! wherefore art thou Romeo? Deny thy father, and refuse"
LR, BETA1, BETA2, ADAM_EPS, WD, STEPS = 1e-3, 0.9, 0.999, 1e-8, 0.01, 10


def param_specs():
    """Names and ggml shapes [in, out, ...] in the order Gpt2Config::params() lists them."""
    v = [("token_embd.weight", [E, V]), ("position_embd.weight", [E, CTX])]
    for l in range(L):
        for n, s in [("attn_norm.weight", [E]), ("attn_norm.bias", [E]),
                     ("attn_qkv.weight", [E, 3 * E]), ("attn_qkv.bias", [3 * E]),
                     ("attn_output.weight", [E, E]), ("attn_output.bias", [E]),
                     ("ffn_norm.weight", [E]), ("ffn_norm.bias", [E]),
                     ("ffn_up.weight", [E, 4 * E]), ("ffn_up.bias", [4 * E]),
                     ("ffn_down.weight", [4 * E, E]), ("ffn_down.bias", [E])]:
            v.append((f"blk.{l}.{n}", s))
    v += [("output_norm.weight", [E]), ("output_norm.bias", [E])]
    return v


def init_value(name, j, i):
    """Element i of param j: the same integer formula as the Rust test, in float64, then f32."""
    if name.endswith(".bias"):
        x = ((i * 31 + j * 17) % 21 - 10) / 1000.0
    elif "norm.weight" in name:
        x = 1.0 + ((i * 13 + j) % 11 - 5) / 100.0
    else:
        std = 0.02 / math.sqrt(2 * L) if name.endswith(("attn_output.weight", "ffn_down.weight")) else 0.02
        x = ((i * 7919 + j * 104729 + 12345) % 2001 - 1000) / 1000.0 * std * math.sqrt(3.0)
    return struct.unpack("<f", struct.pack("<f", x))[0]


def make_params():
    ps = {}
    for j, (name, ne) in enumerate(param_specs()):
        n = math.prod(ne)
        vals = torch.tensor([init_value(name, j, i) for i in range(n)])
        # ggml [in, out] is row-major (out, in)
        ps[name] = vals.reshape(list(reversed(ne))).clone().requires_grad_(True)
    return ps


def forward(p, tokens):
    b, t = tokens.shape
    x = p["token_embd.weight"][tokens] + p["position_embd.weight"][:t]
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    for l in range(L):
        w = lambda n: p[f"blk.{l}.{n}"]
        h = F.layer_norm(x, (E,), w("attn_norm.weight"), w("attn_norm.bias"), EPS)
        qkv = h @ w("attn_qkv.weight").T + w("attn_qkv.bias")
        q, k, v = qkv.split(E, dim=-1)
        q, k, v = [z.reshape(b, t, H, HD).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(b, t, E)
        x = x + o @ w("attn_output.weight").T + w("attn_output.bias")
        h = F.layer_norm(x, (E,), w("ffn_norm.weight"), w("ffn_norm.bias"), EPS)
        u = F.gelu(h @ w("ffn_up.weight").T + w("ffn_up.bias"), approximate="tanh")
        x = x + u @ w("ffn_down.weight").T + w("ffn_down.bias")
    x = F.layer_norm(x, (E,), p["output_norm.weight"], p["output_norm.bias"], EPS)
    return x @ p["token_embd.weight"].T


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "tessera-train", "tests", "data")
    toks = list(TEXT[: B * CTX + 1])
    inp = torch.tensor([toks[s * CTX:(s + 1) * CTX] for s in range(B)])
    tgt = torch.tensor([toks[s * CTX + 1:(s + 1) * CTX + 1] for s in range(B)])
    p = make_params()
    logits = forward(p, inp)
    loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    loss.backward()
    blob = bytearray()
    index = {}

    def put(key, t):
        flat = t.detach().reshape(-1).tolist()
        index[key] = {"offset": len(blob) // 4, "len": len(flat)}
        blob.extend(struct.pack(f"<{len(flat)}f", *flat))

    put("logits", logits)
    for name, _ in param_specs():
        put("grad." + name, p[name].grad)
    # 10 AdamW steps on the same batch, from the same initial weights
    p = make_params()
    opt = torch.optim.AdamW(list(p.values()), lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS, weight_decay=WD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        l = F.cross_entropy(forward(p, inp).reshape(-1, V), tgt.reshape(-1))
        losses.append(l.item())
        l.backward()
        opt.step()
    meta = {
        "generator": "dev/torch_reference.py (PyTorch %s, float64)" % torch.__version__,
        "config": {"n_vocab": V, "n_ctx": CTX, "n_embd": E, "n_head": H, "n_layer": L, "batch": B},
        "tokens": toks,
        "loss": loss.item(),
        "adamw": {"lr": LR, "beta1": BETA1, "beta2": BETA2, "eps": ADAM_EPS, "weight_decay": WD, "losses": losses},
        "arrays": index,
    }
    with open(os.path.join(out_dir, "gpt2_tiny.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(out_dir, "gpt2_tiny.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("loss", loss.item(), "adamw losses", losses, "bytes", len(blob), file=sys.stderr)


if __name__ == "__main__":
    main()
