// main() of the multi-rank tests: MPI is initialised around the whole run, only rank 0 prints
// the GoogleTest report, and the exit status is non-zero on every rank when any rank failed.
#include <cstdio>
#include <memory>

#include "parallel/mpi_comm.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses::testing {

namespace {

// Set by main for the duration of RUN_ALL_TESTS; GoogleTest offers no other way to hand an
// object to the tests.
Comm* world_for_tests = nullptr;

// Replaces the default printer on ranks other than 0: silent except for failed assertions.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

}  // namespace

Comm& mpi_world() {
  return *world_for_tests;
}

void MpiTest::TearDown() {
  double failed = HasFailure() ? 1.0 : 0.0;
  mpi_world().all_reduce_host(&failed, 1, ReduceOp::max);
  if (failed != 0.0 && !HasFailure())
    ADD_FAILURE() << "this test failed on another rank (see the [rank r] messages)";
}

}  // namespace ulysses::testing

int main(int argc, char** argv) {
  ulysses::MpiSession session(&argc, &argv);
  std::unique_ptr<ulysses::Comm> world = session.world();
  ulysses::testing::world_for_tests = world.get();
  ::testing::InitGoogleTest(&argc, argv);
  if (world->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ulysses::testing::FailurePrinter(world->rank()));
  }
  double failed = RUN_ALL_TESTS() != 0 ? 1.0 : 0.0;
  world->all_reduce_host(&failed, 1, ulysses::ReduceOp::max);
  ulysses::testing::world_for_tests = nullptr;
  return failed != 0.0 ? 1 : 0;
}
