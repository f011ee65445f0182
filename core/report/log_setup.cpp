#include "core/report/log_setup.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace ulysses {

LogColor parse_log_color(const std::string& name) {
  if (name == "auto") return LogColor::automatic;
  if (name == "always") return LogColor::always;
  if (name == "never") return LogColor::never;
  throw std::invalid_argument("--color must be auto, always or never, not '" + name + "'");
}

bool log_uses_colors(LogColor color, LogStream stream) {
  if (color != LogColor::automatic) return color == LogColor::always;
  const char* no_color = std::getenv("NO_COLOR");
  if (no_color && *no_color) return false;
  for (const char* launcher_variable : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK"})
    if (std::getenv(launcher_variable)) return false;
  return isatty(stream == LogStream::out ? STDOUT_FILENO : STDERR_FILENO) == 1;
}

void setup_logging(LogColor color, int rank, int world_size, LogStream stream) {
  const bool colors = log_uses_colors(color, stream);
  const spdlog::color_mode mode = colors ? spdlog::color_mode::always : spdlog::color_mode::never;
  spdlog::sink_ptr sink;
  if (stream == LogStream::out)
    sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>(mode);
  else
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(mode);
  auto logger = std::make_shared<spdlog::logger>("ulysses", sink);
  logger->set_level(spdlog::default_logger()->level());
  const std::string rank_field =
      rank >= 0 && world_size > 1 ? "[rank " + std::to_string(rank) + "] " : "";
  logger->set_pattern("[%H:%M:%S] " + rank_field + (colors ? "%^%l%$" : "%l") + " %v");
  logger->flush_on(spdlog::level::err);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace ulysses
