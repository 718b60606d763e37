// RunReadAhead: pieces reach the consumer in order, each in the slot it was made in, with no more
// than `slots` made ahead; an error on either side stops both and is the one returned.
#include "libckpt/read_ahead.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "gtest/gtest.h"

namespace leantron::ckpt {
namespace {

TEST(ReadAhead, PiecesArriveInOrderWithBoundedLead) {
  for (size_t slots : {1, 2, 4}) {
    for (size_t count : {0, 1, 2, 7, 300}) {
      std::vector<PageAlignedBuffer> buffers(slots);
      std::atomic<size_t> made{0}, used{0};
      std::vector<size_t> seen;
      const absl::Status status = RunReadAhead(
          count, slots,
          [&](size_t piece, size_t slot) {
            EXPECT_EQ(slot, piece % slots);
            EXPECT_LT(piece - used.load(), slots);  // Its slot's previous piece is consumed.
            buffers[slot].Reserve(4096);
            const uint64_t value = piece * 1000003;
            std::memcpy(buffers[slot].data(), &value, sizeof(value));
            ++made;
            return absl::OkStatus();
          },
          [&](size_t piece, size_t slot) {
            uint64_t value = 0;
            std::memcpy(&value, buffers[slot].data(), sizeof(value));
            EXPECT_EQ(value, piece * 1000003);
            seen.push_back(piece);
            std::memcpy(&value, buffers[slot].data(), sizeof(value));
            EXPECT_EQ(value, piece * 1000003);  // Not overwritten while in use.
            ++used;
            return absl::OkStatus();
          });
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(seen.size(), count);
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(seen[i], i);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers[0].data()) % 4096, 0u) << "page aligned";
    }
  }
}

TEST(ReadAhead, AnErrorOnEitherSideStopsBoth) {
  for (size_t slots : {1, 3}) {
    std::vector<size_t> consumed;
    absl::Status status = RunReadAhead(
        50, slots,
        [&](size_t piece, size_t) {
          return piece == 20 ? absl::DataLossError("piece 20 is corrupt") : absl::OkStatus();
        },
        [&](size_t piece, size_t) {
          consumed.push_back(piece);
          return absl::OkStatus();
        });
    EXPECT_EQ(status.message(), "piece 20 is corrupt");
    EXPECT_EQ(consumed.size(), 20u);  // Everything before the bad piece, nothing after.

    std::atomic<size_t> produced{0};
    status = RunReadAhead(
        1000, slots,
        [&](size_t, size_t) {
          ++produced;
          return absl::OkStatus();
        },
        [&](size_t piece, size_t) {
          return piece == 5 ? absl::ResourceExhaustedError("disk full") : absl::OkStatus();
        });
    EXPECT_EQ(status.message(), "disk full");
    EXPECT_LE(produced.load(), 6 + slots);  // The producer stopped too.
  }
}

TEST(ReadAhead, AnExceptionOnEitherSideIsAnError) {
  for (size_t slots : {1, 3}) {
    absl::Status status = RunReadAhead(
        50, slots,
        [&](size_t piece, size_t) -> absl::Status {
          if (piece == 7) throw std::bad_alloc();
          return absl::OkStatus();
        },
        [&](size_t, size_t) { return absl::OkStatus(); });
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    status = RunReadAhead(
        50, slots, [&](size_t, size_t) { return absl::OkStatus(); },
        [&](size_t piece, size_t) -> absl::Status {
          if (piece == 9) throw std::bad_alloc();
          return absl::OkStatus();
        });
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  }
}

}  // namespace
}  // namespace leantron::ckpt
