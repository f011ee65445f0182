// The one-rank communicator (single-process runs and unit tests).
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {

// As make_local_comm(name), but the copies that one-rank collectives make (reduce-scatter,
// all-gather, all-to-all into another buffer) go through backend.copy, so the buffers may be
// device memory. make_local_comm(name) copies with memcpy (host buffers).
std::unique_ptr<Comm> make_local_comm(Backend& backend, const std::string& name = "world");

}  // namespace ulysses
