#!/usr/bin/env python3
"""LLM speed against llama.cpp's llama-bench, alternated test by test.

This machine's speed flips between phases seconds apart, so whole tables run one after the
other can compare the two programs in different phases. Here every cell (pp512 and tg128 on
each thread count) is one full `tessera bench` run (-r repetitions) next to the same
`llama-bench` run, the order swapped every other round, for --rounds rounds. Prints, per cell,
the medians over the rounds of both programs' average tokens/s, their ratio and each round's
ratio. Python's standard library only.

  cargo build --release -p tessera-cli
  dev/bench-llm-pairs.py --tessera target/release/tessera --llama-bench PATH/llama-bench \
      -m SmolLM2-135M-Instruct.Q4_1.gguf [--threads 1,2] [--rounds 3] [-r 5]
"""

import argparse
import json
import statistics
import subprocess
import sys


def avg_ts(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("["):])[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-r", "--reps", type=int, default=5)
    a = ap.parse_args()
    cells = [(test, int(t)) for t in a.threads.split(",") for test in ("pp512", "tg128")]
    res = {c: ([], []) for c in cells}
    for rnd in range(a.rounds):
        for test, th in cells:
            p, n = ("512", "0") if test == "pp512" else ("0", "128")
            common = ["-m", a.model, "-p", p, "-n", n, "-t", str(th), "-r", str(a.reps)]
            ours = lambda: avg_ts([a.tessera, "bench", *common, "--json"])
            theirs = lambda: avg_ts([a.llama_bench, *common, "-o", "json"])
            if rnd % 2 == 0:
                x, y = ours(), theirs()
            else:
                y, x = theirs(), ours()
            res[(test, th)][0].append(x)
            res[(test, th)][1].append(y)
            print(f"round {rnd + 1} {test} {th}t: {x:.1f} vs {y:.1f} t/s, {x / y:.2f}x",
                  file=sys.stderr, flush=True)
    print("| test | threads | tessera t/s | llama.cpp t/s | ratio | ratio per round |")
    print("|---|---|---|---|---|---|")
    for (test, th), (xs, ys) in res.items():
        mx, my = statistics.median(xs), statistics.median(ys)
        rounds = " / ".join(f"{x / y:.2f}×" for x, y in zip(xs, ys))
        print(f"| {test} | {th} | {mx:.1f} | {my:.1f} | {mx / my:.2f}× | {rounds} |")


if __name__ == "__main__":
    main()
