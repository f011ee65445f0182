#include "kernels/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace ulysses {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// This process's cgroup paths from /proc/self/cgroup: v2's ("0::/path") and the v1 memory
// controller's ("N:memory:/path", the controller maybe listed with others).
struct CgroupPaths {
  std::string unified, memory;
};
CgroupPaths cgroup_paths() {
  CgroupPaths paths;
  std::istringstream lines(read_text("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    const std::string path = line.substr(second + 1);
    if (controllers == ",,") paths.unified = path;
    if (controllers.find(",memory,") != std::string::npos) paths.memory = path;
  }
  return paths;
}

}  // namespace

int64_t meminfo_available_bytes(const std::string& meminfo) {
  std::istringstream lines(meminfo);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string key, unit;
    long long kib = 0;
    if (fields >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB")
      return int64_t(kib) * 1024;
  }
  return -1;
}

int64_t cgroup_room_bytes(const std::string& limit, const std::string& usage,
                          const std::string& stat) {
  long long max_bytes = 0, used_bytes = 0;
  std::istringstream limit_text(limit), usage_text(usage);
  if (!(limit_text >> max_bytes) || !(usage_text >> used_bytes)) return -1;  // "max", unreadable
  // cgroup v1 writes "no limit" as the largest page multiple below 2^63.
  constexpr long long kUnlimited = 1LL << 62;
  if (max_bytes >= kUnlimited) return -1;
  // The usage counts the page cache; its inactive part goes first when the group needs room.
  // v1's usage is the whole subtree's, as its "total_" counts; v2 has only the plain one.
  long long inactive = 0, subtree_inactive = -1;
  std::istringstream lines(stat);
  for (std::string key; lines >> key;) {
    long long value = 0;
    if (!(lines >> value)) break;
    if (key == "inactive_file") inactive = value;
    if (key == "total_inactive_file") subtree_inactive = value;
  }
  const long long reclaimable = subtree_inactive >= 0 ? subtree_inactive : inactive;
  const int64_t working_set = std::max<int64_t>(0, int64_t(used_bytes) - int64_t(reclaimable));
  return std::max<int64_t>(0, int64_t(max_bytes) - working_set);
}

int64_t host_available_bytes() {
  int64_t available = meminfo_available_bytes(read_text("/proc/meminfo"));
  // Inside a container the cgroup mount is the process's own group, whatever path
  // /proc/self/cgroup names: both places are read, and the tightest limit counts.
  const CgroupPaths paths = cgroup_paths();
  const std::string v2 = "/sys/fs/cgroup", v1 = "/sys/fs/cgroup/memory";
  struct Group {
    std::string folder;
    const char *limit, *usage;
  };
  const Group groups[] = {{v2 + paths.unified, "/memory.max", "/memory.current"},
                          {v2, "/memory.max", "/memory.current"},
                          {v1 + paths.memory, "/memory.limit_in_bytes", "/memory.usage_in_bytes"},
                          {v1, "/memory.limit_in_bytes", "/memory.usage_in_bytes"}};
  for (const Group& group : groups) {
    const int64_t room = cgroup_room_bytes(read_text(group.folder + group.limit),
                                           read_text(group.folder + group.usage),
                                           read_text(group.folder + "/memory.stat"));
    if (room >= 0) available = available < 0 ? room : std::min(available, room);
  }
  return std::max<int64_t>(0, available);
}

}  // namespace ulysses
