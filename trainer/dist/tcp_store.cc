#include "trainer/dist/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace leantron::trainer {
namespace {

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool ReadKey(int fd, std::string* key) {
  uint32_t len = 0;
  if (!ReadAll(fd, &len, sizeof(len)) || len > kMaxStoreKeyBytes) return false;
  key->resize(len);
  return ReadAll(fd, key->data(), len);
}

bool ReadValue(int fd, std::vector<char>* value) {
  uint64_t len = 0;
  if (!ReadAll(fd, &len, sizeof(len)) || len > kMaxStoreValueBytes) return false;
  value->resize(len);
  return ReadAll(fd, value->data(), len);
}

void SetReceiveTimeout(int fd, int seconds) {
  timeval tv = {};
  tv.tv_sec = seconds;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

// Equal without leaking where the first difference is.
bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const LaunchInfo& launch) {
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->token_ = launch.job_token;
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(launch.master_port);
  if (const int rc = ::getaddrinfo(launch.master_addr.c_str(), service.c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_ADDR ", launch.master_addr, ": ", ::gai_strerror(rc)));
  }
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("rank 0 cannot serve the rendezvous store on MASTER_ADDR ", launch.master_addr,
                     " MASTER_PORT ", launch.master_port, ": ", why,
                     " (MASTER_ADDR must name this host, MASTER_PORT a free port)"));
  }
  server->listen_fd_ = fd;
  server->acceptor_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

// Every descriptor is closed only after the thread using it has ended: closed any earlier, its
// number could be handed to another socket of the process (a Gloo pair's) before a shutdown or
// accept below reached it, cutting that connection instead.
TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (Client& c : clients_) ::shutdown(c.fd, SHUT_RDWR);
  }
  cv_.notify_all();
  ::shutdown(listen_fd_, SHUT_RDWR);  // accept() returns
  if (acceptor_.joinable()) acceptor_.join();
  for (Client& c : clients_) {
    c.thread.join();
    ::close(c.fd);
  }
  ::close(listen_fd_);
}

void TcpStoreServer::Serve() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      return;  // the listening socket was shut down
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    // Reap the connections that ended (refused strangers among them), so that neither threads
    // nor descriptors pile up.
    for (auto it = clients_.begin(); it != clients_.end();) {
      if (it->done->load()) {
        it->thread.join();
        ::close(it->fd);
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
    if (clients_.size() >= kMaxStoreConnections) {
      ::close(fd);
      continue;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    clients_.push_back({fd, done, std::thread([this, fd, done] {
                          Handle(fd);
                          done->store(true);
                        })});
  }
}

// The token before anything else, within a few seconds: a stranger allocates nothing here.
bool TcpStoreServer::Greet(int fd) {
  SetReceiveTimeout(fd, kStoreGreetingTimeoutS);
  char op = 0;
  uint32_t len = 0;
  if (!ReadAll(fd, &op, 1) || op != 'H' || !ReadAll(fd, &len, sizeof(len)) ||
      len > kMaxStoreKeyBytes) {
    return false;
  }
  std::string token(len, '\0');
  if (!ReadAll(fd, token.data(), len)) return false;
  const bool ok = SameToken(token, token_);
  const char reply = ok ? 'K' : 'R';
  WriteAll(fd, &reply, 1);
  SetReceiveTimeout(fd, 0);  // A rank may be idle between requests for as long as it likes.
  return ok;
}

void TcpStoreServer::Handle(int fd) {
  if (!Greet(fd)) {
    ::shutdown(fd, SHUT_RDWR);  // The destructor closes fd.
    return;
  }
  while (true) {
    char op = 0;
    std::string key;
    if (!ReadAll(fd, &op, 1) || !ReadKey(fd, &key)) break;
    if (op == 'S') {
      std::vector<char> value;
      if (!ReadValue(fd, &value)) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::move(value);
      }
      cv_.notify_all();
    } else if (op == 'G') {
      std::vector<char> value;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || data_.count(key) > 0; });
        if (stopping_) break;
        value = data_[key];
      }
      const uint64_t len = value.size();
      if (!WriteAll(fd, &len, sizeof(len)) || !WriteAll(fd, value.data(), value.size())) break;
    } else {
      break;
    }
  }
  // The peer left or broke the protocol: it sees the connection end now; the descriptor is closed
  // once this thread has ended (Serve reaps it, or the destructor).
  ::shutdown(fd, SHUT_RDWR);
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const LaunchInfo& launch,
                                                            std::chrono::milliseconds timeout,
                                                            std::chrono::milliseconds io_timeout) {
  const std::string& host = launch.master_addr;
  const int port = launch.master_port;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  while (std::chrono::steady_clock::now() < deadline) {
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MASTER_ADDR ", host, ": ", ::gai_strerror(rc)));
    }
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        // A rank that never arrives must not hang the others forever.
        timeval tv = {};
        tv.tv_sec = static_cast<time_t>(io_timeout.count() / 1000);
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        std::unique_ptr<TcpStore> store(new TcpStore());
        store->fd_ = fd;
        const char op = 'H';
        const uint32_t len = static_cast<uint32_t>(launch.job_token.size());
        char reply = 0;
        if (!WriteAll(fd, &op, 1) || !WriteAll(fd, &len, sizeof(len)) ||
            !WriteAll(fd, launch.job_token.data(), len) || !ReadAll(fd, &reply, 1)) {
          return absl::UnavailableError(absl::StrCat("the rendezvous store at ", host, ":", port,
                                                     " closed the connection at the greeting"));
        }
        if (reply != 'K') {
          return absl::PermissionDeniedError(
              absl::StrCat("the rendezvous store at ", host, ":", port,
                           " belongs to another job (its ranks present another job token: "
                           "LEANTRON_JOB_TOKEN or the launcher's job id)"));
        }
        return store;
      }
      last_error = std::strerror(errno);
      ::close(fd);
    }
    ::freeaddrinfo(res);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no rendezvous server at ", host, ":", port, " (", last_error, ")"));
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

// Gloo's Store interface reports failures by exception; CreateProcessGroups turns them into a
// Status.
void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  const char op = 'S';
  const uint32_t klen = static_cast<uint32_t>(key.size());
  const uint64_t vlen = data.size();
  if (!WriteAll(fd_, &op, 1) || !WriteAll(fd_, &klen, sizeof(klen)) ||
      !WriteAll(fd_, key.data(), key.size()) || !WriteAll(fd_, &vlen, sizeof(vlen)) ||
      !WriteAll(fd_, data.data(), data.size())) {
    throw std::runtime_error("rendezvous store connection lost");
  }
}

std::vector<char> TcpStore::get(const std::string& key) {
  const char op = 'G';
  const uint32_t klen = static_cast<uint32_t>(key.size());
  std::vector<char> value;
  if (!WriteAll(fd_, &op, 1) || !WriteAll(fd_, &klen, sizeof(klen)) ||
      !WriteAll(fd_, key.data(), key.size()) || !ReadValue(fd_, &value)) {
    throw std::runtime_error("rendezvous store connection lost");
  }
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) get(k);
}

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) {
  wait(keys);
}

}  // namespace leantron::trainer
