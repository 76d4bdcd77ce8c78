#!/usr/bin/env python3
"""Summarises `deepinfer bench --kernel-trace FILE` (one decode step's kernels as the device ran them):
per (context, batch) the step's span, and per stream the time each kernel name adds to its stream --
its end minus the previous kernel's end on that stream (under PDL a kernel starts before the one it
waits for ends, so durations overlap) -- beside the kernels' own durations; --list prints the kernels
in start order with that interval; --waits lists where a stream stood idle: a kernel that started after the
one before it on its stream had ended (under PDL a kernel normally starts before that) waited for something
else -- another stream's kernel that ended just before it (a join), or the host; --frontier sums, per kernel name,
how far each kernel moved the step's latest end across all streams (the sum is the span): a proxy for each
kernel's share of the critical path, where the per-stream intervals also count side work that overlapped."""
import argparse
import collections
import csv
import re
import signal


def short(name):
    """The kernel's name and template arguments, without namespaces, `void` or parameters."""
    n = name.replace("(anonymous namespace)::", "").replace("di::", "").replace("cuda::", "")
    n = re.sub(r"^void ", "", n)
    m = re.match(r"[\w:]+(<[^()]*>)?", n)
    return m.group(0) if m else n[:60]


def print_waits(rows, min_gap_us=1.0):
    """Per stream: gaps of >= min_gap_us between a kernel's predecessor's end and its start, summed by
    the kernel and by what ended last on another stream in the gap (a join), else the host."""
    by_stream = collections.defaultdict(list)
    for r in rows:
        by_stream[r["stream"]].append(r)
    for st, ks in by_stream.items():
        others = sorted((float(r["end_us"]), short(r["name"])) for r in rows if r["stream"] != st)
        waits = collections.defaultdict(lambda: [0, 0.0])
        for prev, k in zip(ks, ks[1:]):
            e, s = float(prev["end_us"]), float(k["start_us"])
            if s - e < min_gap_us:
                continue
            ended = [name for t, name in others if e < t <= s]
            cause = "after " + ended[-1] if ended else "host"
            w = waits[(short(k["name"]), cause)]
            w[0] += 1
            w[1] += s - e
        total = sum(v[1] for v in waits.values())
        print(f"  stream {st}: idle {total:.1f} us in gaps >= {min_gap_us:g} us (us, count, kernel, what ended the gap)")
        for (name, cause), (c, us) in sorted(waits.items(), key=lambda x: -x[1][1])[:12]:
            print(f"    {us:8.1f} {c:4d}x  {name}  <- {cause}")


def print_frontier(rows, top):
    """Kernels in start order: each moves the latest end seen so far by max(0, its end - that end); summed by name."""
    frontier = float(rows[0]["start_us"])
    moved = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        e = float(r["end_us"])
        m = moved[short(r["name"])]
        m[0] += 1
        m[1] += max(0.0, e - frontier)
        frontier = max(frontier, e)
    total = sum(v[1] for v in moved.values())
    print(f"  frontier: {total:.1f} us moved (us, count, kernel)")
    for name, (c, us) in sorted(moved.items(), key=lambda x: -x[1][1])[:top]:
        print(f"    {us:8.1f} {c:4d}x  {name}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--list", action="store_true", help="every kernel in start order")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--waits", action="store_true", help="idle gaps per stream, by what ended them")
    ap.add_argument("--frontier", action="store_true", help="per kernel, how far it moved the step's latest end")
    a = ap.parse_args()
    steps = collections.OrderedDict()
    for r in csv.DictReader(open(a.csv)):
        steps.setdefault((r["context"], r["batch"]), []).append(r)
    for (ctx, batch), rows in steps.items():
        rows.sort(key=lambda r: float(r["start_us"]))
        span = max(float(r["end_us"]) for r in rows) - float(rows[0]["start_us"])
        per_stream = collections.Counter(r["stream"] for r in rows)
        print(f"context {ctx}, batch {batch}: {len(rows)} kernels, span {span:.1f} us, streams {dict(per_stream)}")
        last_end = {}
        by = {}
        for r in rows:
            s, e, st = float(r["start_us"]), float(r["end_us"]), r["stream"]
            iv = e - last_end.get(st, s)
            last_end[st] = e
            r["interval"] = iv
            b = by.setdefault((st, short(r["name"])), [0, 0.0, 0.0])
            b[0] += 1
            b[1] += iv
            b[2] += e - s
        for st in per_stream:
            total = sum(v[1] for (s2, _), v in by.items() if s2 == st)
            print(f"  stream {st}: intervals sum {total:.1f} us (calls, interval us, duration us)")
            items = sorted(((k[1], v) for k, v in by.items() if k[0] == st), key=lambda x: -x[1][1])
            for n, (c, iv, du) in items[: a.top]:
                print(f"    {iv:8.1f} {du:8.1f} {c:4d}x  {n}")
        if a.waits:
            print_waits(rows)
        if a.frontier:
            print_frontier(rows, a.top)
        if a.list:
            for r in rows:
                print(f"  {float(r['start_us']):9.2f} {float(r['end_us']) - float(r['start_us']):7.2f} "
                      f"+{r['interval']:7.2f}  s{r['stream']:>3}  {short(r['name'])} ({r['ctas']} CTAs)")


if __name__ == "__main__":
    main()
