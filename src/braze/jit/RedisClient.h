#pragma once
/// A small Redis client for the shared compile cache (BRAZE_REMOTE_CACHE=redis://host:port):
/// GET and SET of binary values over RESP, each connect, send and receive under a timeout. A
/// server that does not answer costs one timeout: the first failure marks it dead for the rest
/// of the process, says so once on stderr, and every later call returns at once.
#include <optional>
#include <string>

namespace braze::jit {

class RedisCache {
public:
  /// `address` is host:port (port 6379 when left out).
  explicit RedisCache(std::string address, int timeoutMs = 1000);
  ~RedisCache();
  RedisCache(const RedisCache &) = delete;
  RedisCache &operator=(const RedisCache &) = delete;

  /// The value at `key`, or nothing (absent, or the server is dead).
  std::optional<std::string> get(const std::string &key);
  /// Stores `value` at `key`; false when the server is dead.
  bool set(const std::string &key, const std::string &value);
  bool alive() const { return !dead_; }
  const std::string &address() const { return address_; }

private:
  bool connect();
  void fail(const std::string &why);
  bool sendAll(const std::string &data);
  bool receive(); ///< appends what one recv brings to buffer_; false (and dead) on failure
  bool readLine(std::string &line);
  bool readExactly(size_t n, std::string &out);

  std::string address_;
  int timeoutMs_;
  int fd_ = -1;
  bool dead_ = false;
  std::string buffer_; ///< received bytes not yet consumed
};

/// The process's client for `address` (one per address, used under its own lock by callers).
RedisCache &redisCache(const std::string &address);

} // namespace braze::jit
