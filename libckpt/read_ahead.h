// Reading ahead in a second thread: a copy that reads pieces (through a mapping, checksums) in one
// thread and hands them on (checksums, pwrite) in the caller's, so the two halves overlap instead
// of taking turns. Pieces keep their order; a few are in flight at a time, each in a buffer of its
// own.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>

#include "absl/status/status.h"

namespace leantron::ckpt {

// Bytes that start on a page boundary, as the page cache's do. The kernel copies pread's and
// pwrite's bytes with `rep movsb`, which on the AMD EPYC machines measured runs at a fraction of
// its speed when the user buffer is not 16-byte aligned (a 1 MiB std::vector starts 16 bytes into
// a page).
class PageAlignedBuffer {
 public:
  std::byte* data() { return data_.get(); }
  size_t size() const { return size_; }
  // Grows to at least `size` bytes; the contents are not kept.
  void Reserve(size_t size);

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

// Calls produce(i, slot) for pieces i = 0 .. count-1 in a helper thread and consume(i, slot) in
// the calling thread, both in order, where slot = i % slots names the caller's buffer for the
// piece: up to `slots` pieces are produced ahead of consumption. The first error of either side
// stops both and is returned (the consumer's when both fail). With one piece, or one slot,
// everything runs in this thread.
absl::Status RunReadAhead(size_t count, size_t slots,
                          const std::function<absl::Status(size_t piece, size_t slot)>& produce,
                          const std::function<absl::Status(size_t piece, size_t slot)>& consume);

}  // namespace leantron::ckpt
