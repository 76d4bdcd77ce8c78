// The main / side stream switch of the CUDA backend (side_stream.cuh).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_memory.cuh"
#include "backend/cuda/side_stream.cuh"
#include "core/env_switch.h"

namespace di::cuda {
namespace {

// One engine thread issues all device work, so the state is plain (the block cache, which other
// threads may reach by freeing tensors, locks its own).
struct Streams {
  static constexpr int kMarks = 16;  // marks in use at once (a layer takes one or two)
  cudaStream_t main = nullptr;  // the legacy default stream, or a capture's stream (set_main_stream)
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, done = nullptr;
  cudaEvent_t marks[kMarks]{};
  int next_mark = 0;  // marks issued (mark m uses marks[m % kMarks])
  bool on_side = false;
  bool pending = false;
};

Streams& streams() {
  static Streams* s = new Streams();  // never destroyed: tensors may be freed after static destructors
  return *s;
}

bool side_enabled() {
  static const bool on = env_switch_on("DEEPINFER_SIDE_STREAM");
  return on;
}

void create(Streams& s) {
  if (s.side) return;
  // non-blocking: the legacy default stream does not wait for it, nor it for the default stream
  DI_CUDA_CHECK(cudaStreamCreateWithFlags(&s.side, cudaStreamNonBlocking));
  DI_CUDA_CHECK(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
  DI_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  for (cudaEvent_t& e : s.marks) DI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

}  // namespace

cudaStream_t current_stream() { return streams().on_side ? streams().side : streams().main; }

void set_main_stream(cudaStream_t stream) { streams().main = stream; }

int stream_lane() { return streams().on_side ? 1 : 0; }

void side_begin() {
  Streams& s = streams();
  DI_CHECK_MSG(!s.on_side, "side_begin inside a side region");
  if (!side_enabled()) return;
  create(s);
  DI_CUDA_CHECK(cudaEventRecord(s.fork, s.main));
  DI_CUDA_CHECK(cudaStreamWaitEvent(s.side, s.fork, 0));
  s.on_side = true;
  s.pending = true;
  defer_block_releases(true);
}

void side_end() { streams().on_side = false; }

void side_join() {
  Streams& s = streams();
  DI_CHECK_MSG(!s.on_side, "side_join inside a side region");
  if (!s.pending) return;
  DI_CUDA_CHECK(cudaEventRecord(s.done, s.side));
  DI_CUDA_CHECK(cudaStreamWaitEvent(s.main, s.done, 0));
  s.pending = false;
  defer_block_releases(false);  // every deferred block is now ordered behind the main stream
}

int side_mark() {
  Streams& s = streams();
  if (!s.pending) return -1;  // nothing to wait for (inside a side region: the side stream is off)
  const int m = s.next_mark++;
  DI_CUDA_CHECK(cudaEventRecord(s.marks[m % Streams::kMarks], s.side));
  return m;
}

void side_wait(int mark) {
  Streams& s = streams();
  DI_CHECK_MSG(!s.on_side, "side_wait inside a side region");
  if (mark < 0 || !s.pending) return;  // nothing marked, or joined since
  DI_CHECK_MSG(mark < s.next_mark && s.next_mark - mark <= Streams::kMarks, "side_wait: stale mark");
  DI_CUDA_CHECK(cudaStreamWaitEvent(s.main, s.marks[mark % Streams::kMarks], 0));
}

}  // namespace di::cuda
