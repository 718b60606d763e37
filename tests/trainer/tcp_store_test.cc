// The rendezvous store over loopback: it serves only the ranks that present the job's token,
// listens only on MASTER_ADDR, and drops peers that break the protocol or claim huge sizes before
// allocating anything for them.
#include "trainer/dist/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace leantron::trainer {
namespace {

using std::chrono::milliseconds;

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

LaunchInfo Launch(int port, std::string token) {
  LaunchInfo launch;
  launch.master_addr = "127.0.0.1";
  launch.master_port = port;
  launch.job_token = std::move(token);
  return launch;
}

// A raw TCP client, to say what no rank would.
int RawConnect(int family, const char* address, int port) {
  const int fd = ::socket(family, SOCK_STREAM, 0);
  timeval tv = {5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int rc = -1;
  if (family == AF_INET) {
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, address, &addr.sin_addr);
    rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in6 addr = {};
    addr.sin6_family = AF_INET6;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET6, address, &addr.sin6_addr);
    rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void Send(int fd, const void* data, size_t n) {
  ASSERT_EQ(::send(fd, data, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
}

// The server's answer to what was sent: its bytes until it closed the connection (or 5 s).
std::string Reply(int fd) {
  std::string out;
  char buf[64];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool ClosedByServer(int fd) {
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

void Greet(int fd, const std::string& token) {
  const char op = 'H';
  const uint32_t len = static_cast<uint32_t>(token.size());
  Send(fd, &op, 1);
  Send(fd, &len, 4);
  Send(fd, token.data(), token.size());
}

TEST(TcpStore, RanksWithTheTokenShareKeys) {
  const LaunchInfo launch = Launch(FreePort(), "secret-1");
  auto server = TcpStoreServer::Start(launch);
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = TcpStore::Connect(launch, milliseconds(5000), milliseconds(5000));
  auto b = TcpStore::Connect(launch, milliseconds(5000), milliseconds(5000));
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->set("key", {'v', 'a', 'l'});
  EXPECT_EQ((*b)->get("key"), (std::vector<char>{'v', 'a', 'l'}));
}

TEST(TcpStore, AnotherTokenIsRefused) {
  const LaunchInfo launch = Launch(FreePort(), "secret-1");
  auto server = TcpStoreServer::Start(launch);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stranger = TcpStore::Connect(Launch(launch.master_port, "secret-2"), milliseconds(5000),
                                    milliseconds(5000));
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kPermissionDenied) << stranger.status();
  EXPECT_NE(stranger.status().message().find("another job"), std::string::npos);
  const int fd = RawConnect(AF_INET, "127.0.0.1", launch.master_port);
  ASSERT_GE(fd, 0);
  Greet(fd, "");
  EXPECT_EQ(Reply(fd), "R");
  ::close(fd);
}

TEST(TcpStore, PeersBreakingTheProtocolAreDroppedBeforeAnyAllocation) {
  const LaunchInfo launch = Launch(FreePort(), "secret-1");
  auto server = TcpStoreServer::Start(launch);
  ASSERT_TRUE(server.ok()) << server.status();
  {  // A request without the greeting: the old header that made rank 0 allocate 1 GiB.
    const int fd = RawConnect(AF_INET, "127.0.0.1", launch.master_port);
    ASSERT_GE(fd, 0);
    const char op = 'S';
    const uint32_t klen = 1;
    const uint64_t vlen = uint64_t{1} << 30;
    Send(fd, &op, 1);
    Send(fd, &klen, 4);
    Send(fd, "k", 1);
    Send(fd, &vlen, 8);
    EXPECT_TRUE(ClosedByServer(fd));
    ::close(fd);
  }
  {  // A greeting claiming a 1 GiB token.
    const int fd = RawConnect(AF_INET, "127.0.0.1", launch.master_port);
    ASSERT_GE(fd, 0);
    const char op = 'H';
    const uint32_t len = 1u << 30;
    Send(fd, &op, 1);
    Send(fd, &len, 4);
    EXPECT_TRUE(ClosedByServer(fd));
    ::close(fd);
  }
  {  // A rank with the token sending a value over the cap.
    const int fd = RawConnect(AF_INET, "127.0.0.1", launch.master_port);
    ASSERT_GE(fd, 0);
    Greet(fd, launch.job_token);
    char reply = 0;
    ASSERT_EQ(::recv(fd, &reply, 1, 0), 1);
    EXPECT_EQ(reply, 'K');
    const char op = 'S';
    const uint32_t klen = 1;
    const uint64_t vlen = kMaxStoreValueBytes + 1;
    Send(fd, &op, 1);
    Send(fd, &klen, 4);
    Send(fd, "k", 1);
    Send(fd, &vlen, 8);
    EXPECT_TRUE(ClosedByServer(fd));
    ::close(fd);
  }
  // The store still serves the job.
  auto rank = TcpStore::Connect(launch, milliseconds(5000), milliseconds(5000));
  ASSERT_TRUE(rank.ok()) << rank.status();
  (*rank)->set("after", {'1'});
  EXPECT_EQ((*rank)->get("after"), std::vector<char>{'1'});
}

TEST(TcpStore, ListensOnMasterAddrOnly) {
  const LaunchInfo launch = Launch(FreePort(), "secret-1");
  auto server = TcpStoreServer::Start(launch);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = RawConnect(AF_INET, "127.0.0.1", launch.master_port);
  EXPECT_GE(fd, 0);
  if (fd >= 0) ::close(fd);
  // Another loopback address of this host reaches the port only if it listened everywhere
  // (an all-interfaces socket also takes IPv6 and 127.0.0.2).
  const int other = RawConnect(AF_INET, "127.0.0.2", launch.master_port);
  EXPECT_LT(other, 0) << "the store answered on 127.0.0.2";
  if (other >= 0) ::close(other);
  const int v6 = RawConnect(AF_INET6, "::1", launch.master_port);
  EXPECT_LT(v6, 0) << "the store answered on ::1";
  if (v6 >= 0) ::close(v6);
}

TEST(TcpStore, AMasterAddrOfAnotherHostIsAClearError) {
  LaunchInfo launch = Launch(FreePort(), "t");
  launch.master_addr = "192.0.2.1";  // TEST-NET-1: never an address of this host
  auto server = TcpStoreServer::Start(launch);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("MASTER_ADDR 192.0.2.1"), std::string::npos)
      << server.status();
}

}  // namespace
}  // namespace leantron::trainer
