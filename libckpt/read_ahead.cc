#include "libckpt/read_ahead.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

namespace leantron::ckpt {

void PageAlignedBuffer::Reserve(size_t size) {
  if (size <= size_) return;
  constexpr size_t kPage = 4096;
  const size_t rounded = (size + kPage - 1) / kPage * kPage;
  data_.reset();
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(kPage, rounded)));
  if (data_ == nullptr) throw std::bad_alloc();
  size_ = rounded;
}

namespace {

// fn(piece, slot), an exception (std::bad_alloc for a buffer) turned into a Status: one thrown in
// the helper thread would end the process, one in the caller's would leave the thread unjoined.
absl::Status Call(const std::function<absl::Status(size_t, size_t)>& fn, size_t piece,
                  size_t slot) {
  try {
    return fn(piece, slot);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory for a piece of a tensor");
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace

absl::Status RunReadAhead(size_t count, size_t slots,
                          const std::function<absl::Status(size_t piece, size_t slot)>& produce,
                          const std::function<absl::Status(size_t piece, size_t slot)>& consume) {
  if (slots == 0) return absl::InvalidArgumentError("RunReadAhead: no slots");
  if (count <= 1 || slots == 1) {
    for (size_t i = 0; i < count; ++i) {
      if (auto s = Call(produce, i, 0); !s.ok()) return s;
      if (auto s = Call(consume, i, 0); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::mutex mu;
  std::condition_variable changed;
  size_t produced = 0, consumed = 0;  // pieces done by each side
  bool stop = false;
  absl::Status produce_status;
  std::thread producer([&] {
    for (size_t i = 0; i < count; ++i) {
      {
        std::unique_lock lock(mu);
        changed.wait(lock, [&] { return stop || i - consumed < slots; });
        if (stop) return;
      }
      absl::Status s = Call(produce, i, i % slots);
      const bool failed = !s.ok();
      {
        std::lock_guard lock(mu);
        if (failed) {
          produce_status = std::move(s);
          stop = true;
        } else {
          produced = i + 1;
        }
      }
      changed.notify_all();
      if (failed) return;
    }
  });
  absl::Status status;
  for (size_t i = 0; i < count; ++i) {
    {
      std::unique_lock lock(mu);
      changed.wait(lock, [&] { return stop || produced > i; });
      if (produced <= i) break;  // The producer failed.
    }
    status = Call(consume, i, i % slots);
    {
      std::lock_guard lock(mu);
      if (status.ok()) {
        consumed = i + 1;
      } else {
        stop = true;
      }
    }
    changed.notify_all();
    if (!status.ok()) break;
  }
  producer.join();
  if (!status.ok()) return status;
  return produce_status;
}

}  // namespace leantron::ckpt
