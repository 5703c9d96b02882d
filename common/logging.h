#pragma once
// Process-wide logging setup: spdlog to stderr with a process tag; level from --log-level.
#include <string>

#include <spdlog/spdlog.h>

namespace tailserve {

// Returns false for an unknown level name.
bool InitLogging(const std::string& process, const std::string& level);

}  // namespace tailserve
