// Progress of a long conversion, drawn in place on a terminal:
//   reshard_checkpoint: 1204/2324 tensors, 11.2/21.8 GB, 1.04 GB/s, 0:10 left
// at most five times a second on stderr, and a last line when done. Silent when stderr is not a
// terminal (logs, pipes, tests), so scripts see only the tools' own output.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace leantron::ckpt {

struct ProgressOptions {
  bool enabled = false;  // The tools set it; libraries and tests leave it off.
  std::string label;     // "reshard_checkpoint", "convert_hf", ...
};

class ConversionProgress {
 public:
  // Draws only when `options.enabled` and stderr is a terminal.
  ConversionProgress(const ProgressOptions& options, int64_t total_tensors, int64_t total_bytes);
  ~ConversionProgress();
  ConversionProgress(const ConversionProgress&) = delete;
  ConversionProgress& operator=(const ConversionProgress&) = delete;

  void Add(int64_t tensors, int64_t bytes);
  // The last line (with a newline); called by the destructor when not called before.
  void Done();
  bool active() const { return active_; }
  // The line as drawn (for tests of the formatting).
  static std::string Line(const std::string& label, int64_t tensors, int64_t total_tensors,
                          int64_t bytes, int64_t total_bytes, double seconds, bool final);

 private:
  void Draw(bool final);
  bool active_ = false;
  bool done_ = false;
  std::string label_;
  int64_t total_tensors_ = 0, total_bytes_ = 0, tensors_ = 0, bytes_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace leantron::ckpt
