// The host memory this process could still take, as the system reports it: what a run checks
// before it builds the model, the whole plan on the cpu backend and the host part of a cuda
// run's (offloaded layer inputs, weight I/O, staging; docs/memory.md, "Memory the machine
// has"). Beside backend.h, not in cpu/, since both backends use it.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses {

// MemAvailable of /proc/meminfo's text, in bytes; -1 when the line is missing.
int64_t meminfo_available_bytes(const std::string& meminfo);

// What a memory cgroup's limit leaves, in bytes: max less its working set, from the texts of
// its limit file ("max" or bytes: cgroup v2's memory.max, v1's memory.limit_in_bytes), its
// usage file and its memory.stat, whose inactive page cache (v2 "inactive_file", v1
// "total_inactive_file") the usage counts but the group gives back first. -1 when there is no
// limit (also v1's "unlimited", 2^63 rounded down to a page) or the files cannot be read.
int64_t cgroup_room_bytes(const std::string& limit, const std::string& usage,
                          const std::string& stat);

// What host_available_bytes reads, as a run's memory check names it.
inline constexpr const char* kHostMemorySource =
    "host memory: MemAvailable, or a memory cgroup's room";

// The smaller of MemAvailable and the room this process's memory cgroup leaves (v2 or v1);
// 0 when none of them can be read.
int64_t host_available_bytes();

}  // namespace ulysses
