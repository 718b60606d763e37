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
  if (!ReadAll(fd, &len, sizeof(len)) || len > (1u << 20)) return false;
  key->resize(len);
  return ReadAll(fd, key->data(), len);
}

bool ReadValue(int fd, std::vector<char>* value) {
  uint64_t len = 0;
  if (!ReadAll(fd, &len, sizeof(len)) || len > (1ull << 30)) return false;
  value->resize(len);
  return ReadAll(fd, value->data(), len);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(int port) {
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 too
  sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  addr.sin6_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 1024) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on MASTER_PORT ", port, ": ", why));
  }
  server->listen_fd_ = fd;
  server->acceptor_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

// Every descriptor is closed only here, after the threads using it have ended: closed any
// earlier, its number could be handed to another socket of the process (a Gloo pair's) before a
// shutdown or accept below reached it, cutting that connection instead.
TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  ::shutdown(listen_fd_, SHUT_RDWR);  // accept() returns
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& t : handlers_) t.join();
  for (int fd : client_fds_) ::close(fd);
  ::close(listen_fd_);
}

void TcpStoreServer::Serve() {
  while (true) {
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // the listening socket was shut down
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    client_fds_.push_back(fd);
    handlers_.emplace_back([this, fd] { Handle(fd); });
  }
}

void TcpStoreServer::Handle(int fd) {
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
  // The destructor closes fd.
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                            std::chrono::milliseconds timeout,
                                                            std::chrono::milliseconds io_timeout) {
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
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
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
