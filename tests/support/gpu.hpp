// GPU tests skip, with the reason, when no device is visible; they never pass silently.
#pragma once

#include <gtest/gtest.h>

#include "dsv32/gpu/device.hpp"

#define DSV32_REQUIRE_GPU()                                                     \
  do {                                                                          \
    if (const std::string why_ = dsv32::gpu::no_device_reason(); !why_.empty()) \
      GTEST_SKIP() << why_;                                                     \
  } while (0)
