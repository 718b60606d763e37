#include "libckpt/progress.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_format.h"

namespace leantron::ckpt {
namespace {

std::string Duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string Size(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.1f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  return absl::StrFormat("%.0f kB", bytes / 1e3);
}

}  // namespace

ConversionProgress::ConversionProgress(const ProgressOptions& options, int64_t total_tensors,
                                       int64_t total_bytes)
    : active_(options.enabled && ::isatty(STDERR_FILENO) == 1),
      label_(options.label),
      total_tensors_(total_tensors),
      total_bytes_(total_bytes),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ConversionProgress::~ConversionProgress() {
  if (active_ && !done_) Done();
}

std::string ConversionProgress::Line(const std::string& label, int64_t tensors,
                                     int64_t total_tensors, int64_t bytes, int64_t total_bytes,
                                     double seconds, bool final) {
  std::string line =
      absl::StrFormat("%s: %d/%d tensors, %s/%s", label, tensors, total_tensors,
                      Size(static_cast<double>(bytes)), Size(static_cast<double>(total_bytes)));
  const double rate = seconds > 0 ? bytes / seconds : 0;
  if (final) {
    if (rate > 0) line += absl::StrFormat(", %s/s", Size(rate));
    return line + ", " + Duration(seconds) + " in all";
  }
  if (seconds > 0.2 && bytes > 0) {
    line += absl::StrFormat(", %s/s, %s left", Size(rate), Duration((total_bytes - bytes) / rate));
  }
  return line;
}

void ConversionProgress::Add(int64_t tensors, int64_t bytes) {
  tensors_ += tensors;
  bytes_ += bytes;
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ >= std::chrono::milliseconds(200)) {
    last_draw_ = now;
    Draw(false);
  }
}

void ConversionProgress::Done() {
  if (!active_ || done_) return;
  done_ = true;
  Draw(true);
}

void ConversionProgress::Draw(bool final) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // \r and clear-to-end-of-line redraw in place.
  std::fprintf(stderr, "\r%s\033[K%s",
               Line(label_, tensors_, total_tensors_, bytes_, total_bytes_, seconds, final).c_str(),
               final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace leantron::ckpt
