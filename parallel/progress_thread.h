// A thread that drives MPI's progress engine while the compute thread works (docs/profiling.md,
// overlap). Open MPI advances a non-blocking collective only inside MPI calls, so without it
// a gather or reduction issued before a GEMM moves only when the GEMM is over and its wait
// begins. The thread polls only while operations are in flight and sleeps otherwise; it
// needs MPI_THREAD_MULTIPLE. parallel.progress_thread decides whether a rank runs one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace ulysses {

class ProgressThread {
 public:
  // Starts the thread. Throws std::runtime_error when MPI does not provide
  // MPI_THREAD_MULTIPLE.
  ProgressThread();
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // An operation was issued / has completed (its wait returned).
  void started();
  void finished();

  // Progress calls made so far (tests: the thread really ran while operations were in flight).
  int64_t polls() const { return polls_.load(); }

 private:
  void run();

  struct Native;  // the private communicator it probes
  std::unique_ptr<Native> native_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int in_flight_ = 0;
  bool stop_ = false;
  std::atomic<int64_t> polls_{0};
  std::thread thread_;
};

// True when MPI_Init_thread granted MPI_THREAD_MULTIPLE.
bool mpi_thread_multiple();

}  // namespace ulysses
