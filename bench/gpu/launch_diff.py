#!/usr/bin/env python3
"""Which kernel parameters change from one decode step to the next: reads a DEEPINFER_LAUNCH_LOG file (one line
per launch: name, grid, block, smem, lane, parameters in hex), splits it into steps at each embed launch, and
compares the last two steps launch by launch. A CUDA graph of the step replayed as is would need every parameter
that differs here to come from device memory instead (docs/decode_graph.md).

usage: launch_diff.py LOG [--steps A B]   (default: the last two steps)
"""
import argparse
import collections
import difflib


def read_steps(path):
    steps, cur = [], None
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if len(f) < 6:
            continue
        name, grid, block, smem, lane, params = f[0], f[1], f[2], f[3], f[4], f[5].split()
        if "embed_kernel" in name:
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((name, grid, block, smem, lane, params))
    return steps


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("di::cuda::", "").replace("di::", "")
    return name[:70]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--steps", nargs=2, type=int)
    a = ap.parse_args()
    steps = read_steps(a.log)
    if len(steps) < 2:
        raise SystemExit(f"{a.log}: fewer than two steps (found {len(steps)})")
    i, j = a.steps if a.steps else (len(steps) - 2, len(steps) - 1)
    s, t = steps[i], steps[j]
    print(f"{a.log}: {len(steps)} steps; comparing step {i} ({len(s)} launches) with step {j} ({len(t)} launches)")
    names_s, names_t = [k[0] for k in s], [k[0] for k in t]
    sm = difflib.SequenceMatcher(a=names_s, b=names_t, autojunk=False)
    same_seq = names_s == names_t
    print("same kernel sequence" if same_seq else "kernel sequences differ:")
    pairs = []
    for tag, a0, a1, b0, b1 in sm.get_opcodes():
        if tag == "equal":
            pairs += list(zip(range(a0, a1), range(b0, b1)))
        else:
            print(f"  {tag}: step {i} {[short(n) for n in names_s[a0:a1]]} -> step {j} {[short(n) for n in names_t[b0:b1]]}")
    changed = collections.Counter()
    total = collections.Counter()
    what = collections.defaultdict(collections.Counter)
    identical = 0
    for x, y in pairs:
        ks, kt = s[x], t[y]
        n = short(ks[0])
        total[n] += 1
        diffs = []
        if ks[1] != kt[1]:
            diffs.append("grid")
        if ks[3] != kt[3]:
            diffs.append("smem")
        for p, (u, v) in enumerate(zip(ks[5], kt[5])):
            if u != v:
                kind = "ptr" if len(u) == 16 and u.startswith("00007") and v.startswith("00007") else f"{len(u) // 2}B"
                diffs.append(f"p{p}:{kind}")
        if diffs:
            changed[n] += 1
            what[n][" ".join(diffs)] += 1
        else:
            identical += 1
    print(f"{len(pairs)} matched launches: {identical} identical, {len(pairs) - identical} with a changed parameter")
    for n, c in sorted(changed.items(), key=lambda kv: -kv[1]):
        print(f"  {c:4d} / {total[n]:4d}  {n}")
        for d, m in what[n].most_common(4):
            print(f"             {m:4d}x  {d}")


if __name__ == "__main__":
    main()
