#!/usr/bin/env python3
"""Serving benchmark: tessera serve against llama.cpp's llama-server, same model, same run.

For 1, 4 and 8 concurrent streaming clients (each sending --requests completions one after
another, temperature 0, --tokens tokens each), prints the aggregate generation tokens/s and
the p50/p99 time to first token; then the resident memory of `tessera serve` over 1,000
sequential requests. Python's standard library only.

  cargo build --release -p tessera-cli
  dev/bench-serve.py --tessera target/release/tessera --llama-server PATH/llama-server \
      -m SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import http.client
import json
import os
import subprocess
import threading
import time


def wait_healthy(port, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not become healthy")


def stream_one(port, prompt, n_tokens):
    """Returns (time to first token, completion tokens, seconds)."""
    body = json.dumps({"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    ttft, chunks, usage = None, 0, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]["completion_tokens"]
        for ch in ev.get("choices", []):
            if ch.get("text"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    c.close()
    return ttft or 0.0, usage if usage is not None else chunks, time.perf_counter() - t0


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def load(port, clients, requests, n_tokens):
    ttfts, tokens, lock = [], [0], threading.Lock()

    def client(ci):
        for k in range(requests):
            prompt = f"Story {ci * 1000 + k}: once upon a time, in a small village by the sea, there lived"
            t, n, _ = stream_one(port, prompt, n_tokens)
            with lock:
                ttfts.append(t)
                tokens[0] += n

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    dt = time.perf_counter() - t0
    return tokens[0] / dt, pct(ttfts, 50) * 1000, pct(ttfts, 99) * 1000, tokens[0]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--llama-server")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx-per-slot", type=int, default=512)
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--memory-requests", type=int, default=1000)
    a = ap.parse_args()
    ctx = str(a.parallel * a.ctx_per_slot)
    servers = [("tessera", [a.tessera, "serve", "-m", a.model, "-t", str(a.threads), "-c", ctx,
                            "--parallel", str(a.parallel), "--port", "18180"], 18180)]
    if a.llama_server:
        servers.append(("llama-server", [a.llama_server, "-m", a.model, "-t", str(a.threads), "-c", ctx,
                                         "-np", str(a.parallel), "--port", "18181", "--no-webui"], 18181))
    procs = {}
    try:
        for name, cmd, port in servers:
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_healthy(port, procs[name])
            stream_one(port, "warm up", 4)
        print(f"model {os.path.basename(a.model)}, {a.threads} threads, {a.parallel} slots of {a.ctx_per_slot}, "
              f"{a.requests} requests per client, {a.tokens} tokens each, temperature 0")
        print("| clients | server | gen tokens/s | TTFT p50 ms | TTFT p99 ms | tokens |")
        print("|---|---|---|---|---|---|")
        results = {}
        for c in [int(x) for x in a.clients.split(",")]:
            for name, _, port in servers:
                tps, p50, p99, n = load(port, c, a.requests, a.tokens)
                results[(c, name)] = (tps, p99)
                print(f"| {c} | {name} | {tps:.1f} | {p50:.0f} | {p99:.0f} | {n} |", flush=True)
        if a.llama_server:
            for c in [int(x) for x in a.clients.split(",")]:
                t, l = results[(c, "tessera")], results[(c, "llama-server")]
                print(f"clients {c}: throughput {t[0] / l[0]:.2f}x llama-server, p99 TTFT {t[1] / l[1]:.2f}x")
        if a.memory_requests:
            pid, port = procs["tessera"].pid, servers[0][2]
            marks = []
            for i in range(a.memory_requests):
                stream_one(port, f"Request number {i} says", 4)
                if i in (0, 99, a.memory_requests // 2 - 1, a.memory_requests - 1):
                    marks.append((i + 1, rss_kb(pid) / 1024))
            print("tessera serve RSS over sequential requests: " +
                  ", ".join(f"after {i}: {m:.1f} MiB" for i, m in marks))
    finally:
        for p in procs.values():
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
