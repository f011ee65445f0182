// What every command that runs the model opens first (train, eval, sample): the config,
// validated and compared on every rank, the backend, the communicators and the dp×sp mesh.
// Verdicts every rank reaches together are thrown as JobError on every rank
// (docs/failures.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/watchdog.h"

namespace ulysses {

struct JobSession {
  Config config;
  std::shared_ptr<Watchdog> watchdog;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Comm> device_world;  // cuda: device buffers between ranks
  Mesh mesh;                           // set by connect_job
  bool progress_thread = false;
};

// Collective: installs the watchdog on world, loads the config (with --set overrides) and
// validates it for world, checks that every rank runs the same job (the resolved config
// and `command`, which names what the job does with it), and makes the backend unless
// with_backend is false (--dry-run plans without one).
JobSession open_job(const std::string& config_path, const std::vector<std::string>& overrides,
                    const std::string& command, Comm& world, bool with_backend = true);

// Collective: the progress thread, the device communicator (cuda), the mesh and each rank's
// threads.
void connect_job(JobSession& job, Comm& world);

// The tracked-memory limit of memory.limit_gib.
int64_t memory_limit_bytes(const Config& config);

}  // namespace ulysses
