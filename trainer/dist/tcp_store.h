// A key-value store over TCP for Gloo's rendezvous, the role torch's TCPStore plays: rank 0 serves
// it on MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) is a client. Debian's Gloo ships
// only file, hash and Redis stores, and a file store needs a directory every node can see.
//
// Protocol (one request at a time per connection): op byte 'S' (set) or 'G' (get, answered when
// the key exists), u32 key length, key, and for 'S' u64 value length, value; a get is answered
// with u64 length and value.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"

namespace leantron::trainer {

class TcpStoreServer {
 public:
  // Listens on port (all interfaces) and serves until destroyed.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(int port);
  ~TcpStoreServer();

 private:
  TcpStoreServer() = default;
  void Serve();
  void Handle(int fd);
  int listen_fd_ = -1;
  bool stopping_ = false;
  std::thread acceptor_;
  std::vector<std::thread> handlers_;
  std::vector<int> client_fds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later); a reply that
  // takes longer than `io_timeout` fails.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                           std::chrono::milliseconds timeout,
                                                           std::chrono::milliseconds io_timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  TcpStore() = default;
  int fd_ = -1;
};

}  // namespace leantron::trainer
