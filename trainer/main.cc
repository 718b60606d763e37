// `train`: Megatron-style GPT pre-training. Started once per rank by a cluster launcher (srun,
// mpirun, torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), or once with
// --nproc-per-node N, in which case it starts the N local ranks itself and waits for them.
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "trainer/core/args.h"
#include "trainer/core/training.h"
#include "trainer/dist/comm.h"
#include "trainer/dist/rendezvous_signals.h"

namespace {

std::vector<pid_t> g_children;

void ForwardSignal(int sig) {
  for (pid_t pid : g_children) kill(pid, sig);
}

// 128 random bits as hex: the job token the local ranks present (LaunchInfo::job_token).
std::string RandomToken() {
  unsigned char bytes[16] = {};
  FILE* f = std::fopen("/dev/urandom", "rb");
  if (f != nullptr) {
    if (std::fread(bytes, 1, sizeof(bytes), f) != sizeof(bytes)) bytes[0] ^= 1;
    std::fclose(f);
  }
  std::string hex;
  for (unsigned char b : bytes) {
    static const char kDigits[] = "0123456789abcdef";
    hex += kDigits[b >> 4];
    hex += kDigits[b & 15];
  }
  return hex;
}

// "was killed by signal 9 (SIGKILL)" / "exited with status 1".
std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + " (" +
           (abbrev ? std::string("SIG") + abbrev : std::string("unknown")) + ")" +
           (WCOREDUMP(status) ? ", core dumped" : "");
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

// A rank's exit status as the launcher's: its code, or 128 + the signal that killed it.
int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

using Clock = std::chrono::steady_clock;
// How long the launcher waits, after a rank failed, for others that failed with it.
constexpr auto kGrace = std::chrono::milliseconds(300);

// Forks the local ranks, forwards SIGTERM/SIGINT to them, and stops the rest when one fails,
// saying which rank failed and how. The ranks die with the launcher (a parent-death signal), and
// the rendezvous folder goes once they have met (CreateProcessGroups) or when the launcher ends.
int LaunchLocalRanks(int nproc) {
  std::error_code ec;
  std::string dir_template =
      (std::filesystem::temp_directory_path(ec) / "leantron-rendezvous-XXXXXX").string();
  const char* dir = mkdtemp(dir_template.data());
  if (dir == nullptr) {
    std::fprintf(stderr, "error: cannot create a rendezvous directory %s: %s\n",
                 dir_template.c_str(), strerror(errno));
    return 1;
  }
  const std::string token = RandomToken();
  const pid_t launcher = getpid();
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      ForwardSignal(SIGKILL);
      return 1;
    }
    if (pid == 0) {
      // Killed with the launcher, however it ends (its SIGKILL included); a launcher gone before
      // this line ran is seen as a new parent.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);
      setenv("LEANTRON_JOB_TOKEN", token.c_str(), 1);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("LEANTRON_RENDEZVOUS_DIR", dir, 1);
      return -1;  // the caller continues as rank r
    }
    g_children.push_back(pid);
  }
  struct sigaction sa = {};
  sa.sa_handler = ForwardSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // Waits for any rank (with WNOHANG: 0 when none has ended); marks the one it returns reaped.
  std::vector<bool> reaped(g_children.size(), false);
  auto reap = [&](int options, int* status) -> pid_t {
    while (true) {
      const pid_t pid = waitpid(-1, status, options);
      if (pid < 0 && errno == EINTR) continue;
      for (size_t r = 0; pid > 0 && r < g_children.size(); ++r)
        if (g_children[r] == pid) reaped[r] = true;
      return pid;
    }
  };
  auto rank_of = [&](pid_t pid) {
    int rank = 0;
    while (rank < nproc && g_children[rank] != pid) ++rank;
    return rank;
  };
  int exit_code = 0;
  int status = 0;
  for (pid_t pid; (pid = reap(0, &status)) > 0;) {
    if (ExitCode(status) == 0 || exit_code != 0) continue;
    // The first failure reaped need not be the cause: a rank killed by a signal makes its peers
    // fail with "another rank died" within milliseconds, and waitpid may return one of them
    // first. Ranks that end within kGrace are reaped too, and one killed by a signal is named.
    pid_t cause = pid;
    int cause_status = status;
    for (auto until = Clock::now() + kGrace; Clock::now() < until;) {
      int other_status = 0;
      const pid_t other = reap(WNOHANG, &other_status);
      if (other < 0) break;  // none left
      if (other == 0) {
        usleep(5000);
        continue;
      }
      if (WIFSIGNALED(other_status) && !WIFSIGNALED(cause_status)) {
        cause = other;
        cause_status = other_status;
      }
    }
    exit_code = ExitCode(cause_status);
    std::fprintf(stderr, "train: rank %d (pid %d) %s; stopping the other ranks\n", rank_of(cause),
                 static_cast<int>(cause), DescribeExit(cause_status).c_str());
    std::fflush(stderr);
    // The others would wait in a collective until the timeout: stop them.
    for (size_t r = 0; r < g_children.size(); ++r)
      if (!reaped[r]) kill(g_children[r], SIGKILL);
  }
  std::filesystem::remove_all(dir, ec);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  using leantron::trainer::TrainArgs;
  CLI::App app{"Leantron GPT trainer (Megatron-LM flags)"};
  TrainArgs args;
  leantron::trainer::AddTrainFlags(app, &args);
  CLI11_PARSE(app, argc, argv);

  leantron::trainer::LaunchInfo launch = leantron::trainer::LaunchInfoFromEnvironment();
  const bool launcher = args.nproc_per_node > 0 && std::getenv("RANK") == nullptr;
  args.world_size = launcher ? args.nproc_per_node : launch.world_size;
  if (absl::Status s = leantron::trainer::ValidateTrainArgs(&args); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (launcher) {
    const int code = LaunchLocalRanks(args.nproc_per_node);
    if (code >= 0) return code;
    launch = leantron::trainer::LaunchInfoFromEnvironment();  // now a child
  }
  // SIGTERM/SIGINT stop a rank at once until the ranks have met, then save and stop
  // (EndRendezvousPhase, called when the process groups are connected).
  // A peer rank that died must come back as the communicator's error (EPIPE on its socket), not
  // end this rank with SIGPIPE before it can say which rank and what happened.
  if (launch.world_size > 1) signal(SIGPIPE, SIG_IGN);
  leantron::trainer::BeginRendezvousPhase(launch.rank);
  absl::Status s = leantron::trainer::RunTraining(args, launch);
  if (!s.ok()) {
    if (!absl::IsAborted(s))
      std::fprintf(stderr, "error (rank %d): %s\n", launch.rank, std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
