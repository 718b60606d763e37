// `train`: Megatron-style GPT pre-training. Started once per rank by a cluster launcher (srun,
// mpirun, torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), or once with
// --nproc-per-node N, in which case it starts the N local ranks itself and waits for them.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "trainer/core/args.h"
#include "trainer/dist/comm.h"
#include "trainer/core/training.h"

namespace {

std::vector<pid_t> g_children;

void ForwardSignal(int sig) {
  for (pid_t pid : g_children) kill(pid, sig);
}

// Forks the local ranks, forwards SIGTERM/SIGINT to them, and stops the rest when one fails.
int LaunchLocalRanks(int nproc) {
  char dir_template[] = "/tmp/leantron-rendezvous-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) {
    std::fprintf(stderr, "error: cannot create a rendezvous directory in /tmp\n");
    return 1;
  }
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
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
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
  int exit_code = 0;
  size_t remaining = g_children.size();
  while (remaining > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    --remaining;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && exit_code == 0) {
      exit_code = code;
      // The others would wait in a collective until the timeout: stop them.
      for (pid_t other : g_children)
        if (other != pid) kill(other, SIGKILL);
    }
  }
  std::error_code ec;
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
  leantron::trainer::InstallStopSignalHandler();
  absl::Status s = leantron::trainer::RunTraining(args, launch);
  if (!s.ok()) {
    if (!absl::IsAborted(s))
      std::fprintf(stderr, "error (rank %d): %s\n", launch.rank, std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
