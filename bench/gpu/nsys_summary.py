#!/usr/bin/env python3
"""Summarises bench/gpu/nsys_step.sh's CSV (nsys cuda_gpu_trace): the step's span, its kernel time,
the time no kernel ran (gaps), the gaps by the kernel that followed them, and the timeline between
two kernels (--from / --count) to read one layer."""
import argparse
import collections
import csv
import re


def short(name):
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"<.*", "", name)
    return name.replace("di::", "").replace("cuda::", "").replace("attn::", "").replace("(anonymous namespace)::", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--from", dest="first", type=int, default=-1)
    ap.add_argument("--count", type=int, default=60)
    a = ap.parse_args()
    rows = [r for r in csv.DictReader(open(a.csv)) if r.get("Grid X") not in (None, "")]
    ev = sorted((int(r["Start (ns)"]), int(r["Duration (ns)"]), short(r["Name"]), r.get("Strm", "")) for r in rows)
    if not ev:
        print("no kernels")
        return
    t0, t1 = ev[0][0], max(s + d for s, d, _, _ in ev)
    busy_end, covered, gaps = t0, 0, collections.defaultdict(lambda: [0, 0])
    for s, d, name, _ in ev:  # union of kernel intervals; a gap is charged to the kernel that ends it
        if s > busy_end:
            g = gaps[name]
            g[0] += 1
            g[1] += s - busy_end
        covered += max(0, s + d - max(s, busy_end))
        busy_end = max(busy_end, s + d)
    span = t1 - t0
    print(f"{len(ev)} kernels, span {span / 1e3:.1f} us, some kernel running {covered / 1e3:.1f} us, "
          f"none {(span - covered) / 1e3:.1f} us; sum of durations {sum(d for _, d, _, _ in ev) / 1e3:.1f} us")
    print("gaps by the kernel after them:")
    for name, (n, g) in sorted(gaps.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"  {g / 1e3:9.1f} us {n:5d} x {g / n / 1e3:6.2f} us  {name[:90]}")
    by = collections.defaultdict(lambda: [0, 0])
    for _, d, name, _ in ev:
        by[name][0] += 1
        by[name][1] += d
    print("kernel time by name:")
    for name, (n, d) in sorted(by.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {d / 1e3:9.1f} us {n:5d} x {d / n / 1e3:6.2f} us  {name[:90]}")
    if a.first >= 0:
        prev_end = None
        for i, (s, d, name, strm) in enumerate(ev[a.first:a.first + a.count]):
            gap = "" if prev_end is None else f"{(s - prev_end) / 1e3:+7.2f}"
            print(f"{a.first + i:5d} {(s - t0) / 1e3:9.2f} {d / 1e3:8.2f} us {gap:>8} s{strm:>3} {name[:80]}")
            prev_end = s + d


if __name__ == "__main__":
    main()
