#include "braze/jit/RedisClient.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

namespace braze::jit {

RedisCache::RedisCache(std::string address, int timeoutMs)
    : address_(std::move(address)), timeoutMs_(timeoutMs) {}

RedisCache::~RedisCache() {
  if (fd_ >= 0)
    ::close(fd_);
}

void RedisCache::fail(const std::string &why) {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
  if (!dead_)
    std::fprintf(stderr, "braze: the shared cache redis://%s does not answer (%s); compiling "
                         "without it in this process\n", address_.c_str(), why.c_str());
  dead_ = true;
}

bool RedisCache::connect() {
  if (dead_)
    return false;
  if (fd_ >= 0)
    return true;
  std::string host = address_, port = "6379";
  if (size_t colon = address_.rfind(':'); colon != std::string::npos) {
    host = address_.substr(0, colon);
    port = address_.substr(colon + 1);
  }
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    fail(std::string("cannot resolve it: ") + gai_strerror(rc));
    return false;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, ::freeaddrinfo);
  for (addrinfo *a = found; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
      continue;
    // Non-blocking connect under the timeout, then blocking I/O with timeouts.
    int flags = ::fcntl(fd, F_GETFL, 0);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      rc = ::poll(&p, 1, timeoutMs_) == 1 &&
                   ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0
               ? 0
               : -1;
    }
    if (rc != 0) {
      ::close(fd);
      continue;
    }
    ::fcntl(fd, F_SETFL, flags);
    timeval tv{timeoutMs_ / 1000, (timeoutMs_ % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    fd_ = fd;
    buffer_.clear();
    return true;
  }
  fail("cannot connect within " + std::to_string(timeoutMs_) + " ms");
  return false;
}

bool RedisCache::sendAll(const std::string &data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) {
      fail(n == 0 ? "the connection closed" : std::strerror(errno));
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool RedisCache::receive() {
  char chunk[65536];
  ssize_t got = ::recv(fd_, chunk, sizeof chunk, 0);
  if (got <= 0) {
    fail(got == 0 ? "the connection closed" : std::strerror(errno));
    return false;
  }
  buffer_.append(chunk, static_cast<size_t>(got));
  return true;
}

bool RedisCache::readExactly(size_t n, std::string &out) {
  while (buffer_.size() < n)
    if (!receive())
      return false;
  out = buffer_.substr(0, n);
  buffer_.erase(0, n);
  return true;
}

bool RedisCache::readLine(std::string &line) {
  size_t end;
  while ((end = buffer_.find("\r\n")) == std::string::npos)
    if (!receive())
      return false;
  line = buffer_.substr(0, end);
  buffer_.erase(0, end + 2);
  return true;
}

namespace {
constexpr long long kMaxValueBytes = 1LL << 30;

std::string command(std::initializer_list<const std::string *> parts) {
  std::string out = "*" + std::to_string(parts.size()) + "\r\n";
  for (const std::string *p : parts)
    out += "$" + std::to_string(p->size()) + "\r\n" + *p + "\r\n";
  return out;
}
} // namespace

std::optional<std::string> RedisCache::get(const std::string &key) {
  static const std::string verb = "GET";
  if (!connect() || !sendAll(command({&verb, &key})))
    return std::nullopt;
  std::string line;
  if (!readLine(line))
    return std::nullopt;
  if (line.empty() || line[0] != '$') {
    fail("an unexpected reply to GET: " + line.substr(0, 80));
    return std::nullopt;
  }
  long long n = std::atoll(line.c_str() + 1);
  if (n < 0)
    return std::nullopt; // no such key
  // A cache entry (a kernel library, a manifest) is far smaller; a server claiming more would
  // have the client buffer whatever it sends.
  if (n > kMaxValueBytes) {
    fail("a value of " + std::to_string(n) + " bytes, over braze's limit of " +
         std::to_string(kMaxValueBytes));
    return std::nullopt;
  }
  std::string value, crlf;
  if (!readExactly(static_cast<size_t>(n), value) || !readExactly(2, crlf))
    return std::nullopt;
  return value;
}

bool RedisCache::set(const std::string &key, const std::string &value) {
  static const std::string verb = "SET";
  if (!connect() || !sendAll(command({&verb, &key, &value})))
    return false;
  std::string line;
  if (!readLine(line))
    return false;
  if (line != "+OK") {
    fail("an unexpected reply to SET: " + line.substr(0, 80));
    return false;
  }
  return true;
}

RedisCache &redisCache(const std::string &address) {
  static std::mutex lock;
  static std::map<std::string, std::unique_ptr<RedisCache>> caches;
  std::lock_guard<std::mutex> hold(lock);
  auto &c = caches[address];
  if (!c)
    c = std::make_unique<RedisCache>(address);
  return *c;
}

} // namespace braze::jit
