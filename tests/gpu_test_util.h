#pragma once
// What the GPU tests share: skipping cleanly without a device, and a logits row's top-2 margin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "worker/backends/cuda/device_info.h"

// Skips the test, saying why, on a machine without a CUDA device.
#define REQUIRE_GPU()                                                                                        \
  do {                                                                                                       \
    auto devices = ::tailserve::ListCudaDevices();                                                           \
    if (!devices.ok() || devices->empty()) {                                                                 \
      GTEST_SKIP() << "no CUDA device: "                                                                     \
                   << (devices.ok() ? std::string("none visible") : std::string(devices.status().message())); \
    }                                                                                                        \
  } while (0)

namespace tailserve::testing {

// Top-1 minus top-2 of a logits row.
inline float Margin(const float* row, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] > a) {
      b = a, a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

}  // namespace tailserve::testing
