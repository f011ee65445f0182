// Overwriting a checkpoint dir (train.checkpoint.overwrite; docs/checkpoints.md#overwriting):
// the checkpoints a run replaces stay where they are until it has written and verified its
// first checkpoint. Publishing that one moves them into dir/.overwrite-pending, puts the new
// folder and `latest` in place, and deletes them. A crash in between is finished (the new
// checkpoint is in place and intact) or undone (it is not) when the next run starts.
#pragma once

#include <string>
#include <vector>

namespace ulysses {

// Rank 0, while publishing the first checkpoint of a run that replaces others: moves the
// folders `replaced` and dir/latest into dir/.overwrite-pending, then records there that
// new_name (not yet in dir) replaces them.
void move_replaced_aside(const std::string& dir, const std::vector<std::string>& replaced,
                         const std::string& new_name);
// Rank 0, once the new checkpoint and `latest` are in place: deletes what was moved aside,
// first renaming dir/.overwrite-pending to dir/.overwrite-deleting.
void delete_replaced(const std::string& dir);

// Rank 0, before anything reads dir: what an interrupted overwrite left in
// dir/.overwrite-pending is deleted when the new checkpoint it names is in place and intact,
// and moved back otherwise; dir/.overwrite-deleting is deleted. Returns what it did, for the log
// ("" when there was nothing to do); throws CheckpointError when something cannot be moved back
// because a file or folder of its name is in the way.
std::string recover_interrupted_overwrite(const std::string& dir);

}  // namespace ulysses
