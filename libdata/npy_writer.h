// Writes numpy .npy files (format 1.0), so index arrays and samples can be compared with numpy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace leantron::data {

// `descr` is numpy's dtype string ("<i4", "<i8", "<i2", "<u2"); `shape` its dimensions;
// `data` holds prod(shape) little-endian items.
absl::Status WriteNpy(const std::string& path, const std::string& descr,
                      const std::vector<int64_t>& shape, const void* data, size_t bytes);

}  // namespace leantron::data
