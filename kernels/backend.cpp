#include "kernels/backend.h"

#include <stdexcept>

#include "kernels/cpu/cpu_backend.h"

#ifdef ULYSSES_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace ulysses {

bool cuda_backend_compiled() {
#ifdef ULYSSES_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_devices_visible() {
#ifdef ULYSSES_WITH_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device, int64_t memory_limit_bytes,
                                      const std::string& attention) {
  if (device == "cpu") {
    if (attention != "native")
      throw std::invalid_argument("kernels.attention: " + attention + " needs device: cuda");
    return std::make_unique<CpuBackend>(memory_limit_bytes);
  }
  if (device == "cuda") {
#ifdef ULYSSES_WITH_CUDA
    return make_cuda_backend(memory_limit_bytes, parse_attention_kind(attention));
#else
    throw DeviceUnavailableError(
        "device: cuda was asked for, but this build has no CUDA backend (nvcc was not found "
        "when it was configured); use device: cpu or rebuild on a machine with the CUDA "
        "toolkit");
#endif
  }
  throw std::runtime_error("unknown device '" + device + "' (allowed: cpu, cuda)");
}

}  // namespace ulysses
