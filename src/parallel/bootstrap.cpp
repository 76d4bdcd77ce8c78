#include "parallel/bootstrap.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace di::parallel {

namespace {

constexpr uint32_t kMagic = 0x44495042;  // "DIPB"

int env_int(const char* name, std::optional<int> fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (fallback) return *fallback;
    throw Error(std::string(name) + ": not set (needed with DEEPINFER_WORLD_SIZE)");
  }
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || x < lo || x > hi)
    throw Error(std::string(name) + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got '" + v + "'");
  return static_cast<int>(x);
}

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

void io_all(int fd, void* buf, size_t n, bool write, Clock::time_point deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    int r = ::poll(&pfd, 1, ms_left(deadline));
    if (r == 0) throw Error("bootstrap: timed out " + what);
    if (r < 0 && errno != EINTR) throw Error("bootstrap: poll failed " + what + ": " + std::strerror(errno));
    if (r < 0) continue;
    ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k == 0) throw Error("bootstrap: connection closed " + what);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error("bootstrap: " + std::string(write ? "send" : "recv") + " failed " + what + ": " + std::strerror(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

addrinfo* resolve(const BootstrapConfig& c, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(c.master_port);
  int rc = ::getaddrinfo(c.master_addr.c_str(), port.c_str(), &hints, &res);
  if (rc != 0)
    throw Error("DEEPINFER_MASTER_ADDR: cannot resolve '" + c.master_addr + "': " + ::gai_strerror(rc));
  return res;
}

std::vector<uint8_t> serve(const BootstrapConfig& c, const std::vector<uint8_t>& blob, Clock::time_point deadline) {
  addrinfo* res = resolve(c, true);
  Fd listener;
  std::string last_error = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (s.fd < 0) continue;
    int one = 1;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.fd, 1024) == 0) {
      listener = std::move(s);
      break;
    }
    last_error = std::strerror(errno);
  }
  ::freeaddrinfo(res);
  if (listener.fd < 0)
    throw Error("bootstrap: rank 0 cannot listen on " + c.master_addr + ":" + std::to_string(c.master_port) + ": " +
                last_error + " (DEEPINFER_MASTER_ADDR / DEEPINFER_MASTER_PORT)");
  std::vector<bool> seen(static_cast<size_t>(c.world_size), false);
  for (int served = 1; served < c.world_size; ++served) {
    pollfd pfd{listener.fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, ms_left(deadline));
    if (r == 0)
      throw Error("bootstrap: rank 0 timed out after " + std::to_string(served - 1) + " of " +
                  std::to_string(c.world_size - 1) + " ranks connected");
    if (r < 0) {
      --served;
      continue;
    }
    Fd peer(::accept(listener.fd, nullptr, nullptr));
    if (peer.fd < 0) {
      --served;
      continue;
    }
    uint32_t hello[3];  // magic, rank, world size
    io_all(peer.fd, hello, sizeof hello, false, deadline, "reading a rank's hello");
    if (hello[0] != kMagic) throw Error("bootstrap: a peer on the master port is not a DeepInfer rank");
    if (static_cast<int>(hello[2]) != c.world_size || static_cast<int>(hello[1]) <= 0 ||
        static_cast<int>(hello[1]) >= c.world_size || seen[hello[1]])
      throw Error("bootstrap: rank " + std::to_string(hello[1]) + " of world " + std::to_string(hello[2]) +
                  " does not fit world " + std::to_string(c.world_size) + " (or connected twice)");
    seen[hello[1]] = true;
    uint64_t n = blob.size();
    io_all(peer.fd, &n, sizeof n, true, deadline, "sending the blob size");
    io_all(peer.fd, const_cast<uint8_t*>(blob.data()), blob.size(), true, deadline, "sending the blob");
  }
  return blob;
}

std::vector<uint8_t> fetch(const BootstrapConfig& c, Clock::time_point deadline) {
  std::string last_error;
  for (int attempt = 0;; ++attempt) {
    addrinfo* res = resolve(c, false);
    Fd s;
    for (addrinfo* a = res; a && s.fd < 0; a = a->ai_next) {
      Fd t(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (t.fd < 0) continue;
      if (::connect(t.fd, a->ai_addr, a->ai_addrlen) == 0) s = std::move(t);
      else last_error = std::strerror(errno);
    }
    ::freeaddrinfo(res);
    if (s.fd >= 0) {
      uint32_t hello[3] = {kMagic, static_cast<uint32_t>(c.rank), static_cast<uint32_t>(c.world_size)};
      io_all(s.fd, hello, sizeof hello, true, deadline, "sending hello to rank 0");
      uint64_t n = 0;
      io_all(s.fd, &n, sizeof n, false, deadline, "reading the blob size from rank 0");
      if (n > (1u << 20)) throw Error("bootstrap: rank 0 announced a " + std::to_string(n) + "-byte blob");
      std::vector<uint8_t> blob(n);
      io_all(s.fd, blob.data(), n, false, deadline, "reading the blob from rank 0");
      return blob;
    }
    if (ms_left(deadline) == 0)
      throw Error("bootstrap: rank " + std::to_string(c.rank) + " could not reach rank 0 at " + c.master_addr + ":" +
                  std::to_string(c.master_port) + ": " + last_error);
    // rank 0 may not listen yet: retry with a short backoff
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20 * (attempt + 1), 500)));
  }
}

}  // namespace

std::optional<BootstrapConfig> bootstrap_from_env() {
  const char* ws = std::getenv("DEEPINFER_WORLD_SIZE");
  if (!ws || !*ws) return std::nullopt;
  BootstrapConfig c;
  c.world_size = env_int("DEEPINFER_WORLD_SIZE", std::nullopt, 1, 1 << 16);
  c.rank = env_int("DEEPINFER_RANK", std::nullopt, 0, c.world_size - 1);
  c.local_rank = env_int("DEEPINFER_LOCAL_RANK", -1, -1, 1 << 10);
  if (const char* a = std::getenv("DEEPINFER_MASTER_ADDR"); a && *a) c.master_addr = a;
  c.master_port = env_int("DEEPINFER_MASTER_PORT", c.master_port, 1, 65535);
  return c;
}

std::vector<uint8_t> bootstrap_broadcast(const BootstrapConfig& c, const std::vector<uint8_t>& blob) {
  if (c.world_size < 1 || c.rank < 0 || c.rank >= c.world_size)
    throw Error("bootstrap: rank " + std::to_string(c.rank) + " outside world size " + std::to_string(c.world_size));
  if (c.world_size == 1) return blob;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000));
  return c.rank == 0 ? serve(c, blob, deadline) : fetch(c, deadline);
}

}  // namespace di::parallel
