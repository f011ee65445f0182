// Helpers for the GoogleTest binaries that run under mpiexec (main in mpi_test_main.cpp).
#pragma once

#include <gtest/gtest.h>

#include "parallel/comm.h"

namespace ulysses::testing {

// The world communicator of this test process.
Comm& mpi_world();

// Base fixture of every multi-rank test. After each test all ranks agree on whether it failed
// anywhere, so a failure seen only on rank 3 also fails the test on rank 0 (the one that
// prints); the other ranks print their failed assertions to stderr with their rank.
class MpiTest : public ::testing::Test {
 protected:
  Comm& world() { return mpi_world(); }
  void TearDown() override;
};

}  // namespace ulysses::testing
