// Tables of `deepinfer bench` records (bench_run.h): ceilings, decode steps, prefill, memory, and
// for each profiled pass its layers and its most expensive ops (aggregated over layers).
#pragma once

#include <cstdio>
#include <vector>

#include "runtime/bench_run.h"

namespace di {

void print_bench_tables(const std::vector<BenchRecord>& records, std::FILE* out, int top_ops = 15);

}  // namespace di
