#include "parallel/thread_communicator.h"

#include <cstring>
#include <exception>
#include <thread>

#include "core/error.h"

namespace di::parallel {

ThreadGroup::ThreadGroup(int world_size) : posts(world_size), world_(world_size) {
  if (world_size < 1) throw Error("thread group: world size must be >= 1, got " + std::to_string(world_size));
}

void ThreadGroup::arrive_and_wait(bool starts_read) {
  std::unique_lock<std::mutex> lock(mu_);
  auto aborted = [&] {
    cv_.wait(lock, [&] { return reading_ == 0; });
    return Error("collective aborted: " + why_);
  };
  if (aborted_) throw aborted();
  const int64_t gen = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    if (starts_read) reading_ = world_;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) {
    --arrived_;
    throw aborted();
  }
}

void ThreadGroup::end_read() {
  std::lock_guard<std::mutex> lock(mu_);
  --reading_;
  cv_.notify_all();
}

void ThreadGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) why_ = why;
  aborted_ = true;
  cv_.notify_all();
}

namespace {

int64_t sum_before(const std::vector<int64_t>& counts, int end) {
  int64_t s = 0;
  for (int i = 0; i < end; ++i) s += counts[i];
  return s;
}

template <typename T>
void add_into(T* out, const void* in, int64_t count) {
  const T* src = static_cast<const T*>(in);
  for (int64_t i = 0; i < count; ++i) out[i] += src[i];
}

}  // namespace

void ThreadCommunicator::all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                      const std::vector<int64_t>& recv_counts, CommType type) {
  const int world = world_size();
  DI_CHECK(static_cast<int>(send_counts.size()) == world && static_cast<int>(recv_counts.size()) == world);
  const int64_t bytes = comm_type_bytes(type);
  group_.posts[rank_] = {send, &send_counts, nullptr};
  group_.arrive_and_wait(/*starts_read=*/true);
  std::string error;  // thrown only after the closing barrier: peers may be reading our buffer
  for (int p = 0; p < world; ++p) {
    const ThreadGroup::Post& peer = group_.posts[p];
    const int64_t n = (*peer.counts)[rank_];
    if (n != recv_counts[p]) {
      error = "all_to_all_v: rank " + std::to_string(rank_) + " expects " + std::to_string(recv_counts[p]) +
              " elements from rank " + std::to_string(p) + ", which sends " + std::to_string(n);
      continue;
    }
    if (n == 0) continue;
    const auto* src = static_cast<const uint8_t*>(peer.send) + sum_before(*peer.counts, rank_) * bytes;
    std::memcpy(static_cast<uint8_t*>(recv) + sum_before(recv_counts, p) * bytes, src, n * bytes);
  }
  group_.end_read();
  group_.arrive_and_wait();  // peers keep their send buffers until everyone has read them
  if (!error.empty()) throw Error(error);
}

void ThreadCommunicator::all_gather(const void* send, int64_t count, void* recv, CommType type) {
  const int64_t bytes = comm_type_bytes(type) * count;
  group_.posts[rank_] = {send, nullptr, nullptr};
  group_.arrive_and_wait(/*starts_read=*/true);
  for (int p = 0; p < world_size(); ++p)
    if (bytes > 0) std::memcpy(static_cast<uint8_t*>(recv) + p * bytes, group_.posts[p].send, bytes);
  group_.end_read();
  group_.arrive_and_wait();
}

void ThreadCommunicator::all_reduce_sum(void* data, int64_t count, CommType type) {
  const int64_t bytes = comm_type_bytes(type) * count;
  group_.posts[rank_] = {data, nullptr, data};
  group_.arrive_and_wait(/*starts_read=*/true);
  // Every rank adds the same inputs in rank order into its own temporary, so all agree bit for bit.
  std::vector<uint8_t> sum(static_cast<size_t>(bytes), 0);
  for (int p = 0; p < world_size(); ++p) {
    const void* in = group_.posts[p].send;
    switch (type) {
      case CommType::kF32: add_into(reinterpret_cast<float*>(sum.data()), in, count); break;
      case CommType::kI32: add_into(reinterpret_cast<int32_t*>(sum.data()), in, count); break;
      case CommType::kI64: add_into(reinterpret_cast<int64_t*>(sum.data()), in, count); break;
      case CommType::kU8: add_into(sum.data(), in, count); break;
    }
  }
  group_.end_read();
  group_.arrive_and_wait();  // all inputs read before anyone overwrites its own
  if (bytes > 0) std::memcpy(data, sum.data(), static_cast<size_t>(bytes));
}

std::vector<int64_t> ThreadCommunicator::all_gather_host(const std::vector<int64_t>& mine) {
  // Sizes first: ranks may offer different lengths only if every rank knows them; require equal.
  int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(world_size());
  all_gather(&n, 1, sizes.data(), CommType::kI64);
  for (int p = 0; p < world_size(); ++p)
    if (sizes[p] != n)
      throw Error("all_gather_host: rank " + std::to_string(p) + " offers " + std::to_string(sizes[p]) +
                  " values, rank " + std::to_string(rank_) + " " + std::to_string(n));
  std::vector<int64_t> all(static_cast<size_t>(n * world_size()));
  all_gather(mine.data(), n, all.data(), CommType::kI64);
  return all;
}

void run_ranks(int world_size, const std::function<void(Communicator&)>& fn) {
  ThreadGroup group(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator comm(group, r);
        fn(comm);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        group.abort("rank " + std::to_string(r) + " failed: " + e.what());
      }
    });
  for (std::thread& t : threads) t.join();
  // The first rank that failed on its own, not by the abort it caused in the others.
  for (const std::exception_ptr& e : errors)
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const Error& err) {
        if (std::string(err.what()).rfind("collective aborted", 0) == 0) continue;
        throw;
      }
    }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace di::parallel
