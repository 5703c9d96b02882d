#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tailserve {

bool InitLogging(const std::string& process, const std::string& level) {
  const auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") return false;
  auto logger = spdlog::stderr_color_mt(process);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  return true;
}

}  // namespace tailserve
