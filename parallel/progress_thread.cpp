#include "parallel/progress_thread.h"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <stdexcept>

namespace ulysses {

struct ProgressThread::Native {
  MPI_Comm comm = MPI_COMM_NULL;
};

bool mpi_thread_multiple() {
  int provided = 0;
  MPI_Query_thread(&provided);
  return provided >= MPI_THREAD_MULTIPLE;
}

ProgressThread::ProgressThread() : native_(std::make_unique<Native>()) {
  if (!mpi_thread_multiple())
    throw std::runtime_error(
        "a progress thread needs MPI_THREAD_MULTIPLE, which this MPI library did not grant; set "
        "parallel.progress_thread: off");
  MPI_Comm_dup(MPI_COMM_SELF, &native_->comm);
  thread_ = std::thread([this] { run(); });
}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
  MPI_Comm_free(&native_->comm);
}

void ProgressThread::started() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_flight_;
  }
  wake_.notify_one();
}

void ProgressThread::finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
}

void ProgressThread::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait(lock, [this] { return stop_ || in_flight_ > 0; });
    while (!stop_ && in_flight_ > 0) {
      lock.unlock();
      // Any MPI call enters the progress engine; probing a private communicator does nothing
      // else. A short pause keeps the core mostly for compute.
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, native_->comm, &flag, MPI_STATUS_IGNORE);
      polls_.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    }
  }
}

}  // namespace ulysses
