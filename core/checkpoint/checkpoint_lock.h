// One run at a time in a checkpoint folder (docs/checkpoints.md#one-run-per-folder). Two runs
// saving into one folder would replace each other's step folders, prune each other's
// checkpoints and leave `latest` naming whichever saved last; a second run started with
// --resume auto would even delete the first one's save in progress as a leftover. So rank 0
// holds an exclusive flock(2) on `<dir>/.lock` (kCheckpointLockFile) for the whole run. The kernel
// drops it when the process ends, however it ends (SIGKILL too): a lock is never left behind by a
// dead run.
#pragma once

#include <string>
#include <utility>

namespace ulysses {

class CheckpointDirLock {
 public:
  // holder: what this run is (describe_lock_holder), for the message another run gets.
  explicit CheckpointDirLock(std::string holder) : holder_(std::move(holder)) {}
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  // Locks the existing folder dir and writes the holder into the lock file. Returns "" when
  // this run may use the folder, or the error naming the run that holds it. A file system
  // without locks (some network mounts) is warned about and not locked; a lock file that
  // cannot be opened at all (a read-only folder) is left to the folder's write test.
  std::string acquire(const std::string& dir);
  // Whether acquire ran and found the folder free (held, or not lockable there).
  bool acquired() const { return acquired_; }

 private:
  std::string holder_;
  int fd_ = -1;
  bool acquired_ = false;
};

// "pid 1234 on node07 since 2026-12-07 03:38:00 UTC: <what>": who holds a folder's lock.
std::string describe_lock_holder(const std::string& what);

}  // namespace ulysses
