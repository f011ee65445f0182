// The count of operations this process enqueued on the device: kernels, GEMMs, cuDNN graphs,
// copies and fills. The device timeline reports it per step (docs/profiling.md, "Device
// time"). Plain C++: the backend's .cpp files count too.
#pragma once

#include <atomic>
#include <cstdint>

namespace ulysses::cuda {

inline std::atomic<int64_t> enqueued_operations{0};

inline void count_enqueued(int operations = 1) {
  enqueued_operations.fetch_add(operations, std::memory_order_relaxed);
}

}  // namespace ulysses::cuda
