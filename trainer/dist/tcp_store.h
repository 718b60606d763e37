// A key-value store over TCP for Gloo's rendezvous, the role torch's TCPStore plays: rank 0 serves
// it on MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) is a client. Debian's Gloo ships
// only file, hash and Redis stores, and a file store needs a directory every node can see.
//
// Protocol: a client first presents the job token ('H', u32 length, token) and is answered 'K',
// or 'R' and disconnected; then one request at a time: op byte 'S' (set) or 'G' (get, answered
// when the key exists), u32 key length, key, and for 'S' u64 value length, value; a get is
// answered with u64 length and value.
//
// The server listens on MASTER_ADDR only, and nothing a peer sends sizes an allocation before it
// has shown the token; keys and values are capped, a peer that stalls its greeting or breaks the
// protocol is dropped, and so are connections past a cap.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"
#include "trainer/dist/comm.h"

namespace leantron::trainer {

inline constexpr uint32_t kMaxStoreKeyBytes = 4096;
inline constexpr uint64_t kMaxStoreValueBytes = uint64_t{64} << 20;
inline constexpr size_t kMaxStoreConnections = 4096;
inline constexpr int kStoreGreetingTimeoutS = 10;

class TcpStoreServer {
 public:
  // Listens on launch.master_addr:launch.master_port (an address of this host) and serves the
  // ranks that present launch.job_token until destroyed.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const LaunchInfo& launch);
  ~TcpStoreServer();

 private:
  TcpStoreServer() = default;
  void Serve();
  void Handle(int fd);
  bool Greet(int fd);
  std::string token_;
  int listen_fd_ = -1;
  bool stopping_ = false;
  std::thread acceptor_;
  struct Client {
    int fd;
    std::shared_ptr<std::atomic<bool>> done;
    std::thread thread;
  };
  std::list<Client> clients_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to launch.master_addr:master_port and presents launch.job_token, retrying until
  // `timeout` (the server may start later); a reply that takes longer than `io_timeout` fails.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const LaunchInfo& launch,
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
