#include "trainer/dist/rendezvous_signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "trainer/core/training.h"

namespace leantron::trainer {
namespace {

std::atomic<bool> g_in_rendezvous{false};
char g_message[96];
size_t g_message_size = 0;

extern "C" void StopDuringRendezvous(int sig) {
  if (g_message_size > 0) {
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, g_message, g_message_size);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void BeginRendezvousPhase(int rank) {
  const int n =
      std::snprintf(g_message, sizeof(g_message),
                    "rank %d: stopped by a signal while waiting for the other ranks\n", rank);
  g_message_size = n > 0 ? static_cast<size_t>(n) : 0;
  g_in_rendezvous.store(true);
  struct sigaction sa = {};
  sa.sa_handler = StopDuringRendezvous;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void EndRendezvousPhase() {
  if (g_in_rendezvous.exchange(false)) InstallStopSignalHandler();
}

}  // namespace leantron::trainer
