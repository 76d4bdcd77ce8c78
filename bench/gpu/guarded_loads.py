#!/usr/bin/env python3
"""Global loads under a branch, per kernel, read from PTX -- no GPU needed:
    python3 bench/gpu/guarded_loads.py src/backend/cuda/fp8_gemv.cu [--kernel SUBSTRING ...]
A load written `c ? load : 0` (or in an `if`) becomes `@%p bra` around the load, and each branch's join
waits for its load: a batch of such loads costs one memory round trip per load, not one for the batch
(bench/gpu/probe_split_sum.cu, bench/RESULTS.md). This compiles the file to PTX with
line info and lists, per kernel, the branches that skip global loads as "N branches x L loads at
file:line". One branch over a whole batch (L large, N small) is harmless; many branches of one or two
loads each in a hot loop are candidates.
Caveat (measured, bench/RESULTS.md, twenty-fourth session): ptxas if-converts most such branches into
predicated loads, so these PTX counts overstate the problem -- fp8_gemv's 35 branches were already 32
predicated LDGs in SASS. Confirm with `cuobjdump -sass` (on the device) before changing a kernel."""
import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = re.compile(r"^\s*(\.visible\s+)?\.entry\s+(\S+)\(")
BRANCH = re.compile(r"\s*@!?%p\d+ bra(\.uni)?\s+(\$\S+);")
LOC = re.compile(r"\s*\.loc\s+(\d+)\s+(\d+)")
FILE = re.compile(r'\s*\.file\s+(\d+)\s+"([^"]+)"')
LOAD = re.compile(r"\bld\.global")
SCAN_LINES = 60  # how far past a branch to look for its skipped loads


def ptx_of(cu):
    nvcc = os.environ.get("CUDACXX", "/usr/local/cuda/bin/nvcc")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "k.ptx")
        cmd = [nvcc, "-DDEEPINFER_HAVE_CUDA=1", "-I", os.path.join(ROOT, "src"), "-I", os.path.join(ROOT, "include"),
               "-O3", "-std=c++20", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-lineinfo",
               "-ptx", cu, "-o", out]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit("guarded_loads: %s did not compile to PTX:\n%s" % (cu, run.stderr))
        return open(out).read().split("\n")


def guarded(lines):
    files = {m.group(1): m.group(2) for m in map(FILE.match, lines) if m}
    kernel, out = None, {}
    for i, line in enumerate(lines):
        m = ENTRY.match(line)
        if m:
            kernel = m.group(2)
            out[kernel] = collections.Counter()
            continue
        b = BRANCH.match(line) if kernel else None
        if not b:
            continue
        label, where, first, n = b.group(2), None, None, 0
        for nxt in lines[i + 1:i + 1 + SCAN_LINES]:
            if nxt.startswith(label + ":") or re.search(r"\bbra\b|\bret\b", nxt):
                break
            lm = LOC.match(nxt)
            if lm:
                where = "%s:%s" % (os.path.basename(files.get(lm.group(1), "?")), lm.group(2))
            if LOAD.search(nxt):
                n += 1
                first = first or where
        if n:
            out[kernel][(first or "?", n)] += 1
    return out


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    ap = argparse.ArgumentParser()
    ap.add_argument("cu", nargs="+")
    ap.add_argument("--kernel", action="append", default=[], help="only kernels whose name contains this")
    args = ap.parse_args()
    for cu in args.cu:
        for kernel, counts in guarded(ptx_of(cu)).items():
            name = subprocess.run(["c++filt", kernel], capture_output=True, text=True).stdout.strip()
            if not counts or (args.kernel and not any(k in name for k in args.kernel)):
                continue
            print(name[:140])
            for (where, loads), branches in sorted(counts.items()):
                print("  %4d branches x %2d loads at %s" % (branches, loads, where))
    return 0


if __name__ == "__main__":
    sys.exit(main())
