#pragma once

#include <stdexcept>

namespace ulysses {

// A configuration the run cannot start with. Every rank reaches the same verdict; the
// binary exits with status 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ulysses
