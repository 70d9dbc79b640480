// The headers every C++ test shares, precompiled once (tests/CMakeLists.txt, dsv32_test_pch).
// Third-party and standard headers only: a change to our own headers must not rebuild the PCH.
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>
